"""`evalgate cost` without an engine: candidate parsing (strict, exit 2 naming the field), the figures and
the ratio math, the JSON schema, the plot, and the cost_results table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import write_suite

from evalgate import cost
from evalgate.configuration.suite import Schedule
from evalgate.errors import ConfigError, ExitCode

# --- candidates ----------------------------------------------------------------------------------------------


def test_cli_candidate_parses_engine_args_env_and_batch_invariance():
    c = cost.parse_cli_candidate("fast:max_num_seqs=32,gpu_memory_utilization=0.5,batch_invariant=true,"
                                 "env.OMP_NUM_THREADS=2,kv_cache_dtype='auto',enable_prefix_caching=false")
    assert c.name == "fast" and c.origin == "--candidate" and c.batch_invariant is True
    assert c.engine_args == {"max_num_seqs": 32, "gpu_memory_utilization": 0.5, "kv_cache_dtype": "auto",
                             "enable_prefix_caching": False}
    assert c.env == {"OMP_NUM_THREADS": "2"}
    plain = cost.parse_cli_candidate("same")
    assert plain.engine_args == {} and plain.env == {} and plain.batch_invariant is False


@pytest.mark.parametrize("text, field", [
    ("bad name:max_num_seqs=1", "candidate name"),
    ("x:max_num_seqs", "`max_num_seqs` is not KEY=VALUE"),
    ("x:batch_invariant=yes", "`batch_invariant` must be true or false"),
    ("x:model=/other", "`engine.model` cannot be set per candidate"),
    ("x:env.VLLM_BATCH_INVARIANT=1", "VLLM_BATCH_INVARIANT"),
    ("x:env.1BAD=1", "`env.1BAD` is not an environment variable name"),
    ("x:max_num_seqs=1,max_num_seqs=2", "given twice"),
])
def test_cli_candidate_errors_name_the_field(text, field):
    with pytest.raises(ConfigError) as err:
        cost.parse_cli_candidate(text)
    assert field in err.value.message and err.value.fix
    assert err.value.exit_code == ExitCode.USAGE


def test_cost_table_parses_and_is_strict():
    defaults, found = cost.parse_cost_table({"defaults": False, "candidates": [
        {"name": "eager", "engine": {"max_num_seqs": 4}, "env": {"OMP_NUM_THREADS": "1"}},
        {"name": "bi", "batch_invariant": True},
    ]}, "s.toml")
    assert defaults is False
    assert [(c.name, c.engine_args, c.env, c.batch_invariant, c.origin) for c in found] == [
        ("eager", {"max_num_seqs": 4}, {"OMP_NUM_THREADS": "1"}, False, "suite file"),
        ("bi", {}, {}, True, "suite file")]


@pytest.mark.parametrize("table, field", [
    ({"default": True}, "unknown key `cost.default`"),
    ({"defaults": "yes"}, "`cost.defaults` must be true or false"),
    ({"candidates": {"name": "x"}}, "`cost.candidates` must be an array"),
    ({"candidates": [{"engine": {}}]}, "`cost.candidates[0].name` is missing"),
    ({"candidates": [{"name": "x", "engin": {}}]}, "unknown key `cost.candidates[0].engin`"),
    ({"candidates": [{"name": "x", "engine": {"max_num_seqs": float("nan")}}]},
     "`cost.candidates[0].engine.max_num_seqs` holds a non-finite number"),
    ({"candidates": [{"name": "x", "env": {"OMP_NUM_THREADS": 1}}]}, "`cost.candidates[0].env.OMP_NUM_THREADS` must be a string"),
    ({"candidates": [{"name": "x", "batch_invariant": 1}]}, "`cost.candidates[0].batch_invariant` must be true or false"),
    ({"candidates": [{"name": "x", "engine": {"tokenizer": "t"}}]}, "`cost.candidates[0].engine.tokenizer` cannot"),
])
def test_cost_table_errors_name_the_field(table, field):
    with pytest.raises(ConfigError) as err:
        cost.parse_cost_table(table, "/w/s.toml")
    assert err.value.message.startswith("/w/s.toml: ") and field in err.value.message and err.value.fix


def test_candidates_file_and_unique_names(tmp_path):
    f = tmp_path / "cands.toml"
    f.write_text('[[cost.candidates]]\nname = "seqs-4"\nengine = { max_num_seqs = 4 }\n')
    found = cost.resolve_candidates(None, ["mine:max_num_seqs=2"], f)
    assert [c.name for c in found] == ["batch-invariant", "batched", "max-num-seqs-1", "no-prefix-cache", "seqs-4", "mine"]
    assert found[4].origin == "candidates file"
    with pytest.raises(ConfigError, match="used twice"):
        cost.resolve_candidates(None, ["batched:max_num_seqs=2"])
    with pytest.raises(ConfigError, match="no candidates"):
        cost.resolve_candidates(None, [], defaults=False)
    f.write_text("[costs]\n")
    with pytest.raises(ConfigError, match="unknown key `costs`"):
        cost.resolve_candidates(None, [], f)


def test_a_one_pass_schedule_is_refused():
    with pytest.raises(ConfigError, match="one pass"):
        cost.check_schedule(Schedule(concurrency=(4,), shuffles=0, repeats=1))  # its hot pass is not a level
    cost.check_schedule(Schedule(concurrency=(1, 4), shuffles=0, repeats=1))


def test_secret_env_values_are_never_reported():
    c = cost.parse_cli_candidate("x:env.HF_TOKEN=hunter2,env.OMP_NUM_THREADS=1")
    assert c.env["HF_TOKEN"] == "hunter2"  # still set in the engine process
    assert c.config()["env"] == {"HF_TOKEN": "<redacted>", "OMP_NUM_THREADS": "1"}


# --- figures and the ratio -----------------------------------------------------------------------------------


def test_percentiles_interpolate_between_ranks():
    assert cost.percentile([], 50) is None
    assert cost.percentile([3.0], 99) == 3.0
    assert cost.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert cost.percentile(list(map(float, range(101))), 90) == 90.0
    assert cost.percentile([1.0, 2.0], 99) == pytest.approx(1.99)


def test_level_figures_leave_out_the_warmup_wave_and_take_medians():
    passes = [
        {"index": 0, "concurrency": 1, "wave_seconds": [5.0, 1.0, 1.0]},  # wave 0: the warm-up
        {"index": 1, "concurrency": 2, "wave_seconds": [1.0, 3.0]},
        {"index": 2, "concurrency": 2, "wave_seconds": [2.0, 2.0]},
        {"index": 3, "concurrency": 2, "wave_seconds": [1.0, 1.0]},
    ]
    tokens = {(0, 0): 10, (0, 1): 10, (0, 2): 30, (1, 0): 20, (1, 1): 20, (2, 0): 20, (2, 1): 20, (3, 0): 40, (3, 1): 40}
    requests = {(0, 0): 1, (0, 1): 1, (0, 2): 1, (1, 0): 2, (1, 1): 2, (2, 0): 2, (2, 1): 2, (3, 0): 2, (3, 1): 2}
    levels = cost.level_figures(passes, tokens, requests)
    assert [lv["concurrency"] for lv in levels] == [1, 2]
    one, two = levels
    assert one["tokens_per_second"] == 20.0 and one["requests"] == 2 and not one["includes_warmup"]
    assert one["latency_seconds"] == {"p50": 1.0, "p90": 1.0, "p99": 1.0}
    assert two["pass_tokens_per_second"] == [10.0, 10.0, 40.0] and two["tokens_per_second"] == 10.0
    assert two["requests"] == 12 and two["latency_seconds"]["p50"] == 1.5


def test_a_level_with_only_the_warmup_wave_keeps_it_and_says_so():
    levels = cost.level_figures([{"index": 0, "concurrency": 8, "wave_seconds": [2.0]},
                                 {"index": 1, "concurrency": 1, "wave_seconds": [1.0]}],
                                {(0, 0): 16, (1, 0): 4}, {(0, 0): 8, (1, 0): 1})
    assert [(lv["concurrency"], lv["tokens_per_second"], lv["includes_warmup"]) for lv in levels] == [
        (1, 4.0, False), (8, 8.0, True)]


def _result(name, position, *, tps, invariant, status="measured", differing=None):
    c = cost.Candidate(name)
    levels = [{"concurrency": 1, "tokens_per_second": tps / 4, "latency_seconds": {"p50": 1, "p90": 1, "p99": 1}},
              {"concurrency": 8, "tokens_per_second": tps, "latency_seconds": {"p50": 2, "p90": 3, "p99": 4}}] \
        if tps is not None else []
    return cost.CandidateResult(c, position, status, invariant=invariant,
                                differing_requests=differing if differing is not None else (0 if invariant else 3),
                                requests=10, levels=levels, reason="unavailable on this platform (cpu)"
                                if status == "unavailable" else None)


def _report(results):
    return cost.CostReport(suite_name="s", session="abc", database="sqlite:///x", platform="cpu",
                           schedule=Schedule(concurrency=(1, 8), shuffles=0, repeats=1), results=results)


def test_cost_ratio_is_the_fastest_invariant_over_the_fastest_at_the_top_level():
    report = _report([_result("bi", 0, tps=None, invariant=False, status="unavailable"),
                      _result("batched", 1, tps=120.0, invariant=False),
                      _result("seq1", 2, tps=12.0, invariant=True),
                      _result("seq2", 3, tps=30.0, invariant=True)])
    assert report.fastest.candidate.name == "batched"
    assert report.fastest_invariant.candidate.name == "seq2"
    assert report.cost_ratio == pytest.approx(30.0 / 120.0)
    assert cost.cost_ratio(5.0, 5.0) == 1.0 and cost.cost_ratio(None, 5.0) is None and cost.cost_ratio(1.0, 0) is None
    no_inv = _report([_result("batched", 0, tps=120.0, invariant=False)])
    assert no_inv.fastest_invariant is None and no_inv.cost_ratio is None and no_inv.exit_code == ExitCode.PASS


def test_exit_code_when_every_tried_candidate_failed():
    failed = cost.CandidateResult(cost.Candidate("a"), 0, "failed", reason="boom", error_exit_code=3)
    bad_config = cost.CandidateResult(cost.Candidate("b"), 1, "failed", reason="bad", error_exit_code=2)
    unavailable = _result("bi", 2, tps=None, invariant=False, status="unavailable")
    assert _report([failed, bad_config, unavailable]).exit_code == ExitCode.INFRA
    assert _report([bad_config, unavailable]).exit_code == ExitCode.USAGE
    assert _report([unavailable]).exit_code == ExitCode.PASS  # nothing was tried, nothing broke
    assert _report([failed, _result("ok", 1, tps=1.0, invariant=True)]).exit_code == ExitCode.PASS
    assert isinstance(cost.failed_command_error(_report([failed])), cost.EngineError)


def test_json_report_schema(tmp_path):
    report = _report([_result("bi", 0, tps=None, invariant=False, status="unavailable"),
                      _result("batched", 1, tps=100.0, invariant=False),
                      _result("seq1", 2, tps=10.0, invariant=True)])
    path = tmp_path / "out" / "cost.json"
    cost.write_json(report, path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == "evalgate.cost/1"
    assert set(doc) == {"schema", "suite", "session", "database", "platform", "schedule", "highest_concurrency",
                        "candidates", "fastest", "fastest_invariant", "cost_ratio", "slowdown", "exit_code", "plot"}
    assert doc["highest_concurrency"] == 8 and doc["schedule"]["concurrency"] == [1, 8]
    assert doc["fastest"] == {"name": "batched", "tokens_per_second": 100.0}
    assert doc["fastest_invariant"] == {"name": "seq1", "tokens_per_second": 10.0}
    assert doc["cost_ratio"] == pytest.approx(0.1) and doc["slowdown"] == pytest.approx(10.0)
    c = doc["candidates"][0]
    assert set(c) == {"name", "origin", "status", "reason", "run_id", "config", "batch_invariance", "invariant",
                      "differing_requests", "requests", "varying", "tokens_per_second", "levels", "peak_rss_bytes",
                      "engine_load_seconds", "wall_seconds"}
    assert c["status"] == "unavailable" and c["invariant"] is False and c["tokens_per_second"] is None
    assert doc["candidates"][2]["levels"][1]["latency_seconds"] == {"p50": 2, "p90": 3, "p99": 4}
    assert not list(path.parent.glob(".*.tmp"))  # atomic: no temporary file left


def test_plot_is_a_png_readable_back(tmp_path):
    pytest.importorskip("matplotlib")
    from PIL import Image

    report = _report([_result("batched", 0, tps=100.0, invariant=False), _result("seq1", 1, tps=10.0, invariant=True)])
    path = tmp_path / "p" / "cost.png"
    cost.write_plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(path) as img:
        img.verify()
    import matplotlib.image

    assert matplotlib.image.imread(str(path)).shape[2] in (3, 4)


def test_missing_matplotlib_is_a_clear_config_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    with pytest.raises(cost.MissingDependency) as err:
        cost.require_matplotlib()
    assert "matplotlib" in err.value.message and "pip install" in err.value.fix
    assert err.value.exit_code == ExitCode.USAGE


# --- the store -----------------------------------------------------------------------------------------------


def test_cost_results_round_trip(tmp_path):
    from evalgate.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 'c.sqlite'}")
    rid = store.add_cost_result(session="s1", suite_name="s", candidate="bi", position=0, status="unavailable",
                                reason="unavailable on this platform (cpu)", run_id=None, config={"env": {}},
                                invariant=False, highest_concurrency=8)
    store.add_cost_result(session="s1", suite_name="s", candidate="seq1", position=1, status="measured",
                          config={}, invariant=True, differing_requests=0, requests=10, highest_concurrency=8,
                          tokens_per_second=12.5, peak_rss_bytes=3 << 31, figures={"levels": []})
    rows = store.cost_results("s1")
    assert [r.id for r in rows][0] == rid
    assert [(r.candidate, r.status, r.invariant, r.tokens_per_second, r.peak_rss_bytes) for r in rows] == [
        ("bi", "unavailable", False, None, None), ("seq1", "measured", True, 12.5, 3 << 31)]
    assert store.cost_results("other") == []


# --- the CLI: configuration errors are exit 2 before any engine starts ----------------------------------------


def _cli(tmp_path, *args):
    env = {"OMP_NUM_THREADS": "1", "COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "evalgate", "cost", *map(str, args)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_config_errors_exit_2_and_write_nothing(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    suite = write_suite(tmp_path / "ws", model, ["hello"], concurrency=(1, 4))
    proc = _cli(tmp_path, suite, "--candidate", "x:batch_invariant=maybe")
    assert proc.returncode == 2, proc.stderr
    assert "--candidate 'x:batch_invariant=maybe'" in proc.stderr and "batch_invariant" in proc.stderr
    assert "fix:" in proc.stderr
    proc = _cli(tmp_path, suite, "--concurrency", "4", "--shuffles", "0")
    assert proc.returncode == 2 and "one pass" in proc.stderr
    cands = tmp_path / "c.toml"
    cands.write_text('[[cost.candidates]]\nname = "a"\nengines = {}\n')
    proc = _cli(tmp_path, suite, "--candidates", cands)
    assert proc.returncode == 2 and "unknown key `cost.candidates[0].engines`" in proc.stderr
    assert not (tmp_path / "ws" / "evalgate.sqlite").exists()


def test_the_suite_files_own_cost_table_is_read(tmp_path):
    from evalgate.configuration.suite import load_suite

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    suite_path = write_suite(tmp_path / "ws", model, ["hello"])
    suite_path.write_text(suite_path.read_text() + '\n[cost]\ndefaults = false\n[[cost.candidates]]\nname = "seqs4"\n'
                          'engine = { max_num_seqs = 4 }\n')
    defaults, found = cost.suite_cost_table(load_suite(suite_path))
    assert defaults is False and [(c.name, c.engine_args) for c in found] == [("seqs4", {"max_num_seqs": 4})]
