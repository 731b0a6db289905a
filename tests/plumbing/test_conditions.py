"""Pass conditions, factors and probes through the real CLI on the fake test engine (plumbing only: what
a real engine's cache and kernels do is tested on vLLM in test_e2e_gate.py and test_e2e_probes.py)."""

from __future__ import annotations

import pytest
from helpers import database_url, db_output_ids, db_query, read_json, write_suite

PROMPTS = [f"Question {i}: what follows the number {i}?" for i in range(6)]


def fake_suite(tmp_path, fake_model, extra_engine: str = "", **kwargs):
    return write_suite(tmp_path / "ws", fake_model, PROMPTS, max_tokens=4, kind="fake", extra_engine=extra_engine,
                       **{"concurrency": (1, 4), "shuffles": 1, **kwargs})


def test_a_prefix_cache_effect_is_attributed_to_the_cache_not_the_batch(inline_cli, tmp_path, fake_model):
    suite = fake_suite(tmp_path, fake_model, 'fake_vary_with_cache = ["p001"]')
    proc = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    [varying] = [r for r in report["requests"] if r["verdict"] == "batch_variance"]
    assert (varying["key"], varying["factor"]) == ("p001", "prefix_cache")
    assert (varying["passes"]["reference_pass"], varying["passes"]["other_pass"]) == (0, 1)
    assert {f["comparison"]: f["differing"] for f in report["factors"]} == {
        "prefix cache cold→hot": 1, "batch size 1→4": 0, "order (seed 0) at batch size 4": 0}
    assert report["cache_hits"] == [{"pass": 1, "hit": 6, "missed": 0, "unknown": 0}]
    # cold passes are proven cold, the hot pass hot (the engine's own counts, stored per output)
    db = database_url(suite)
    # (pass -1: the baseline's rescoring of its own tokens, cold too: execution/rescore.py)
    assert db_query(db, "select pass_index, min(cached_tokens > 0), max(cached_tokens > 0) from outputs "
                        "group by pass_index order by pass_index") == [(-1, 0, 0), (0, 0, 0), (1, 1, 1), (2, 0, 0),
                                                                       (3, 0, 0)]
    out = " ".join(proc.stdout.split())
    assert "invariant under: batch size 1→4, order (seed 0) at batch size 4" in out
    assert "varies under: prefix cache cold→hot (1 request)" in out
    assert "enable_prefix_caching = false" in out and "evalgate cost" in out
    assert "evalgate bisect batch" not in out  # the hint follows the factor
    refused = inline_cli("bisect", "batch", "1", "p001", "--suite", suite, check=2)
    assert "varies under prefix cache" in " ".join(refused.stderr.split())
    html = inline_cli("report", "1", "--suite", suite, "--html", tmp_path / "r.html", check=0)
    page = (tmp_path / "r.html").read_text()
    assert html.returncode == 0 and "<h2>Factors</h2>" in page and "varies under: prefix cache" in page
    # one row per comparison (the varying one marked, with its share as a bar), the run badged by its verdict
    rows = page.split('<table class="factors">', 1)[1].split("</table>", 1)[0].split("<tr")[2:]
    assert len(rows) == 3 and "class=warn><td>prefix_cache</td><td>prefix cache cold→hot</td>" in rows[0]
    assert "<td class=num>1/6</td><td class=num>6</td>" in rows[0] and "width:17px" in rows[0]
    assert "<td class=num>0/6</td>" in rows[1] and "width:0px" in rows[1]
    assert '<span class="badge s-batch_variance">batch_variance</span>' in page and 'badge s-regression' not in page
    assert "gate: fail on bits" in page


def test_a_batch_effect_is_attributed_to_batch_size_and_sent_to_the_batch_bisector(inline_cli, tmp_path, fake_model):
    suite = fake_suite(tmp_path, fake_model, 'fake_vary_with_batch = ["p002"]')
    proc = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    [varying] = [r for r in report["requests"] if r["verdict"] == "batch_variance"]
    assert (varying["key"], varying["factor"]) == ("p002", "batch_size")
    assert {f["factor"]: f["differing"] for f in report["factors"]} == {"prefix_cache": 0, "batch_size": 1, "order": 0}
    assert "evalgate bisect batch 1 p002" in proc.stdout


def test_a_check_is_judged_per_condition(inline_cli, tmp_path, fake_model):
    """A hot-only effect in both runs: each run varies alone, yet against the baseline every condition
    agrees with its own kind (hot with hot, cold with cold)."""
    suite = fake_suite(tmp_path, fake_model, 'fake_vary_with_cache = ["p001"]')
    inline_cli("baseline", "create", suite, "--allow-variance", check=1)
    inline_cli("check", suite, "--json-report", tmp_path / "c.json", check=1)
    report = read_json(tmp_path / "c.json")
    assert [(p["baseline_pass"], p["current_pass"]) for p in report["baseline_pairs"]] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert report["counts"]["silent_regression"] == 0 and report["counts"]["batch_variance"] == 1


