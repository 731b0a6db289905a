"""The library's front door (`import evalgate`) and a third-party probe added by one class: both on the
fake engine in this process."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest
from helpers import database_url, db_query, read_json, write_suite

from evalgate import registry
from evalgate.configuration.schedule import Pass
from evalgate.judgement.factors import factor_table
from evalgate.probes import Probe, get_probe


class Solo(Probe):
    """A third party's probe, as its own package would ship it: every request alone again, against the most
    crowded pass, under a factor of its own."""

    name = "solo"
    factor = "solo"
    words = "alone again"
    remedy = "engine.max_num_seqs = 1"
    batch_factor = True

    def plan(self, context, add):
        crowded = max(context.passes, key=lambda p: p.concurrency)
        add(1, reference=crowded.index)
        return None

    def label(self, reference: Pass, other: Pass) -> str:
        return f"alone again after batch size {reference.concurrency} (solo)"


class Paired(Probe):
    """A third party's probe that changes two things: it declares a control that changes the first (sharing
    a batch of 4, under `batch_size`) and compares its treatment (the same batches again, rerun) with that
    control alone, under its own factor."""

    name = "paired"
    factor = "rerun"
    words = "rerun among the same neighbours"
    remedy = "nothing known"

    def plan(self, context, add):
        control = add(4, factor="batch_size", variant="control")
        add(4, reference=control)
        return None

    def label(self, reference: Pass, other: Pass) -> str:
        return "alone→batch of 4 (paired's control)" if other.variant == "control" else "rerun of the batch of 4 (paired)"


@pytest.fixture
def solo_plugin(monkeypatch):
    points = [metadata.EntryPoint(name=name, value=f"{__name__}:{cls}", group="evalgate.probes")
              for name, cls in (("solo", "Solo"), ("paired", "Paired"))]
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: points if group == "evalgate.probes" else [])
    get_probe.cache_clear()
    factor_table.cache_clear()
    yield
    get_probe.cache_clear()
    factor_table.cache_clear()


def test_a_probe_from_the_entry_point_group_runs_and_is_judged_under_its_factor(solo_plugin, inline_cli, tmp_path,
                                                                                 fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, [f"prompt {i}" for i in range(4)], max_tokens=4, kind="fake",
                        concurrency=(1, 4), shuffles=0, hot_pass=False, extra_schedule='probes = ["solo"]',
                        extra_engine='fake_vary_with_batch = ["p002"]')
    proc = inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    rows = {f["comparison"]: (f["factor"], f["differing"], f["keys"]) for f in report["factors"]}
    assert rows == {"batch size 1→4": ("batch_size", 1, ["p002"]),
                    "alone again after batch size 4 (solo)": ("solo", 1, ["p002"])}
    assert report["not_run"] == []
    assert "alone again" in proc.stdout and "engine.max_num_seqs = 1" in proc.stdout  # its words and remedy


def test_a_probe_declares_a_control_and_each_comparison_names_one_factor(solo_plugin, inline_cli, tmp_path,
                                                                          fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, [f"prompt {i}" for i in range(4)], max_tokens=4, kind="fake",
                        concurrency=(1,), shuffles=0, hot_pass=False, extra_schedule='probes = ["paired"]',
                        extra_engine='fake_vary_with_batch = ["p001"]')
    inline_cli("baseline", "create", suite, "--json-report", tmp_path / "r.json", check=1)
    report = read_json(tmp_path / "r.json")
    rows = {f["comparison"]: (f["reference_pass"], f["pass"], f["factor"], f["keys"]) for f in report["factors"]}
    # the batch effect shows against the control's reference (alone), never in the treatment
    assert rows == {"alone→batch of 4 (paired's control)": (0, 1, "batch_size", ["p001"]),
                    "rerun of the batch of 4 (paired)": (1, 2, "rerun", [])}
    [(schedule,)] = db_query(database_url(suite), "select schedule from runs")
    passes = (json.loads(schedule) if isinstance(schedule, str) else schedule)["passes"]
    assert [(p["index"], p["variant"], p["reference"]) for p in passes] == [(0, None, None), (1, "control", 0), (2, None, 1)]


def test_an_unknown_probe_lists_the_registered_ones(solo_plugin, inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path / "ws", fake_model, ["a"], kind="fake", extra_schedule='probes = ["sol"]')
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "unknown probe 'sol'" in proc.stderr and "solo" in proc.stderr


def test_the_front_door_is_light_and_runs_a_suite(tmp_path, fake_model, monkeypatch):
    light = subprocess.run([sys.executable, "-c", "import sys, evalgate; evalgate.__all__; "
                            "print(sorted(m for m in ('sqlalchemy', 'alembic', 'vllm', 'torch', 'lm_eval', 'typer') "
                            "if m in sys.modules))"], capture_output=True, text=True, check=True)
    assert light.stdout.strip() == "[]"

    import evalgate

    assert all(getattr(evalgate, name) for name in evalgate.__all__)
    monkeypatch.setenv("EVALGATE_INLINE_ENGINE", "1")
    suite = evalgate.load_suite(write_suite(tmp_path / "ws", fake_model, ["a", "b"], kind="fake", max_tokens=3,
                                            extra_engine='fake_vary_with_batch = ["p001"]'))
    created = evalgate.create_baseline(suite, allow_variance=True)
    assert (created.kind, created.status, created.promoted) == ("baseline", "regression", True)
    checked = evalgate.check(suite)
    assert checked.baseline_run_id == created.run_id and checked.counts["batch_variance"] == 1
    diff = evalgate.compare_runs(evalgate.open_store(suite.database), created.run_id, checked.run_id)
    assert diff.kind == "diff" and {v.key: v.verdict for v in diff.verdicts} == {"p001": "batch_variance"}
    assert diff.counts["stable"] == 1


@pytest.mark.parametrize("args, flag", [
    (["check", "--concurrency", "0"], "--concurrency"),
    (["check", "--merge"], "--merge"),
    (["build-model", "out", "--preset", "nope"], "--preset"),
])
def test_a_flag_refused_in_a_command_body_is_a_usage_error(inline_cli, tmp_path, fake_model, args, flag):
    """Exit 2 and typer's usage box naming the flag, as a flag refused by its parser is; never exit 3 (engine or
    infrastructure) with "BadParameter:", as when typer's vendored click was not caught as click's."""
    write_suite(tmp_path, fake_model, ["a"], kind="fake")
    proc = inline_cli(*args, check=2)
    assert f"Invalid value for {flag}" in proc.stderr and "BadParameter" not in proc.stderr


def test_the_cli_needs_no_click_of_its_own():
    """typer >= 0.29 vendors click, so click is no dependency of evalgate's and may be absent."""
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.modules['click'] = None; import evalgate.cli; "
                           "import evalgate.cli.gate; print('ok')"], capture_output=True, text=True)
    assert proc.stdout.strip() == "ok", proc.stderr


def test_the_version_and_the_short_help_flag(inline_cli):
    """`evalgate --version` for a bug report (with the commit a checkout or a git install runs), and `-h` beside
    `--help` on every command, as most command lines have them."""
    from evalgate import __version__
    from evalgate.scaffold import installed_commit

    version = inline_cli("--version", check=0).stdout.strip()
    commit = installed_commit()
    assert version == f"evalgate {__version__}" + (f" (commit {commit[:12]})" if commit else "")
    assert " baseline create [OPTIONS] [suite_file]" in inline_cli("baseline", "create", "-h", check=0).stdout
