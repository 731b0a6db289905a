"""The Kubernetes recipe's retry policy (examples/schedulers/evalgate-indexed-job.yaml) against evalgate's exit-code
contract: its shard command run by bash as a pod runs it, with a stand-in `evalgate` on PATH that exits as told. A
shard that stored its run (0, 1) ends its pod with 0; a died one (3, a signal) is retried by the Job and resumes; a
configuration error or a missing baseline fails its index at once. The Slurm recipes run for real in
tests/e2e/test_e2e_schedulers.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from evalgate.errors import ExitCode

RECIPE = Path(__file__).resolve().parents[2] / "examples" / "schedulers" / "evalgate-indexed-job.yaml"


@pytest.fixture(scope="module")
def shard_job() -> dict:
    return next(doc for doc in yaml.safe_load_all(RECIPE.read_text()) if doc["metadata"]["name"] == "evalgate-shards")


def run_shard(job: dict, tmp_path: Path, check_exit: int, fetch_exit: int = 0) -> tuple[int, str]:
    """The pod's exit code and the `evalgate check` arguments it ran, for index 1."""
    stub = tmp_path / "bin" / "evalgate"
    stub.parent.mkdir(exist_ok=True)
    stub.write_text(f'#!/bin/sh\nif [ "$1" = fetch ]; then exit {fetch_exit}; fi\necho "$@" > "{tmp_path}/args"\n'
                    f'if [ {check_exit} -ge 128 ]; then kill -{check_exit - 128} $$; fi\nexit {check_exit}\n')
    stub.chmod(0o755)
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {**os.environ, "PATH": f"{stub.parent}:{os.environ['PATH']}", "JOB_COMPLETION_INDEX": "1",
           "GROUP": "k8s-run-1", "EVALGATE_DB": "postgresql://store"}
    proc = subprocess.run([*container["command"], *container["args"]], env=env, capture_output=True, text=True)
    args = (tmp_path / "args").read_text() if (tmp_path / "args").exists() else ""
    return proc.returncode, args


def failed_index(job: dict, code: int) -> bool:
    """Whether the Job's pod failure policy fails the index at once (no retry) for a pod that exited `code`."""
    rules = [r for r in job["spec"]["podFailurePolicy"]["rules"] if "onExitCodes" in r]
    return any(r["action"] == "FailIndex" and code in r["onExitCodes"]["values"] for r in rules)


def test_a_shard_resumes_its_own_shard_and_group(shard_job, tmp_path):
    code, args = run_shard(shard_job, tmp_path, 0)
    assert code == 0 and args.split()[:2] == ["check", "evalgate.toml"]
    assert "--resume" in args.split() and "--shard 2/4 --group k8s-run-1" in args


@pytest.mark.parametrize("check_exit, pod_exit, retried", [
    (ExitCode.PASS, 0, False),
    (ExitCode.REGRESSION, 0, False),  # its run is stored: the merge gives the verdict
    (ExitCode.INFRA, 3, True),  # an engine death: retried, and the retry resumes
    (128 + 9, 128 + 9, True),  # SIGKILL (the OOM killer): the same
    (ExitCode.USAGE, 2, False),  # a configuration error would only fail again
    (ExitCode.NO_BASELINE, 4, False),
])
def test_each_exit_code_is_retried_or_not_as_the_contract_says(shard_job, tmp_path, check_exit, pod_exit, retried):
    code, _ = run_shard(shard_job, tmp_path, int(check_exit))
    assert code == pod_exit
    assert shard_job["spec"]["backoffLimitPerIndex"] >= 1 and shard_job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert (code != 0 and not failed_index(shard_job, code)) == retried


def test_a_failed_fetch_fails_the_pod_with_its_own_code(shard_job, tmp_path):
    code, args = run_shard(shard_job, tmp_path, 0, fetch_exit=int(ExitCode.USAGE))
    assert code == ExitCode.USAGE and args == ""
