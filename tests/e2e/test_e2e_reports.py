"""CI reports end to end (docs/ci.md): the real CLI on the fake test engine (the reports render what the
gate decides; evalgate/engines/fake.py), as a GitHub Actions job would run them. A baseline, then new
weights at the same path and `check --strict`: the JUnit file, the JSON report, the job summary and the
`::error` annotations must agree; then `evalgate report` writes the HTML page, which headless Chromium
renders with the first divergence highlighted, no console error and no network request."""

from __future__ import annotations

import json
import re
import shutil
import struct
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import CLI, chromium, read_json, run_chromium, write_suite

pytestmark = pytest.mark.e2e

PROMPTS = [f"Prompt number {i}: the quick brown fox and the {w}" for i, w in
           enumerate(["dog", "cat", "river", "city", "answer", "model"])]


def console_lines(stderr: str) -> list[str]:
    """Messages from the page's console (errors, CSP violations) in Chromium's log."""
    return [line for line in stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]


def page_requests(netlog: Path) -> list[str]:
    """URLs the page asked the network stack for: URL requests with an origin as initiator (the browser's own
    background requests have none, "not an origin")."""
    text = netlog.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:  # a log cut short at exit lacks its closing brackets
        data = json.loads(text.rstrip().rstrip(",") + "]}")
    types = {code: name for name, code in data["constants"]["logEventTypes"].items()}
    urls = []
    for event in data.get("events", []):
        params = event.get("params") or {}
        if types.get(event.get("type")) == "URL_REQUEST_START_JOB" and params.get("url"):
            if params.get("initiator") != "not an origin" and not params["url"].startswith("file:"):
                urls.append(params["url"])
    return urls


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


def test_ci_reports_after_a_weight_swap(cli_env, tmp_path, tiny_model):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    suite = write_suite(tmp_path / "ws", model, PROMPTS, concurrency=(1, 4), shuffles=0, kind="fake")
    summary = tmp_path / "step-summary.md"
    summary.write_text("", encoding="utf-8")
    gh = CLI({**cli_env, "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary),
              "GITHUB_WORKSPACE": str(tmp_path)}, tmp_path)

    created = gh("baseline", "create", suite, "--junit", tmp_path / "create.xml", check=0)
    root = ET.parse(tmp_path / "create.xml").getroot()
    assert root.tag == "testsuites"
    (testsuite,) = root.findall("testsuite")
    assert testsuite.get("name") == "prompts.jsonl"
    assert (testsuite.get("tests"), testsuite.get("failures"), testsuite.get("errors")) == (str(len(PROMPTS)), "0", "0")
    assert [c.get("name") for c in testsuite.iter("testcase")] == [f"p{i:03d}" for i in range(len(PROMPTS))]
    assert "::error" not in created.stdout
    assert summary.read_text(encoding="utf-8").startswith("## evalgate baseline: PASS\n")

    gh("build-model", model, "--seed", "1", check=0)  # same path, other weights
    checked = gh("check", suite, "--strict", "--junit", tmp_path / "j.xml", "--json-report", tmp_path / "r.json",
                 check=1)
    report = read_json(tmp_path / "r.json")
    explained = [r for r in report["requests"] if r["verdict"] == "explained_change"]
    n = report["counts"]["explained_change"]
    assert n == len(explained) >= 1 and report["changed_components"] == ["model"]
    assert report["counts"]["silent_regression"] == report["counts"]["batch_variance"] == 0

    # JUnit: a failure per explained change (strict), every request a testcase
    root = ET.parse(tmp_path / "j.xml").getroot()
    (testsuite,) = root.findall("testsuite")
    assert (testsuite.get("tests"), testsuite.get("failures"), testsuite.get("errors"), testsuite.get("skipped")) == (
        str(len(PROMPTS)), str(n), "0", "0")
    failed = {c.get("name"): c.find("failure") for c in testsuite.iter("testcase") if c.find("failure") is not None}
    assert set(failed) == {r["key"] for r in explained}
    for r in explained:
        failure, d = failed[r["key"]], r["divergence"]
        assert failure.get("type") == "explained_change"
        assert f"first divergence: token {d['position']} ({d['kind']})" in failure.text
        assert f"reference token: {d['reference_id']} {d['reference_text']!r}" in failure.text
        assert "changed components: model\n  model: files changed: " in failure.text

    # the job summary: the baseline's, then the check's
    text = summary.read_text(encoding="utf-8")
    check_part = text[text.index("## evalgate check: FAIL\n"):]
    assert "Suite **test**, run 2 against baseline run 1 (strict): exit 1." in check_part
    assert "**changed since baseline run 1:** model" in check_part
    assert f"| **explained_change** | {n} |" in check_part and f"| stable | {len(PROMPTS) - n} |" in check_part
    assert check_part.count("| **explained_change** | ") == n + 1  # the count row and one row per request

    # annotations: one per failing request, at its prompts-file line, relative to the workspace
    errors = [line for line in checked.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == n
    prompt_lines = (tmp_path / "ws" / "prompts.jsonl").read_text(encoding="utf-8").splitlines()
    for r, line in zip(explained, errors):
        number = int(r["location"].rsplit(":", 1)[1])
        assert line.startswith(f"::error file=ws/prompts.jsonl,line={number},"
                               f"title=evalgate explained_change%3A {r['key']}::explained_change at token "
                               f"{r['divergence']['position']} (")
        assert json.loads(prompt_lines[number - 1])["id"] == r["key"]  # the line holds that request

    # the HTML page of the check run, and --latest naming the same run
    out = tmp_path / "out" / "report.html"
    gh("report", "2", "--html", out, "--suite", suite, check=0)
    gh("report", "--latest", "--html", tmp_path / "latest.html", "--suite", suite, check=0)
    html = out.read_text(encoding="utf-8")
    assert (tmp_path / "latest.html").read_text(encoding="utf-8") == html
    assert "default-src &#39;none&#39;; style-src &#39;unsafe-inline&#39;" in html
    assert not re.search(r"https?://|src=", html)
    assert html.count('<section class="request') == n
    assert "files changed: " in html and "model.safetensors" in html

    exe = chromium()
    shot = tmp_path / "shot.png"
    shown = run_chromium(exe, tmp_path / "profile-1", out.as_uri(), f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.is_file() and shot.stat().st_size > 10_000
    assert png_size(shot) == (1280, 2000)
    netlog = tmp_path / "netlog.json"
    dumped = run_chromium(exe, tmp_path / "profile-2", out.as_uri(), "--dump-dom", f"--log-net-log={netlog}")
    dom = dumped.stdout
    # the divergent token highlighted on both sides of every differing request (or the end of a shorter output)
    assert len(re.findall(r'<span class="tok (?:end )?first-divergence" title="position \d+', dom)) == 2 * n
    assert "evalgate report: suite test, run 2" in dom
    # the history strip, parsed by the browser as SVG: runs 1 (baseline) and 2 (this one, outlined)
    strip = dom[dom.index('<svg class="history"'):dom.index("</svg>")]
    assert re.findall(r"<title>run (\d+) ", strip) == ["1", "2"] and strip.count('stroke="#000"') == 1
    assert console_lines(shown.stderr + dumped.stderr) == []
    assert page_requests(netlog) == []
