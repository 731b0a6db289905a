"""Models and data named as the Hub names them, against a stand-in for the Hub on loopback (tests/hub_stub.py):
`evalgate fetch` pins them in evalgate.lock, every other command runs offline (HF_HUB_OFFLINE=1) from the
cache, a moved branch changes nothing until the next fetch, and then it is an explained `model` change naming
both commits. The fake engine: what is under test is where the files come from, not what an engine does."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import CLI, bare_model, database_url, db_runs, read_json, write_suite
from hub_stub import StubHub, directory_files

pytestmark = pytest.mark.e2e

REPO = "acme/tiny-chat"
OFFLINE = {"HF_HUB_OFFLINE": "1"}


@pytest.fixture
def hub():
    with StubHub() as stub:
        yield stub


def hub_cli(cli: CLI, hub: StubHub, cwd: Path, **env) -> CLI:
    """The CLI against the stand-in, with its own Hugging Face cache; online (fetch) unless told otherwise."""
    environ = {k: v for k, v in cli.env.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN")}
    environ.update({"HF_ENDPOINT": hub.url, "HF_HOME": str(cwd / "hf-home"), **env})
    return CLI(environ, cwd)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_fetch_pins_a_commit_then_a_moved_branch_is_a_named_model_change(cli, hub, tmp_path):
    first = directory_files(bare_model(tmp_path / "weights-1", seed=1))
    repo = hub.model(REPO)
    commit_1 = repo.commit(first)
    suite = write_suite(tmp_path / "project", REPO, ["hello", "world", "again"], kind="fake", concurrency=(1, 2))
    online, offline = hub_cli(cli, hub, tmp_path / "project"), hub_cli(cli, hub, tmp_path / "project", **OFFLINE)

    refused = offline("baseline", "create", suite, check=2)
    assert f"`engine.model` = '{REPO}'" in refused.stderr and "evalgate fetch" in refused.stderr
    assert not (tmp_path / "project" / "evalgate.sqlite").exists()

    fetched = online("fetch", suite, "--no-progress", check=0)
    assert commit_1 in fetched.stdout
    lock = tomllib.loads((tmp_path / "project" / "evalgate.lock").read_text())
    [pin] = lock["repo"]
    assert (pin["repo"], pin["revision"], pin["commit"]) == (REPO, "main", commit_1)
    assert pin["files"] == {name: sha256(body) for name, body in first.items()}

    offline("baseline", "create", suite, check=0)
    stable = offline("check", suite, "--json-report", "r1.json", check=0)
    assert "identity unchanged" in stable.stdout
    info = read_json(tmp_path / "project" / "r1.json")
    assert info["counts"]["stable"] == 3

    # The branch moves on the Hub: nothing changes until `evalgate fetch` runs again.
    commit_2 = repo.commit(directory_files(bare_model(tmp_path / "weights-2", seed=2)))
    offline("check", suite, "--json-report", "r2.json", check=0)
    assert read_json(tmp_path / "project" / "r2.json")["counts"]["stable"] == 3

    # CI on a cold cache: `fetch --locked` brings the locked commit, not the branch's new one, and keeps the lock.
    lock_text = (tmp_path / "project" / "evalgate.lock").read_text()
    ci = hub_cli(cli, hub, tmp_path / "project", HF_HOME=str(tmp_path / "ci-cache"))
    ci("fetch", suite, "--locked", "--no-progress", check=0)
    assert (tmp_path / "project" / "evalgate.lock").read_text() == lock_text
    assert (tmp_path / "ci-cache" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit_1).is_dir()
    assert not (tmp_path / "ci-cache" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit_2).exists()

    moved = online("fetch", suite, "--no-progress", check=0)
    assert f"{commit_1} -> {commit_2}" in moved.stdout
    offline("check", suite, "--json-report", "r3.json", check=0)
    changed = read_json(tmp_path / "project" / "r3.json")
    assert changed["counts"].get("explained_change") == 3 and changed["counts"].get("silent_regression", 0) == 0
    assert f"{REPO}: commit {commit_1} -> {commit_2}" in changed["fingerprint_changes"]["model"]

    # A cache that lacks a locked file: exit 2 naming the file and `evalgate fetch`; no run stored.
    runs_before = len(db_runs(database_url(suite)))
    snapshot = tmp_path / "project" / "hf-home" / "hub" / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit_2
    (snapshot / "model.safetensors").unlink()
    broken = offline("check", suite, check=2)
    assert "model.safetensors" in broken.stderr and "evalgate fetch" in broken.stderr
    assert len(db_runs(database_url(suite))) == runs_before


def test_a_gated_repo_needs_hf_token_and_the_token_is_stored_nowhere(cli, hub, tmp_path):
    token = "hf_stubSecretToken0123456789"
    hub.model(REPO, token=token).commit(directory_files(bare_model(tmp_path / "weights", seed=3)))
    suite = write_suite(tmp_path / "project", REPO, ["hello", "world"], kind="fake", concurrency=(1, 2))
    project = tmp_path / "project"

    refused = hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=2)
    assert "HF_TOKEN" in refused.stderr and not (project / "evalgate.lock").exists()

    with_token = hub_cli(cli, hub, project, HF_TOKEN=token)
    outputs = [with_token("fetch", suite, "--no-progress", check=0)]
    offline = hub_cli(cli, hub, project, HF_TOKEN=token, **OFFLINE)
    outputs.append(offline("baseline", "create", suite, "--json-report", "create.json", check=0))
    outputs.append(offline("check", suite, "--json-report", "check.json", "--junit", "check.xml", check=0))
    assert any(auth == f"Bearer {token}" for _, _, auth in hub.log)  # it was used, where it belongs
    for proc in outputs:
        assert token not in proc.stdout + proc.stderr
    for path in [p for p in project.rglob("*") if p.is_file() and "hf-home" not in p.parts]:
        assert token.encode() not in path.read_bytes(), path  # the store, the reports, the lock


def sciq_docs(n: int, offset: int) -> bytes:
    return "".join(json.dumps({"question": f"What is {i} plus {offset}?", "distractor1": "red", "distractor2": "blue",
                               "distractor3": "green", "correct_answer": str(i + offset), "support": f"Sums. {i}"}) + "\n"
                   for i in range(n)).encode()


def test_a_builtin_lm_eval_task_is_fetched_then_gated_offline_at_its_locked_commit(cli, hub, tmp_path, tiny_model):
    """lm-eval's own `sciq` task, its dataset (allenai/sciq) served by the stand-in: fetched and pinned, then
    create and check offline; the dataset's branch moving on the Hub changes nothing until the next fetch."""
    hub.model(REPO).commit(directory_files(tiny_model))
    dataset = hub.dataset("allenai/sciq")
    first = dataset.commit({f"{split}.jsonl": sciq_docs(4, i) for i, split in enumerate(("train", "validation", "test"))})
    project = tmp_path / "project"
    suite = write_suite(project, REPO, ["hello"], kind="fake", concurrency=(1, 2))
    suite.write_text(suite.read_text() + '\n[lm_eval]\ntasks = ["sciq"]\nlimit = 3\n')
    offline = hub_cli(cli, hub, project, **OFFLINE)

    refused = offline("baseline", "create", suite, check=2)
    assert "evalgate fetch" in refused.stderr
    fetched = hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=0)
    assert f"lm_eval task 'sciq': dataset: allenai/sciq @ main: commit {first}" in fetched.stdout
    pins = {p["type"]: p for p in tomllib.loads((project / "evalgate.lock").read_text())["repo"]}
    assert (pins["dataset"]["repo"], pins["dataset"]["task"], pins["dataset"]["commit"]) == ("allenai/sciq", "sciq", first)

    offline("baseline", "create", suite, "--json-report", "create.json", check=0)
    created = read_json(project / "create.json")
    assert created["counts"]["stable"] > 3  # the prompt and sciq's requests (4 choices a document)
    dataset.commit({f"{split}.jsonl": sciq_docs(4, 10 + i) for i, split in enumerate(("train", "validation", "test"))})
    offline("check", suite, "--json-report", "check.json", check=0)
    checked = read_json(project / "check.json")
    assert checked["counts"] == created["counts"] and not checked["fingerprint_changes"]


