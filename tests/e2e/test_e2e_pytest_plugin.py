"""The pytest plugin on real suites (real pytest in a subprocess): one test per request, failures carry the
token diff, infrastructure problems are errors, pytest's JUnit gates on it. The plugin only renders what
the gate decides, so it runs on the fake test engine (evalgate/engines/fake.py), whose batch-size effect on
chosen requests stands in for real batch variance (tests/e2e/test_e2e_gate.py produces that on vLLM)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from helpers import GREEN_PROMPTS, variance_prompts, write_suite

pytestmark = pytest.mark.e2e


def run_pytest(cli, *args):
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *map(str, args)],
                          cwd=cli.cwd, env=cli.env, capture_output=True, text=True, timeout=900)


def junit(path):
    suite = ET.parse(path).getroot().find("testsuite")
    return suite, {case.get("name"): case for case in suite.iter("testcase")}


def test_plugin_passes_then_errors_without_baseline(cli, tmp_path, tiny_model):
    prompts = GREEN_PROMPTS[:8]
    suite = write_suite(tmp_path / "ws", tiny_model, prompts, concurrency=(1, 8), shuffles=0, kind="fake")

    # no baseline yet: every request is a pytest error (not a failure)
    proc = run_pytest(cli, "--evalgate", suite, "--junitxml", tmp_path / "none.xml")
    assert proc.returncode == 1, proc.stdout[-3000:]
    root, cases = junit(tmp_path / "none.xml")
    assert root.get("errors") == str(len(prompts)) and root.get("failures") == "0"
    assert "no baseline" in cases["p000"].find("error").get("message") + cases["p000"].find("error").text

    cli("baseline", "create", suite, check=0)
    proc = run_pytest(cli, "--evalgate", suite, "--junitxml", tmp_path / "pass.xml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{len(prompts)} passed" in proc.stdout
    root, cases = junit(tmp_path / "pass.xml")
    assert sorted(cases) == [f"p{i:03d}" for i in range(len(prompts))]
    assert root.get("tests") == str(len(prompts)) and root.get("failures") == "0" and root.get("errors") == "0"


def test_plugin_fails_batch_variance_with_the_token_diff(cli, tmp_path, tiny_model):
    n = len(variance_prompts())
    suite = write_suite(tmp_path / "ws", tiny_model, variance_prompts(), max_tokens=32, concurrency=(1,), shuffles=0,
                        name="variance", kind="fake", extra_engine='fake_vary_with_batch = ["p003", "p017"]')
    cli("baseline", "create", suite, check=0)
    proc = run_pytest(cli, "--evalgate", suite, "--evalgate-concurrency", f"1,{n}", "--junitxml", tmp_path / "j.xml")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    root, cases = junit(tmp_path / "j.xml")
    failed = {name: case.find("failure") for name, case in cases.items() if case.find("failure") is not None}
    assert sorted(failed) == ["p003", "p017"]
    assert root.get("failures") == str(len(failed)) and root.get("errors") == "0"
    assert int(root.get("tests")) == n
    text = next(iter(failed.values())).text
    assert "batch_variance" in text and "first divergence: token" in text and "reference token:" in text
    assert f"passes: pass 0 (concurrency 1) vs pass 2 (concurrency {n})" in text  # pass 1: the hot pass
    assert "factor: batch_size" in text
    assert "batch_variance" in proc.stdout and "first divergence" in proc.stdout


def test_a_suite_that_does_not_load_is_a_usage_error(cli, tmp_path, fake_model):
    """The suite's own message and fix, as pytest's usage error (exit 4) before any test: never pytest's
    INTERNALERROR traceback, which reads as a bug in the plugin."""
    suite = write_suite(tmp_path / "ws", fake_model, GREEN_PROMPTS[:2], kind="fake")
    suite.write_text(suite.read_text().replace("max_tokens = 16", 'max_tokens = "16"'))
    for path, message in [(suite, "`sampling.max_tokens` must be an integer"), (tmp_path / "none.toml", "suite file not found")]:
        proc = run_pytest(cli, "--evalgate", path)
        assert proc.returncode == 4 and "INTERNALERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
        assert f"ERROR: --evalgate {path}: " in proc.stderr and message in proc.stderr and "fix: " in proc.stderr
    suite.write_text(suite.read_text().replace('max_tokens = "16"', "max_tokens = 16"))
    proc = run_pytest(cli, "--evalgate", suite, "--evalgate-concurrency", "1,x")
    assert proc.returncode == 4 and "ERROR: --evalgate-concurrency '1,x': expected comma-separated positive" in proc.stderr