def test_every_probe_runs_or_says_why_not(inline_cli, tmp_path, fake_model):
    suite = fake_suite(tmp_path, fake_model, concurrency=(1,), shuffles=0)
    with suite.open("a") as f:
        f.write('probes = "vllm"\n\n[probes.needle]\nbatch = 3\nfiller_tokens = 20\n')
    inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=0)
    report = read_json(tmp_path / "r.json")
    comparisons = [f["comparison"] for f in report["factors"]]
    assert comparisons == ["prefix cache cold→hot", "batch size 1→3 (batch edge)", "batch size 3→4 (batch edge)",
                           "batch size 4→5 (batch edge)", "neighbours: alone→among 3 long fillers (needle)",
                           "prefix cache cold→half the prompt cached (prefix_cache probe)",
                           "prefill vs decode: the output re-scored by one prefill"]
    assert all(f["differing"] == 0 for f in report["factors"])  # the fake is invariant under all of them
    assert [n["pass"] for n in report["not_run"]] == ["probe adapter_mix", "probe chunked_prefill", "probe preemption"]
    assert "the suite has no [adapters]" in report["not_run"][0]["reason"]
    assert all("only the in-process `vllm` kind starts one" in n["reason"] for n in report["not_run"][1:])
    db = database_url(suite)
    # companions (fillers, warmers) are never stored: every pass holds the suite's 6 requests, once each (and
    # so does the baseline's rescoring of its own tokens, pass -1)
    assert db_query(db, "select count(distinct pass_index), min(n), max(n), min(pass_index) from (select pass_index, "
                        "count(*) n, count(distinct request_key) d from outputs group by pass_index)") == [(9, 6, 6, -1)]
    # each needle ran in its own wave among 3 fillers, at a seeded position
    needle = db_query(db, "select wave, position from outputs where pass_index = 5 order by wave")
    assert [w for w, _ in needle] == list(range(6)) and {p for _, p in needle} <= {0, 1, 2, 3}
    # the prefix probe's requests were served partly from the cache its warmers filled
    assert db_query(db, "select min(cached_tokens) > 0 from outputs where pass_index = 6") == [(1,)]
    # prefill_decode re-scored pass 0's own output ids
    rescored = {key: ids for key, _, ids in db_output_ids(db, "pass_index = 7")}
    decoded = {key: ids for key, _, ids in db_output_ids(db, "pass_index = 0")}
    assert rescored == decoded and all(decoded.values())


@pytest.mark.parametrize("value, message", [
    ('["needle", "nope"]', "unknown probe 'nope'"),
    ("3", "must be a list of probe names or a preset"),
])
def test_bad_probes_are_exit_2_naming_the_field(inline_cli, tmp_path, fake_model, value, message):
    suite = fake_suite(tmp_path, fake_model)
    with suite.open("a") as f:
        f.write(f"probes = {value}\n")
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "schedule.probes" in proc.stderr and message in proc.stderr and "fix:" in proc.stderr
    assert not (suite.parent / "evalgate.sqlite").exists()


def test_a_batch_effect_left_with_cpu_kernels_in_force_is_explained_as_chunked_prefill(tmp_path, fake_model, cli_env,
                                                                                         monkeypatch):
    """evalgate's CPU kernels keep a request's bits whoever shares its batch; what a survey can still find at a
    batch factor is vLLM chunking a long prompt because the crowd filled the step. The survey says so, and names
    the setting that keeps the concurrency, only there: without kernels in force it gives the plain reason."""
    import dataclasses

    from evalgate.cli.common import console
    from evalgate.cli.survey import show_survey
    from evalgate.configuration.suite import load_suite
    from evalgate.judgement.report import BatchInvariance
    from evalgate.survey import survey

    for key, value in cli_env.items():
        monkeypatch.setenv(key, value)
    suite = load_suite(fake_suite(tmp_path, fake_model, 'fake_vary_with_batch = ["p002"]'))
    report = survey(suite)

    def shown(invariance: BatchInvariance) -> str:
        with console.capture() as captured:
            show_survey(dataclasses.replace(report, batch_invariance=invariance), suite)
        return captured.get()

    in_force = shown(BatchInvariance(True, True, "", "evalgate-cpu-kernels/3"))
    assert "why, with evalgate's CPU kernels in force: a batch factor that still differs is most often vLLM chunking" in in_force
    assert "enable_chunked_prefill = false" in in_force and "why: without" not in in_force
    plain = shown(BatchInvariance(False, False, "not requested"))
    assert "why: without batch-invariant kernels" in plain and "chunking a long prompt" not in plain