def test_fetch_names_a_missing_repo_and_revision(cli, hub, tmp_path):
    hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=1)))
    project = tmp_path / "project"
    suite = write_suite(project, "acme/no-such-model", ["hello"], kind="fake")
    missing = hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=2)
    assert "'acme/no-such-model'" in missing.stderr and "no such model repo" in missing.stderr
    suite = write_suite(project, REPO, ["hello"], kind="fake", extra_engine='revision = "v9"')
    bad_revision = hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=2)
    assert "revision 'v9'" in bad_revision.stderr and "no such revision" in bad_revision.stderr
    assert not (project / "evalgate.lock").exists()


def test_fetch_reads_the_whole_suite_as_every_command_does_and_writes_no_lock_for_a_wrong_one(cli, hub, tmp_path):
    """One reader of a suite file: fetch goes through load_suite (its Hub resolver downloads), so a repo that is
    not a model, or a mistake in any table, is exit 2 at fetch time, naming the field, and no lock is written."""
    project = tmp_path / "project"
    hub.model("acme/not-a-model").commit({"README.md": b"no config.json here"})
    suite = write_suite(project, "acme/not-a-model", ["hello"], kind="fake")
    refused = " ".join(hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=2).stderr.split())
    assert "`engine.model`" in refused and "no config.json" in refused  # (a long path wraps the message)
    hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=1)))
    suite = write_suite(project, REPO, ["hello"], kind="fake")
    suite.write_text(suite.read_text().replace("[sampling]", "[sampling]\ntemprature = 0.5", 1))
    typo = hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=2)
    assert "temprature" in " ".join(typo.stderr.split())
    assert not (project / "evalgate.lock").exists()


