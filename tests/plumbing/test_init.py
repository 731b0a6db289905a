"""`evalgate init` on the fake engine: the scaffold passes `baseline create` and `check` as written, where
the engine varies too (the survey finds it and the remedy is written and verified); a second init refuses
and changes nothing; every bad flag is exit 2 naming the flag, with nothing written. The same journey on
real vLLM is tests/e2e/test_e2e_init.py."""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import yaml
from helpers import db_baselines, db_runs, tomllib

from evalgate import __version__
from evalgate.cli import init as init_command
from evalgate.scaffold import action_ref

FAKE = 'kind = "fake"'


def digests(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_init_then_baseline_then_check_pass(inline_cli, tmp_path, fake_model):
    out = inline_cli("init", "--dir", tmp_path / "proj", "--model", fake_model, "--engine-extra", FAKE, check=0).stdout
    proj = tmp_path / "proj"
    for name in ("evalgate.toml", "prompts.jsonl", ".github/workflows/evalgate.yml"):
        assert (proj / name).is_file() and f"wrote {proj / name}" in out
    assert (proj / "baselines").is_dir()
    assert "nothing varies here that the gate fails on" in out and "max_num_seqs" not in (proj / "evalgate.toml").read_text()
    # off a terminal a long line is never wrapped (CI logs)
    assert any(line.startswith("next: evalgate baseline create") and line.endswith("(docs/ci.md)") for line in out.splitlines())
    suite = tomllib.loads((proj / "evalgate.toml").read_text())
    assert suite["suite"]["database"] == "sqlite:///baselines/evalgate.sqlite" and suite["gate"]["fail_on"] == "bits"
    prompts = [json.loads(line) for line in (proj / "prompts.jsonl").read_text().splitlines()]
    assert len(prompts) >= 3 and all("prompt" in p for p in prompts)  # no chat template: plain examples only
    inline_cli("baseline", "create", proj / "evalgate.toml", check=0)
    assert (proj / "baselines" / "evalgate.sqlite").is_file()
    inline_cli("check", proj / "evalgate.toml", check=0)
    # the survey's run is stored and is never the baseline
    listed = inline_cli("runs", "list", "--suite", proj / "evalgate.toml", check=0).stdout
    assert "survey" in listed
    # a survey afterwards prints the machine's table and moves no baseline
    db = f"sqlite:///{proj / 'baselines' / 'evalgate.sqlite'}"
    before = db_baselines(db)
    out = inline_cli("survey", proj / "evalgate.toml", check=0).stdout
    assert re.search(r"^batch size 1→8 +batch size +\d+/\d+$", out, re.M) and "it is never a baseline" in out
    assert db_baselines(db) == before and db_runs(db)[-1][1] == "survey"


def test_where_the_engine_varies_init_writes_the_remedy_and_the_suite_passes(inline_cli, tmp_path, fake_model):
    vary = FAKE + '\nfake_vary_with_batch = ["text-01", "text-03"]'
    out = inline_cli("init", "--dir", tmp_path / "proj", "--model", fake_model, "--engine-extra", vary, check=0).stdout
    assert "batch size 1→8" in out and "2/5" in out and "text-01: a confident token flip" in out
    assert "written into" in out and "verified: the passes agree" in out
    engine = tomllib.loads((tmp_path / "proj" / "evalgate.toml").read_text())["engine"]
    assert engine["max_num_seqs"] == 1
    inline_cli("baseline", "create", tmp_path / "proj" / "evalgate.toml", check=0)
    inline_cli("check", tmp_path / "proj" / "evalgate.toml", check=0)
    # without the survey the same scaffold is not promoted: the remedy is what made it pass
    inline_cli("init", "--dir", tmp_path / "bare", "--model", fake_model, "--engine-extra", vary, "--no-survey", check=0)
    inline_cli("baseline", "create", tmp_path / "bare" / "evalgate.toml", check=1)


def test_a_second_init_refuses_and_changes_nothing(inline_cli, tmp_path, fake_model):
    proj = tmp_path / "proj"
    inline_cli("init", "--dir", proj, "--model", fake_model, "--engine-extra", FAKE, "--no-survey", check=0)
    before = digests(proj)
    proc = inline_cli("init", "--dir", proj, "--model", fake_model, "--engine-extra", FAKE, check=2)
    assert "evalgate.toml exists" in proc.stderr and "never overwrites" in proc.stderr
    assert digests(proj) == before
    # any one file existing is enough: the workflow alone
    other = tmp_path / "other"
    (other / ".github" / "workflows").mkdir(parents=True)
    (other / ".github" / "workflows" / "evalgate.yml").write_text("mine\n")
    proc = inline_cli("init", "--dir", other, "--model", fake_model, "--engine-extra", FAKE, check=2)
    assert "evalgate.yml exists" in proc.stderr
    assert digests(other) == {".github/workflows/evalgate.yml": hashlib.sha256(b"mine\n").hexdigest()}
    assert not (other / "evalgate.toml").exists() and not (other / "baselines").exists()


@pytest.mark.parametrize("flags, named", [
    (["--fail-on", "nope"], "--fail-on"),
    (["--preset", "weekly"], "--preset"),
    (["--prompts", "missing.jsonl"], "--prompts"),
    (["--tasks", "arc easy"], "--tasks"),
    (["--url", "ftp://host"], "--url"),
    (["--url", "http://127.0.0.1:9"], "--served-model"),
    (["--database", "sqlite:///\0bad"], "database"),
])
def test_bad_flags_are_exit_2_naming_the_flag_and_write_nothing(inline_cli, tmp_path, fake_model, flags, named):
    proc = inline_cli("init", "--dir", tmp_path / "proj", "--model", fake_model, "--engine-extra", FAKE, *flags, check=2)
    assert named in proc.stderr and "fix:" in proc.stderr
    assert not (tmp_path / "proj").exists() or not any((tmp_path / "proj").rglob("*"))


def test_a_model_that_is_not_a_model_directory(inline_cli, tmp_path):
    proc = inline_cli("init", "--dir", tmp_path / "proj", "--model", tmp_path, check=2)
    assert "--model" in proc.stderr and "config.json" in proc.stderr
    proc = inline_cli("init", "--dir", tmp_path / "proj", "--yes", check=2)
    assert "--model" in proc.stderr and "--url" in proc.stderr


def test_own_prompts_tasks_and_choices(inline_cli, tmp_path, fake_model):
    (tmp_path / "mine.jsonl").write_text(json.dumps({"id": "q1", "prompt": "hello"}) + "\n")
    proj = tmp_path / "proj"
    inline_cli("init", "--dir", proj, "--model", fake_model, "--engine-extra", FAKE, "--prompts", tmp_path / "mine.jsonl",
               "--tasks", "arc_easy,hellaswag", "--fail-on", "tokens", "--preset", "rotating", "--no-survey", check=0)
    suite = tomllib.loads((proj / "evalgate.toml").read_text())
    assert suite["prompts"]["file"] == str(tmp_path / "mine.jsonl") and not (proj / "prompts.jsonl").exists()
    assert suite["lm_eval"]["tasks"] == ["arc_easy", "hellaswag"]
    assert suite["gate"]["fail_on"] == "tokens" and suite["schedule"]["preset"] == "rotating"


def test_interactive_init_asks_what_no_flag_gives(inline_cli, tmp_path, fake_model, monkeypatch):
    monkeypatch.setattr(init_command, "is_interactive", lambda: True)
    from typer.testing import CliRunner

    from evalgate.cli import app

    answers = f"{fake_model}\n\ntokens\nfull\nsqlite:///runs.sqlite\n"
    result = CliRunner().invoke(app, ["init", "--dir", str(tmp_path / "proj"), "--engine-extra", FAKE, "--no-survey"],
                                input=answers)
    assert result.exit_code == 0, result.output
    suite = tomllib.loads((tmp_path / "proj" / "evalgate.toml").read_text())
    assert suite["gate"]["fail_on"] == "tokens" and suite["suite"]["database"] == "sqlite:///runs.sqlite"
    assert "lm_eval" not in suite


def test_the_workflow_pins_this_versions_action_and_uses_only_its_inputs(inline_cli, tmp_path, fake_model):
    inline_cli("init", "--dir", tmp_path / "proj", "--model", fake_model, "--engine-extra", FAKE, "--no-survey", check=0)
    workflow = yaml.safe_load((tmp_path / "proj" / ".github" / "workflows" / "evalgate.yml").read_text())
    steps = workflow["jobs"]["evalgate"]["steps"]
    pinned = action_ref().split(" #")[0]
    gate = next(step for step in steps if step.get("uses") == pinned)
    assert re.fullmatch(r"evalgate/evalgate@[0-9a-f]{40}", pinned)  # this checkout's commit
    assert f"{pinned} # v{__version__}" in (tmp_path / "proj" / ".github" / "workflows" / "evalgate.yml").read_text()
    action = yaml.safe_load((init_command.Path(__file__).resolve().parents[2] / "action.yml").read_text())
    assert set(gate["with"]) <= set(action["inputs"]), set(gate["with"]) - set(action["inputs"])
    assert workflow["permissions"] == {} and workflow["jobs"]["evalgate"]["permissions"]["pull-requests"] == "write"


def test_the_workflow_brings_the_model_the_way_it_lives(inline_cli, tmp_path, fake_model):
    """A model in the repository comes with the checkout (with `lfs: true` where git keeps its files in Git LFS),
    one elsewhere is said to need a self-hosted runner or a Hub name, and so is a git clone of its own inside the
    repository (git keeps a link to it, and the checkout brings an empty directory). None is cached under a key
    that never changes (a cache hit would restore the old model over a changed one: a silent pass)."""
    import shutil
    import subprocess

    def workflow(directory):
        text = (directory / ".github" / "workflows" / "evalgate.yml").read_text()
        steps = yaml.safe_load(text)["jobs"]["evalgate"]["steps"]
        return text, steps[0]["with"], steps[1]["with"]

    inline_cli("init", "--dir", tmp_path / "elsewhere", "--model", fake_model, "--engine-extra", FAKE, "--no-survey", check=0)
    text, checkout, gate = workflow(tmp_path / "elsewhere")
    assert "model-cache-path" not in gate and "lfs" not in checkout and "self-hosted runner" in text

    def project(name, attributes):
        root = tmp_path / name
        shutil.copytree(fake_model, root / "models" / "mine")
        subprocess.run(["git", "init", "-q", str(root)], check=True)
        (root / ".gitattributes").write_text(attributes)
        inline_cli("init", "--dir", root, "--model", root / "models" / "mine", "--engine-extra", FAKE, "--no-survey", check=0)
        return workflow(root)

    text, checkout, gate = project("plain", "*.txt text\n")
    assert "model-cache-path" not in gate and "lfs" not in checkout
    assert "(models/mine) is in this repository: the checkout brings it" in text
    text, checkout, gate = project("lfs", "*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    assert checkout["lfs"] is True and checkout["persist-credentials"] is False and "model-cache-path" not in gate

    clone = tmp_path / "clone"
    shutil.copytree(fake_model, clone / "models" / "hub")
    subprocess.run(["git", "init", "-q", str(clone / "models" / "hub")], check=True)  # `git clone` of a Hub repo
    inline_cli("init", "--dir", clone, "--model", clone / "models" / "hub", "--engine-extra", FAKE, "--no-survey", check=0)
    text, checkout, gate = workflow(clone)
    assert "(models/hub) is a git clone of its own" in text and "is in this repository" not in text


def test_a_server_without_served_model_is_asked_for_its_one_model(inline_cli, tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    served = {"data": [{"id": "my-model", "object": "model"}]}

    class Models(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            data = json.dumps(served if self.path == "/v1/models" else {}).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        inline_cli("init", "--dir", tmp_path / "one", "--url", url + "/v1", "--no-survey", check=0)
        engine = tomllib.loads((tmp_path / "one" / "evalgate.toml").read_text())["engine"]
        assert engine == {"kind": "openai", "base_url": url + "/v1", "served_model": "my-model"}
        served["data"].append({"id": "other"})
        proc = inline_cli("init", "--dir", tmp_path / "two", "--url", url, "--no-survey", check=2)
        assert "serves 2 models (my-model, other)" in proc.stderr and "--served-model" in proc.stderr
        assert not (tmp_path / "two").exists()
    finally:
        server.shutdown()
        server.server_close()
