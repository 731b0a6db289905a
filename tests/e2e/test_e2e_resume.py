"""Resuming a run whose process died (execution/resume.py, docs/usage.md "Resuming a run").

A run SIGKILLed in each phase of its life (mid-pass, mid-rescoring, mid-judging), then continued with
`--resume`, must store the same outputs and get the same verdicts as the same run never interrupted, in the
same run row. On the fake engine, whose outputs are a pure function of each request's arrangement, with a
planted batch effect and a planted cache effect: a resumed wave run in another arrangement, or a hot pass run
cold because its cache died with the engine, would change outputs. The kill lands where the test says
(tests/killed_run.py: the engine runs in the CLI's own process, which SIGKILLs itself there). A resume on
real vLLM: test_a_vllm_run_killed_mid_pass_resumes_stable_with_its_hot_pass_warm.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import read_json, write_suite

pytestmark = pytest.mark.e2e

KILLER = Path(__file__).resolve().parents[1] / "killed_run.py"
PROMPTS = [f"Resume prompt {i}: the harbour, the lighthouse and the number {i}" for i in range(20)]
OUTPUT_COLUMNS = ("request_key, pass_index, concurrency, wave, position, finish_reason, digest, cached_tokens, "
                  "payload_hash")


def rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


def workspaces(tmp_path: Path, model: Path, **suite) -> tuple[Path, Path]:
    """Two identical suites with their own stores: one run is never interrupted, the other killed and resumed."""
    settings = {"concurrency": (1, 4), "shuffles": 1, "max_tokens": 8, "kind": "fake",
                "extra_engine": 'fake_vary_with_batch = ["p003"]\nfake_vary_with_cache = ["p005"]', **suite}
    return (write_suite(tmp_path / "whole", model, PROMPTS, **settings),
            write_suite(tmp_path / "resumed", model, PROMPTS, **settings))


def killed(cli, where: str, *args) -> None:
    proc = subprocess.run([sys.executable, str(KILLER), where, *map(str, args)], cwd=cli.cwd,
                          env={**cli.env, "EVALGATE_INLINE_ENGINE": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr


def stored(suite: Path, run_id: int) -> dict:
    """What a run stored and was judged: its outputs, verdicts, status and pass figures."""
    db = suite.parent / "evalgate.sqlite"
    status, verdict, schedule = rows(db, f"select status, verdict, schedule from runs where id = {run_id}")[0]
    return {"outputs": sorted(rows(db, f"select {OUTPUT_COLUMNS} from outputs where run_id = {run_id}")),
            "verdicts": sorted(rows(db, f"select request_key, verdict from verdicts where run_id = {run_id}")),
            "status": status, "verdict": verdict, "passes": json.loads(schedule)["timings"]["passes"],
            "runs": rows(db, "select count(*) from runs")[0][0]}


def assert_same_run(whole: dict, resumed: dict) -> None:
    assert resumed["runs"] == whole["runs"]  # the killed run itself went on: no second run row
    assert resumed["status"] == whole["status"] == "complete" and resumed["verdict"] == whole["verdict"]
    assert resumed["verdicts"] == whole["verdicts"] and whole["verdicts"]  # the planted effects were judged
    assert resumed["outputs"] == whole["outputs"]


@pytest.mark.parametrize("where", ["pass:2", "pass:9", "rescoring", "judging"])
def test_a_baseline_killed_in_each_phase_resumes_to_the_uninterrupted_run(cli, tmp_path, fake_model, where):
    whole, resumed = workspaces(tmp_path, fake_model)
    done = cli("baseline", "create", whole, "--allow-variance", "--json-report", tmp_path / "whole.json")
    killed(cli, where, "baseline", "create", resumed, "--allow-variance")
    listed = cli("runs", "list", "--suite", resumed, check=0)
    assert "abandoned" in listed.stdout
    again = cli("baseline", "create", resumed, "--allow-variance", "--resume", "--json-report", tmp_path / "again.json")
    assert again.returncode == done.returncode == 1, again.stdout + again.stderr  # p003 varies; promoted anyway
    a, b = stored(whole, 1), stored(resumed, 1)
    assert_same_run(a, b)
    assert read_json(tmp_path / "again.json")["counts"] == read_json(tmp_path / "whole.json")["counts"]
    kept = sum(p.get("resumed_with", 0) for p in b["passes"])
    ran_here = sum(p["requests"] for p in b["passes"])
    assert ran_here + kept == sum(p["requests"] for p in a["passes"])
    assert not any("wave_seconds" in p for p in a["passes"] + b["passes"])  # a cost run's only (RunRequest)
    if where == "pass:2":
        assert kept == 8  # two chunks of 4, and only the rest ran again
    elif where in ("rescoring", "judging"):
        assert ran_here == 0  # every pass was stored: nothing ran again but (mid-rescoring) the rescoring's rest
    if where == "rescoring":  # what the killed process rescored counts as done: the progress ends whole
        told = [line for line in again.stderr.splitlines() if line.startswith("rescoring this run's tokens: ")]
        assert told and told[-1].startswith(f"rescoring this run's tokens: {len(PROMPTS)}/{len(PROMPTS)} requests")
        done_of_total = told[-1].rsplit("; run ", 1)[1].split("/")
        assert done_of_total[0] == done_of_total[1], told[-1]
    assert rows(resumed.parent / "evalgate.sqlite", "select run_id from baselines") == [(1,)]


def test_a_check_killed_mid_pass_resumes_to_the_uninterrupted_check(cli, tmp_path, fake_model):
    whole, resumed = workspaces(tmp_path, fake_model)
    for suite in (whole, resumed):
        cli("baseline", "create", suite, "--allow-variance")
    done = cli("check", whole)
    killed(cli, "pass:5", "check", resumed)
    again = cli("check", resumed, "--resume")
    assert again.returncode == done.returncode, again.stdout + again.stderr
    assert_same_run(stored(whole, 2), stored(resumed, 2))


def test_a_resume_that_would_not_match_is_refused(cli, tmp_path, fake_model):
    _, suite = workspaces(tmp_path, fake_model)
    fresh = cli("baseline", "create", suite, "--resume", "--allow-variance")  # nothing to resume: a new run
    assert fresh.returncode == 1 and "complete" in cli("runs", "list", "--suite", suite, check=0).stdout
    refused = cli("baseline", "create", suite, "--resume-run", "1", check=2)
    assert "run 1 is complete: there is nothing to resume" in refused.stderr
    killed(cli, "pass:3", "baseline", "create", suite, "--allow-variance")  # run 2, unfinished
    other_schedule = cli("baseline", "create", suite, "--resume", "--concurrency", "1,8", check=2)
    assert "run 2 ran another schedule (concurrency" in other_schedule.stderr
    check_kind = cli("check", suite, "--resume-run", "2", check=2)
    assert "kind 'baseline', not 'check'" in check_kind.stderr
    text = suite.read_text()
    suite.write_text(text.replace("max_tokens = 8", "max_tokens = 9"))
    changed = cli("baseline", "create", suite, "--resume", check=2)
    assert "run 2 was recorded with another" in changed.stderr and "without --resume" in changed.stderr
    suite.write_text(text)
    cli("baseline", "create", suite, "--resume", "--allow-variance", check=1)
    assert rows(suite.parent / "evalgate.sqlite", "select id, status from runs") == [(1, "complete"), (2, "complete")]


def test_a_vllm_run_killed_mid_pass_resumes_stable_with_its_hot_pass_warm(cli, tmp_path, tiny_model):
    """Real vLLM: a baseline SIGKILLed in the middle of its first pass (engine and all), resumed in a new engine.
    Its passes run one sequence at a time (`max_num_seqs = 1`) under evalgate's CPU kernels (on an AVX2 EPYC plain
    vLLM varies hot vs cold cache even so; the kernels' attention gives a query the same bits from a cache hit),
    so every pass of a request must give the same output whichever process ran it, on any CPU: the resumed run
    is complete and stable, its first pass kept the 12 requests stored before the kill, and its hot pass was
    served from the prefix cache although the pass that warmed it ran in the engine that died (the resume warms
    it again)."""
    long_prompts = [" ".join([p] * 6) for p in PROMPTS]  # longer than a KV block: a warm cache serves them
    suite = write_suite(tmp_path / "ws", tiny_model, long_prompts, concurrency=(1,), shuffles=1, max_tokens=6,
                        hot_pass=True, extra_engine="max_num_seqs = 1", batch_invariant=True)
    killed(cli, "pass:3", "baseline", "create", suite)
    cli("baseline", "create", suite, "--resume", "--json-report", tmp_path / "report.json", check=0)
    report = read_json(tmp_path / "report.json")
    run = stored(suite, 1)
    assert report["batch_invariance"]["in_force"] is True
    assert run["runs"] == 1 and run["status"] == "complete" and report["counts"]["stable"] == len(PROMPTS)
    assert [p.get("resumed_with", 0) for p in run["passes"]] == [12, 0, 0]
    hot = [p["index"] for p in run["passes"] if p["cache"] == "hot"]
    cached = [row[7] for row in run["outputs"] if row[1] in hot]
    assert len(cached) == len(PROMPTS) and all(tokens > 0 for tokens in cached)