def test_init_with_a_hub_id_pins_the_commit_and_writes_a_workflow_that_brings_the_model(cli, hub, tmp_path):
    import shutil
    import subprocess

    import yaml

    commit = hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=4)))
    online = hub_cli(cli, hub, tmp_path)
    online("init", "--dir", "proj", "--model", REPO, "--engine-extra", 'kind = "fake"', "--no-survey", "--yes", check=0)
    project = tmp_path / "proj"
    suite = tomllib.loads((project / "evalgate.toml").read_text())
    assert (suite["engine"]["model"], suite["engine"]["revision"]) == (REPO, commit)
    [pin] = tomllib.loads((project / "evalgate.lock").read_text())["repo"]
    assert (pin["repo"], pin["commit"]) == (REPO, commit)
    hub_cli(cli, hub, project, HF_HOME=str(tmp_path / "hf-home"), **OFFLINE)("baseline", "create", check=0)  # offline at once

    workflow_path = project / ".github" / "workflows" / "evalgate.yml"
    text = workflow_path.read_text()
    gate = next(s for s in yaml.safe_load(text)["jobs"]["evalgate"]["steps"] if "evalgate/evalgate@" in s.get("uses", ""))
    assert gate["with"]["hf-token"] == "${{ secrets.HF_TOKEN }}" and "HF_TOKEN" in text and "model-cache-path" not in gate["with"]
    bin_dir = Path(sys.executable).parent
    for tool, args in (("check-jsonschema", ["--builtin-schema", "vendor.github-workflows"]), ("zizmor", ["--offline"])):
        exe = shutil.which(tool) or str(bin_dir / tool)
        proc = subprocess.run([exe, *args, str(workflow_path)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{tool}: {proc.stdout}{proc.stderr}"



def test_the_history_reads_without_the_model_on_a_machine_with_an_empty_cache(cli, hub, tmp_path):
    """A Hub-id suite, fetched, locked and baselined; then a reviewer's laptop, a dashboard or a PR-comment job:
    the same files, an empty Hugging Face cache, offline. The commands that only read runs need the suite's
    [suite] table alone (exit 0); a check still needs the model (exit 2 naming `evalgate fetch`)."""
    hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=6)))
    project = tmp_path / "project"
    suite = write_suite(project, REPO, ["hello", "world"], kind="fake", concurrency=(1,), shuffles=0, hot_pass=False,
                        name="team")
    hub_cli(cli, hub, project)("fetch", suite, "--no-progress", check=0)
    offline = hub_cli(cli, hub, project, **OFFLINE)
    offline("baseline", "create", suite, check=0)
    offline("check", suite, check=0)
    laptop = hub_cli(cli, hub, project, **OFFLINE, HF_HOME=str(tmp_path / "empty-hf-home"))
    assert "evalgate fetch" in laptop("check", suite, check=2).stderr  # the model is not here
    assert [(r["run"], r["suite"]) for r in json.loads(laptop("runs", "list", "--json", check=0).stdout)] == [
        (2, "team"), (1, "team")]
    assert [r["run"] for r in json.loads(laptop("baseline", "list", "--json", check=0).stdout)] == [1]
    assert [r["run"] for r in json.loads(laptop("runs", "history", "--json", check=0).stdout)] == [2, 1]
    assert "wrote the report of run 2" in laptop("report", "--latest", "--html", tmp_path / "r.html", check=0).stdout
    laptop("diff", "1", "2", check=0)

