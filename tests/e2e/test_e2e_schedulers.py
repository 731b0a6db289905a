"""The shard-and-merge contract on a scheduler's terms (docs/ci.md "Beyond one machine"): the Slurm job array
scripts of examples/schedulers/ run for real, as Slurm would run them (its array variables set, the tasks at
once, each a process of its own), against one store; then the merge script judges the whole suite."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import database_url, read_json, write_suite

pytestmark = pytest.mark.e2e

SCRIPTS = Path(__file__).resolve().parents[2] / "examples" / "schedulers"
PROMPTS = ["The capital of France is", "Count to five:", "A haiku about rain:", "def add(a, b):", "Name a colour:"]


def array_env(cli_env, suite: Path, command: str, tasks: int) -> dict[str, str]:
    """The environment Slurm gives every task of the array (job 4242), and the recipes' own variables."""
    return {**cli_env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "EVALGATE_SUITE": str(suite),
            "EVALGATE_DB": database_url(suite), "EVALGATE_COMMAND": command,
            "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_COUNT": str(tasks)}


def start_task(env: dict[str, str], cwd: Path, task: int, **popen) -> subprocess.Popen:
    return subprocess.Popen(["bash", str(SCRIPTS / "evalgate-shards.sbatch")], cwd=cwd,
                            env={**env, "SLURM_ARRAY_TASK_ID": str(task)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, **popen)


def finish_tasks(shards: list[subprocess.Popen]) -> list[int]:
    codes = []
    for shard in shards:
        out, err = shard.communicate(timeout=900)
        assert shard.returncode in (0, 1), out + err  # a shard that finds a regression still stores its run
        codes.append(shard.returncode)
    return codes


def run_merge(env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPTS / "evalgate-merge.sbatch")], cwd=cwd, env={**env, "GROUP": "slurm-4242"},
                          capture_output=True, text=True, timeout=900)


def run_array(cli_env, cwd: Path, suite: Path, command: str, tasks: int = 2) -> tuple[list[int], subprocess.CompletedProcess]:
    """Every task of the array at once (as Slurm starts them), then the merge job (as `afterany` does): the
    tasks' exit codes and the merge's result."""
    env = array_env(cli_env, suite, command, tasks)
    codes = finish_tasks([start_task(env, cwd, i) for i in range(1, tasks + 1)])
    return codes, run_merge(env, cwd)


def test_a_slurm_array_on_the_fake_engine_merges_to_the_unsharded_verdict(cli, cli_env, tmp_path, fake_model):
    suite = write_suite(tmp_path / "suite", fake_model, PROMPTS, kind="fake", concurrency=(1, 2),
                        extra_engine='fake_vary_with_batch = ["p001"]')
    codes, created = run_array(cli_env, tmp_path, suite, "baseline-create")
    assert created.returncode == 1 and sorted(codes) == [0, 1], created.stdout + created.stderr  # p001 varies
    cli("baseline", "create", suite, "--allow-variance", check=1)  # promoted, and still says p001 varies
    codes, merged = run_array(cli_env, tmp_path, suite, "check")
    assert merged.returncode == 1 and sorted(codes) == [0, 1], merged.stdout + merged.stderr
    sharded = read_json(tmp_path / "evalgate-report.json")
    cli("check", suite, "--json-report", tmp_path / "whole.json", check=1)
    whole = read_json(tmp_path / "whole.json")
    assert sharded["counts"] == whole["counts"] and sum(whole["counts"].values()) == len(PROMPTS)
    assert [r["key"] for r in sharded["requests"]] == [r["key"] for r in whole["requests"]] == ["p001"]
    assert (tmp_path / "evalgate-shard-1.xml").is_file() and (tmp_path / "evalgate-shard-2.xml").is_file()


def test_a_slurm_array_on_vllm_gates_the_whole_suite(cli, cli_env, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "suite", tiny_model, PROMPTS, concurrency=(1,), max_tokens=4, hot_pass=False,
                        extra_engine="max_num_seqs = 1")  # one sequence at a time: invariant by construction
    cli("baseline", "create", suite, check=0)
    codes, merged = run_array(cli_env, tmp_path, suite, "check")
    assert merged.returncode == 0 and codes == [0, 0], merged.stdout + merged.stderr
    report = read_json(tmp_path / "evalgate-report.json")
    assert report["counts"] == {**report["counts"], "stable": len(PROMPTS)} and sum(report["counts"].values()) == len(PROMPTS)


def test_a_slurm_task_killed_mid_pass_resumes_when_slurm_runs_it_again(cli, cli_env, tmp_path, fake_model):
    """Task 1's whole process group is SIGKILLed mid-pass (a lost node). Slurm runs the task again (`--requeue`:
    the same job id, so the same group), and the recipe's `--resume` continues that shard's run, keeping the pass
    it stored: one run for the shard, complete, and the merged verdict is still the unsharded one."""
    suite = write_suite(tmp_path / "suite", fake_model, PROMPTS, kind="fake", concurrency=(1, 2),
                        extra_engine='fake_vary_with_batch = ["p001"]\nfake_seconds_per_wave = 0.3')
    cli("baseline", "create", suite, "--allow-variance", check=1)
    env = array_env(cli_env, suite, "check", tasks=2)
    db = suite.parent / "evalgate.sqlite"
    first = start_task(env, tmp_path, 1, start_new_session=True)
    deadline = time.time() + 300
    while not _shard_outputs(db, "1/2") and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)  # the first pass is stored, the rest of the run not yet
    first.communicate(timeout=60)
    codes = finish_tasks([start_task(env, tmp_path, 2), start_task(env, tmp_path, 1)])
    merged = run_merge(env, tmp_path)
    assert merged.returncode == 1 and sorted(codes) == [0, 1], merged.stdout + merged.stderr
    (status, schedule), = _rows(db, "select status, schedule from runs where shard = '1/2'")
    assert status == "complete"
    assert sum(p.get("resumed_with", 0) for p in json.loads(schedule)["timings"]["passes"]) > 0
    cli("check", suite, "--json-report", tmp_path / "whole.json", check=1)
    assert read_json(tmp_path / "evalgate-report.json")["counts"] == read_json(tmp_path / "whole.json")["counts"]


def _rows(db: Path, sql: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def _shard_outputs(db: Path, shard: str) -> int:
    try:
        return _rows(db, "select count(*) from outputs join runs on runs.id = outputs.run_id "
                         "where runs.shard = ? and runs.kind = 'check'", (shard,))[0][0]
    except sqlite3.Error:
        return 0
