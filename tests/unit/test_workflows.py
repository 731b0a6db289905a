"""The project's GitHub Actions workflows validate against the published workflow schema (offline copy
shipped with check-jsonschema), so a broken CI file fails here rather than on GitHub; so does the composite
action (action.yml), which must also pass its inputs to the shell through `env:` only."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def _check_jsonschema() -> str:
    return shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")


def test_the_project_workflow_runs_ci_on_every_push_and_pull_request():
    """The project's own workflow exists, triggers on pushes to main and on pull requests, and its job runs
    `.ci/run` (the script that runs the README's test command), with a timeout."""
    from ruamel.yaml import YAML

    ci = YAML(typ="safe").load((ROOT / ".github" / "workflows" / "ci.yml").read_text(encoding="utf-8"))
    triggers = ci.get("on") or ci.get(True)  # YAML 1.1 reads a bare `on` as true
    assert "main" in triggers["push"]["branches"] and "pull_request" in triggers
    (job,) = ci["jobs"].values()
    assert job.get("timeout-minutes")
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash .ci/run"]


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_is_valid(workflow):
    proc = subprocess.run([_check_jsonschema(), "--builtin-schema", "vendor.github-workflows", str(workflow)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test " in readme and re.search(r"^make test$", ci, re.M)
    assert ci.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ci  # fails loudly


# --- the composite action (action.yml at the repository root) ------------------------------------------------

ACTION = ROOT / "action.yml"


def _load_action() -> dict:
    from ruamel.yaml import YAML  # check-jsonschema's YAML parser: already a dev dependency

    return YAML(typ="safe").load(ACTION.read_text(encoding="utf-8"))


def _action_run_blocks() -> list[tuple[str, str]]:
    action = _load_action()
    assert action["runs"]["using"] == "composite"
    return [(step.get("name") or step.get("id") or f"step {i}", step["run"])
            for i, step in enumerate(action["runs"]["steps"]) if "run" in step]


def test_action_is_valid():
    proc = subprocess.run([_check_jsonschema(), "--builtin-schema", "vendor.github-actions", str(ACTION)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_action_passes_inputs_through_env_only():
    """`${{ inputs.x }}` inside `run:` is pasted into the script before bash parses it: script injection.
    Inputs must reach the shell as environment variables."""
    blocks = _action_run_blocks()
    assert blocks, "no run: steps in action.yml"
    for name, script in blocks:
        assert not re.search(r"\$\{\{\s*inputs\.", script), f"{name}: ${{{{ inputs.* }}}} inside run:"
        assert "${{" not in script, f"{name}: an expression inside run: (pass it through env:)"


def test_action_run_blocks_are_valid_bash():
    for name, script in _action_run_blocks():
        proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"


def test_action_fails_last_with_the_check_exit_code():
    steps = _load_action()["runs"]["steps"]
    check = next(s for s in steps if s.get("id") == "check")
    assert "set +e" in check["run"] and "exit 0" in check["run"]
    last = steps[-1]
    assert last.get("if") == "always()" and 'exit "$code"' in last["run"]
    assert "steps.check.outputs.exit-code" in last["env"]["EVALGATE_CODE"]
    for step in steps[steps.index(check) + 1:]:
        assert "always()" in step.get("if", ""), f"{step.get('name')}: must run even when the check failed"


@pytest.mark.parametrize("package, expected", [("", "{action}[gpu]"), ("dist/evalgate_vllm-0.1.0.whl", "dist/evalgate_vllm-0.1.0.whl")])
def test_action_installs_its_own_checkout_unless_a_package_is_named(tmp_path, package, expected):
    """No evalgate package is published on the index: by default the action pip-installs the checkout it
    runs from ($GITHUB_ACTION_PATH) with the chosen extra. Run for real with a stand-in `python`."""
    script = dict(_action_run_blocks())["Install evalgate"]
    stub = tmp_path / "bin" / "python"
    stub.parent.mkdir()
    stub.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "argv"}\n')
    stub.chmod(0o755)
    env = {"PATH": f"{stub.parent}:/usr/bin:/bin", "GITHUB_ACTION_PATH": str(ROOT), "EVALGATE_PACKAGE": package,
           "EVALGATE_EXTRA": "gpu", "EVALGATE_PIP_ARGS": ""}
    subprocess.run(["bash", "-c", script], env=env, check=True)
    argv = (tmp_path / "argv").read_text().split("\n")
    assert argv[:3] == ["-m", "pip", "install"] and argv[-2] == expected.format(action=ROOT)


def _run_block(name: str, tmp_path, env: dict[str, str], exit_code: int = 0) -> list[list[str]]:
    """Run one of the action's `run:` blocks for real, with stand-in `python` and `evalgate` that record each
    call's arguments (and exit `exit_code`); returns the calls."""
    script = dict(_action_run_blocks())[name]
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("python", "evalgate"):
        stub = bin_dir / tool
        stub.write_text(f'#!/bin/sh\n{{ echo {tool}; printf "%s\\n" "$@"; echo --; }} >> {calls}\nexit {exit_code}\n')
        stub.chmod(0o755)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GITHUB_OUTPUT": str(tmp_path / "output"), **env}
    proc = subprocess.run(["bash", "-c", script], env=full, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    if not calls.exists():
        return []
    return [block.strip("\n").split("\n") for block in calls.read_text().split("--\n") if block.strip()]


def test_the_cpu_extra_names_pytorchs_cpu_index_and_removes_the_cuda_wheels(tmp_path):
    calls = _run_block("Install evalgate", tmp_path, {"GITHUB_ACTION_PATH": str(ROOT), "EVALGATE_PACKAGE": "",
                                                      "EVALGATE_EXTRA": "cpu", "EVALGATE_PIP_ARGS": ""})
    install, uninstall = calls
    assert install[:4] == ["python", "-m", "pip", "install"] and install[-1] == f"{ROOT}[cpu]"
    assert "--extra-index-url" in install and "https://download.pytorch.org/whl/cpu" in install
    assert uninstall[:4] == ["python", "-m", "pip", "uninstall"] and {"torchvision", "triton"} <= set(uninstall)
    # an index the user names wins; gpu adds none and removes nothing
    (tmp_path / "calls").unlink()
    calls = _run_block("Install evalgate", tmp_path, {"GITHUB_ACTION_PATH": str(ROOT), "EVALGATE_PACKAGE": "",
                                                      "EVALGATE_EXTRA": "cpu", "EVALGATE_PIP_ARGS": "--index-url http://mirror/simple"})
    assert "https://download.pytorch.org/whl/cpu" not in calls[0] and "http://mirror/simple" in calls[0]
    (tmp_path / "calls").unlink()
    calls = _run_block("Install evalgate", tmp_path, {"GITHUB_ACTION_PATH": str(ROOT), "EVALGATE_PACKAGE": "",
                                                      "EVALGATE_EXTRA": "gpu", "EVALGATE_PIP_ARGS": ""})
    assert len(calls) == 1 and "--extra-index-url" not in calls[0]


CHECK_ENV = {"EVALGATE_SUITE": "evalgate.toml", "EVALGATE_DATABASE": "", "EVALGATE_STRICT": "true", "EVALGATE_OUT": "out",
             "EVALGATE_COMMAND": "check", "EVALGATE_FAIL_ON": "", "EVALGATE_SHARD": "", "EVALGATE_GROUP": "77"}


@pytest.mark.parametrize("inputs, expected", [
    ({}, ["check", "evalgate.toml", "--json-report", "out/report.json", "--junit", "out/junit.xml", "--strict"]),
    ({"EVALGATE_COMMAND": "baseline-create", "EVALGATE_FAIL_ON": "tokens", "EVALGATE_SHARD": "2/4"},
     ["baseline", "create", "evalgate.toml", "--json-report", "out/report.json", "--junit", "out/junit.xml",
      "--fail-on", "tokens", "--shard", "2/4", "--group", "77"]),
])
def test_the_check_step_runs_the_chosen_command_with_its_inputs(tmp_path, monkeypatch, inputs, expected):
    monkeypatch.chdir(tmp_path)
    (call,) = _run_block("evalgate check", tmp_path, {**CHECK_ENV, **inputs}, exit_code=1)
    assert call == ["evalgate", *expected]
    assert "exit-code=1" in (tmp_path / "output").read_text()  # the step itself passed; the code is kept


def test_an_unknown_command_input_is_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run_block("evalgate check", tmp_path, {**CHECK_ENV, "EVALGATE_COMMAND": "deploy"}) == []
    assert "exit-code=2" in (tmp_path / "output").read_text()


def test_the_pr_comment_step_never_fails_the_job(tmp_path):
    steps = _load_action()["runs"]["steps"]
    step = next(s for s in steps if s.get("name") == "PR comment")
    assert "always()" in step["if"] and "pull_request" in step["if"]
    env = {"EVALGATE_SUITE": "evalgate.toml", "EVALGATE_DATABASE": "", "EVALGATE_OUT": "out",
           "EVALGATE_ARTIFACT": "evalgate-report", "GITHUB_TOKEN": "t"}
    (call,) = _run_block("PR comment", tmp_path, env, exit_code=3)
    assert call == ["evalgate", "pr-comment", "--latest", "--suite", "evalgate.toml", "--body-file", "out/comment.md",
                    "--artifact", "evalgate-report"]


def test_the_fetch_steps_find_the_lock_beside_the_suite_and_fetch_exactly_what_it_pins(tmp_path, monkeypatch):
    """A suite with evalgate.lock: the lock is found beside the suite (its path keys the Hugging Face cache),
    and on a cache miss `evalgate fetch --locked` runs with the token input as HF_TOKEN. Run for real."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gate").mkdir()
    (tmp_path / "gate" / "evalgate.toml").write_text("")
    assert _run_block("Find the lock", tmp_path, {"EVALGATE_SUITE": "gate/evalgate.toml"}) == []
    assert not (tmp_path / "output").exists()  # no lock: no cache, no fetch
    (tmp_path / "gate" / "evalgate.lock").write_text("version = 1\n")
    _run_block("Find the lock", tmp_path, {"EVALGATE_SUITE": "gate/evalgate.toml"})
    assert (tmp_path / "output").read_text() == "path=gate/evalgate.lock\n"
    steps = {s.get("name"): s for s in _load_action()["runs"]["steps"]}
    cache = steps["Restore the Hugging Face cache"]
    assert cache["if"] == "steps.lock.outputs.path != ''" and "hashFiles(steps.lock.outputs.path)" in cache["with"]["key"]
    fetch_step = steps["evalgate fetch (the locked models and datasets)"]
    assert "steps.hf-cache.outputs.cache-hit != 'true'" in fetch_step["if"]
    assert fetch_step["env"]["HF_TOKEN"] == "${{ inputs.hf-token }}"
    (call,) = _run_block("evalgate fetch (the locked models and datasets)", tmp_path, {"EVALGATE_SUITE": "gate/evalgate.toml"})
    assert call == ["evalgate", "fetch", "gate/evalgate.toml", "--locked", "--no-progress"]


def test_a_model_cache_without_its_key_is_refused(tmp_path):
    """actions/cache restores a hit over the path and never updates it: under the one fixed key a changed model
    would be replaced by the cached one and pass as the baseline's. The path alone is refused, loudly."""
    steps = {s.get("name"): s for s in _load_action()["runs"]["steps"]}
    restore, refuse = steps["Restore the model cache"], steps["Refuse a model cache without its key"]
    assert restore["with"]["key"] == "${{ inputs.model-cache-key }}" and "inputs.model-cache-key != ''" in restore["if"]
    assert refuse["if"] == "inputs.model-cache-path != '' && inputs.model-cache-key == ''"
    proc = subprocess.run(["bash", "-c", refuse["run"]], env={"PATH": "/usr/bin:/bin", "EVALGATE_MODEL_CACHE_PATH": "models/mine"},
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout.startswith("::error title=evalgate::model-cache-path (models/mine) needs model-cache-key")
    assert list(steps).index(refuse["name"]) < list(steps).index(restore["name"])


def _zizmor() -> str:
    return shutil.which("zizmor") or str(Path(sys.executable).parent / "zizmor")


def test_the_workflows_and_the_action_pass_a_security_audit():
    """zizmor --offline: actions pinned to a commit, credentials not persisted, least permissions."""
    files = [*sorted((ROOT / ".github" / "workflows").glob("*.yml")), ROOT / "action.yml"]
    proc = subprocess.run([_zizmor(), "--offline", "--no-progress", *map(str, files)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