def test_fetch_names_each_repo_by_the_field_that_names_it(cli, hub, tmp_path):
    """A tokenizer from another repo is fetched and pinned, and printed as the tokenizer, not as a model."""
    weights = hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=5)))
    tokenizer = hub.model("acme/tok").commit({"tokenizer.json": b"{}", "tokenizer_config.json": b"{}"})
    suite = write_suite(tmp_path / "project", REPO, ["hello"], kind="fake", concurrency=(1,), shuffles=0,
                        extra_engine='tokenizer = "acme/tok"')
    fetched = hub_cli(cli, hub, tmp_path / "project")("fetch", suite, "--no-progress", check=0)
    assert f"engine.model: {REPO} @ main: commit {weights}" in fetched.stdout
    assert f"engine.tokenizer: acme/tok @ main: commit {tokenizer}" in fetched.stdout
    assert {p["repo"] for p in tomllib.loads((tmp_path / "project" / "evalgate.lock").read_text())["repo"]} == {
        REPO, "acme/tok"}


def test_an_adapter_named_as_a_hub_id_is_fetched_pinned_and_its_new_commit_explains_its_requests(cli, hub, tmp_path):
    """`[adapters] support = { path = "org/name", revision = ... }`: pinned in the lock beside the model, read
    offline from the cache; a new commit of the adapter explains its own requests and no other."""
    hub.model(REPO).commit(directory_files(bare_model(tmp_path / "weights", seed=4)))
    adapter = hub.model("acme/support-lora")
    config = json.dumps({"peft_type": "LORA", "r": 8}).encode()
    first = adapter.commit({"adapter_config.json": config, "adapter_model.safetensors": b"support-1"})
    lines = [{"id": "q1", "prompt": "Refund policy?"}, {"id": "q2", "prompt": "Opening hours?", "adapter": "support"}]
    suite = write_suite(tmp_path / "project", REPO, lines, kind="fake", concurrency=(1,), shuffles=0, hot_pass=False)
    suite.write_text(suite.read_text() + '\n[adapters]\nsupport = { path = "acme/support-lora", revision = "main" }\n'
                     '\n[lm_eval]\ntasks = ["evalgate_arith"]\nadapter = "support"\n')
    project = tmp_path / "project"
    online, offline = hub_cli(cli, hub, project), hub_cli(cli, hub, project, **OFFLINE)
    fetched = online("fetch", suite, "--no-progress", check=0)  # [lm_eval] adapter is read (load_suite), not refused
    pins = {p["repo"]: p["commit"] for p in tomllib.loads((project / "evalgate.lock").read_text())["repo"]}
    assert pins["acme/support-lora"] == first and set(pins) == {REPO, "acme/support-lora"}
    assert f"adapters.support: acme/support-lora @ main: commit {first}" in fetched.stdout  # named by its role
    suite.write_text(suite.read_text().split("\n[lm_eval]")[0])
    offline("baseline", "create", suite, check=0)

    adapter.commit({"adapter_config.json": config, "adapter_model.safetensors": b"support-2"})
    offline("check", suite, "--json-report", "same.json", check=0)  # the lock, not the branch
    assert read_json(project / "same.json")["counts"]["stable"] == 2
    online("fetch", suite, "--no-progress", check=0)
    offline("check", suite, "--json-report", "moved.json", check=0)
    changed = {r["key"]: r["components"] for r in read_json(project / "moved.json")["requests"]}
    assert changed == {"q2": ["adapter"]}
