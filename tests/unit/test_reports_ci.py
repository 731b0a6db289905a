"""CI renderings of a report (docs/ci.md), on a Report built by hand: the GitHub step summary and
annotations byte for byte (escaping included), the JUnit XML shape pytest emits, the infra-error JUnit,
and the self-contained HTML page. No engine; one CLI call (an unreachable database: exit 3 in ~1 s)."""

from __future__ import annotations

import io
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import is_dataclass, replace

import pytest

from evalgate.codec import to_json
from evalgate.judgement.compare import Divergence
from evalgate.judgement.paired import PairedTest
from evalgate.judgement.report import BatchInvariance, Report
from evalgate.judgement.scores import MetricRow
from evalgate.judgement.verdict import CacheHits, FactorRow, RequestVerdict
from evalgate.records import Completion
from evalgate.reports import github
from evalgate.reports.html import RequestDiff, Side, render_html
from evalgate.reports.junit import infra_error_xml, junit_xml
from evalgate.store import Run

NASTY = "caps%:,\r\n<&\"'\U0001F980"  # percent, CR, LF, colon, comma, markup, quotes, an emoji
WS = "/ci/work"  # the workspace (GITHUB_WORKSPACE)
DIR = "a,b:c %d"  # a directory name that needs escaping as an annotation property
PROMPTS = f"{WS}/{DIR}/prompts.jsonl"
CHANGES = {"model": "files changed: model.safetensors"}


def sample(strict: bool = False) -> Report:
    verdicts = [
        RequestVerdict("ok", "stable", f"{PROMPTS}:1"),
        RequestVerdict(NASTY, "batch_variance", f"{PROMPTS}:2",
                       Divergence(3, "token", 9822, " Paris", 1234, " <the> & \"x\"", 0.0009765625, -0.6928, -0.6918),
                       passes={"reference_pass": 0, "reference_concurrency": 1, "other_pass": 2,
                               "other_concurrency": 16, "differing_passes": 1, "total_passes": 3,
                               "factors": ["batch_size"]}, factor="batch_size"),
        RequestVerdict("story, 1: *bold* | pipe", "silent_regression", f"{PROMPTS}:3",
                       Divergence(2, "logprob", 315, "\n", 315, "\n", 2.53125, -0.078125, -0.078125000000001)),
        RequestVerdict("explained \u00e9", "explained_change", f"{PROMPTS}:4",
                       Divergence(5, "length", None, None, 42, "\U0001F642", None), components=["model", "suite"]),
        RequestVerdict("new-one", "new", f"{PROMPTS}:5", components=["suite"]),
        RequestVerdict("gone", "missing", f"{PROMPTS}:9", components=["suite"]),
    ]
    return Report(kind="check", suite_name="smoke <1> & co", run_id=7, baseline_run_id=3, verdicts=verdicts,
                  changed_components=["model"],
                  batch_invariance=BatchInvariance(True, False, "not available on cpu"),
                  strict=strict, factors=[
                      FactorRow("prefix_cache", "prefix cache cold→hot", 0, 1, differing=0, requests=4, keys=[]),
                      FactorRow("batch_size", "batch size 1→16", 0, 2, differing=1, requests=4, keys=[NASTY])],
                  cache_hits=[CacheHits(1, hit=3, missed=1, unknown=0)], fingerprint_changes=CHANGES)


# --- GitHub: workflow commands ----------------------------------------------------------------------------

def test_escaping_follows_the_runner():
    assert github.escape_data("100% a:b,c\r\nd") == "100%25 a:b,c%0D%0Ad"
    assert github.escape_property("100% a:b,c\r\nd") == "100%25 a%3Ab%2Cc%0D%0Ad"
    assert github.escape_data("%0A") == "%250A"  # a literal "%0A" must not turn into a newline


EXPECTED_ANNOTATIONS = (
    r"""::error file=a%2Cb%3Ac %25d/prompts.jsonl,line=2,title=evalgate batch_variance%3A caps%25%3A%2C%0D%0A<&"'🦀::"""
    r"""batch_variance at token 3 (token): reference 9822 ' Paris', current 1234 ' <the> & "x"' (margin 0.0009766); """
    r"""batch size: pass 0 (c=1) vs pass 2 (c=16); 1/2 comparisons differ""" "\n"
    r"""::error file=a%2Cb%3Ac %25d/prompts.jsonl,line=3,title=evalgate silent_regression%3A story%2C 1%3A *bold* | pipe::"""
    r"""silent_regression at token 2 (logprob): reference 315 '\n' lp=-0.078125, current 315 '\n' """
    r"""lp=-0.078125000000001 (margin 2.531); nothing changed""" "\n"
)


def test_annotations_byte_for_byte():
    assert github.annotations(sample(), [WS]) == EXPECTED_ANNOTATIONS


def test_annotations_strict_outside_the_workspace_and_capped():
    text = github.annotations(sample(strict=True), ["/elsewhere"], limit=3)
    lines = text.splitlines()
    assert len(lines) == 4 and text.endswith("\n")
    # not under any base: the absolute path, escaped as a property
    assert lines[0].startswith("::error file=/ci/work/a%2Cb%3Ac %25d/prompts.jsonl,line=2,title=")
    assert lines[2] == ("::error file=/ci/work/a%2Cb%3Ac %25d/prompts.jsonl,line=4,title=evalgate explained_change%3A "
                        "explained é::explained_change at token 5 (length): reference (end), current 42 '🙂'; model, suite")
    assert lines[3] == ("::warning title=evalgate::2 more failing request(s) not annotated: see the job summary or "
                        "the JSON report")


def test_infra_annotation_escapes_the_message():
    assert github.infra_annotation("db: 100% down\r\nline, two") == (
        "::error title=evalgate%3A engine or infrastructure error (exit 3)::db: 100%25 down%0D%0Aline, two\n")


# --- GitHub: the step summary -------------------------------------------------------------------------------

EXPECTED_SUMMARY = r"""## evalgate check: FAIL

Suite **smoke \<1\> \& co**, run 7 against baseline run 3: exit 1.

**batch invariance:** requested, NOT in force: not available on cpu

**changed since baseline run 3:** model

- model: files changed: model.safetensors

- changed in the suite itself: 1 differing request (the request's own text, sampling or lm-eval task: explained by \`suite\`)

| verdict | requests |
|---|---:|
| stable | 1 |
| **batch_variance** | 1 |
| **silent_regression** | 1 |
| explained_change | 1 |
| new | 1 |
| missing | 1 |

- invariant under: prefix cache cold→hot
- varies under: batch size 1→16 (1 request)
- batch size: removed by batch invariance (batch\_invariant = true: vLLM's kernels on CUDA/ROCm/XPU, evalgate's on CPU) or engine.max\_num\_seqs = 1
- hot pass 1: 3 of 4 requests were served from the prefix cache; 1 was not (a prompt shorter than one cache block is never cached), so for those the hot pass is a repeat
- gate: fail on bits (any difference fails, down to one logprob bit)

### Differing requests

| request | verdict | class | position | reference token | current token | margin | why |
|---|---|---|---:|---|---|---:|---|
| caps%:,\\r\\n\<\&"'🦀 | **batch_variance** |  | 3 | 9822 ' Paris' | 1234 ' \<the\> \& "x"' | 0.0009766 | batch size: pass 0 (c=1) vs pass 2 (c=16); 1/2 comparisons differ |
| story, 1: \*bold\* \| pipe | **silent_regression** |  | 2 | 315 '\\n' lp=-0.078125 | 315 '\\n' lp=-0.078125000000001 | 2.531 | nothing changed |
| explained é | explained_change |  | 5 | (end) | 42 '🙂' |  | model, suite |
| new-one | new |  |  |  |  |  | suite |
| gone | missing |  |  |  |  |  | suite |

**FAIL**: 2 request(s): batch_variance, silent_regression (exit 1)
"""


def test_step_summary_byte_for_byte():
    assert github.step_summary(sample()) == EXPECTED_SUMMARY


def test_step_summary_truncates_and_orders_failures_first():
    report = sample(strict=True)
    text = github.step_summary(report, max_rows=2)
    assert text.startswith("## evalgate check: FAIL\n\nSuite **smoke \\<1\\> \\& co**, run 7 against baseline run 3 "
                           "(strict): exit 1.\n")
    rows = text.split("|---|---|---|---:|---|---|---:|---|\n")[1].split("\n\n")[0].splitlines()
    assert len(rows) == 2
    assert rows[0].startswith("| caps%") and "| **batch_variance** |" in rows[0]
    assert rows[1].startswith("| story, 1") and "| **silent_regression** |" in rows[1]
    assert "\n... and 3 more (see the JSON report or `evalgate report --html`)\n" in text
    assert "| **explained_change** | 1 |" in text  # strict: explained changes count as failures
    assert text.endswith("**FAIL**: 5 request(s): batch_variance, explained_change, missing, new, "
                         "silent_regression (exit 1)\n")


def test_step_summary_pass_without_changes():
    report = Report(kind="baseline", suite_name="s", run_id=1, baseline_run_id=None,
                    verdicts=[RequestVerdict("a", "stable", "/x/p.jsonl:1")], changed_components=[],
                    batch_invariance=BatchInvariance(True, True, ""), promoted=True)
    assert github.step_summary(report) == (
        "## evalgate baseline: PASS\n\nSuite **s**, run 1: exit 0.\n\n"
        "**batch invariance:** in force (VLLM\\_BATCH\\_INVARIANT=1)\n\n"
        "Run 1 is now the baseline for this hardware.\n\n"
        "| verdict | requests |\n|---|---:|\n| stable | 1 |\n| batch_variance | 0 |\n| silent_regression | 0 |\n"
        "| explained_change | 0 |\n| new | 0 |\n| missing | 0 |\n\n"
        # no factor rows: the run compared no passes, which a one-pass schedule's `stable` must not hide
        "- passes compared: none (the schedule ran one pass): batch variance was not judged; add a concurrency "
        "level, a shuffle or \\`hot\\_pass = true\\` to \\[schedule\\]\n"
        "- gate: fail on bits (any difference fails, down to one logprob bit)\n")
    assert github.annotations(report) == ""


def test_publish_only_on_github(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n", encoding="utf-8")
    out = io.StringIO()
    env = {"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary), "GITHUB_WORKSPACE": WS}
    assert github.publish(sample(), environ=env, out=out) is True
    assert summary.read_text(encoding="utf-8") == "earlier step\n" + EXPECTED_SUMMARY  # appended, not replaced
    assert out.getvalue() == EXPECTED_ANNOTATIONS
    quiet = io.StringIO()
    assert github.publish(sample(), environ={"GITHUB_STEP_SUMMARY": str(summary)}, out=quiet) is False
    assert quiet.getvalue() == "" and summary.read_text(encoding="utf-8") == "earlier step\n" + EXPECTED_SUMMARY


# --- JUnit --------------------------------------------------------------------------------------------------

def _cases(root: ET.Element) -> dict[str, ET.Element]:
    return {case.get("name"): case for case in root.iter("testcase")}


def test_junit_has_pytest_shape_and_counts():
    xml = junit_xml(sample(), suite_file=f"{WS}/{DIR}/evalgate.toml", duration=12.5)
    assert xml.startswith('<?xml version="1.0" encoding="utf-8"?>\n')
    root = ET.fromstring(xml.encode("utf-8"))
    assert root.tag == "testsuites"
    suites = root.findall("testsuite")
    assert len(suites) == 1
    suite = suites[0]
    for attr in ("name", "tests", "failures", "errors", "skipped", "time"):
        assert suite.get(attr) is not None, attr
    assert suite.get("name") == "prompts.jsonl"  # relative to the suite file
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("6", "2", "0", "0")
    assert suite.get("time") == "12.500"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("6", "2", "0")
    # names round-trip exactly: CR/LF, markup, quotes and the emoji included
    assert list(_cases(root)) == ["ok", NASTY, "story, 1: *bold* | pipe", "explained \u00e9", "new-one", "gone"]
    for case in root.iter("testcase"):
        assert case.get("classname") == "prompts.jsonl" and case.get("time") is not None
    failures = {case.get("name"): case.find("failure") for case in root.iter("testcase") if case.find("failure") is not None}
    assert sorted(f.get("type") for f in failures.values()) == ["batch_variance", "silent_regression"]
    assert all(f.get("message") for f in failures.values())
    assert root.find(".//error") is None and root.find(".//skipped") is None
    assert _cases(root)["ok"].find("failure") is None and _cases(root)["new-one"].find("failure") is None


def test_junit_failure_body_names_the_divergence():
    root = ET.fromstring(junit_xml(sample()))
    silent = _cases(root)["story, 1: *bold* | pipe"].find("failure")
    assert silent.get("message") == ("silent_regression at token 2 (logprob): reference 315 '\\n' lp=-0.078125, "
                                     "current 315 '\\n' lp=-0.078125000000001 (margin 2.531); nothing changed")
    body = silent.text
    assert "first divergence: token 2 (logprob)" in body
    assert "reference token: 315 '\\n' lp=-0.078125" in body and "margin: 2.531" in body
    assert f"location: {PROMPTS}:3" in body
    # attribute values keep markup, quotes and the emoji (escaped on write, restored on parse)
    variance = next(c for c in root.iter("testcase") if c.get("name", "").startswith("caps%:,"))
    failure = variance.find("failure")
    assert "1234 ' <the> & \"x\"'" in failure.get("message") and "🦀" in variance.get("name")
    assert "passes: pass 0 (concurrency 1) vs pass 2 (concurrency 16); 1 of 2 comparisons differ" in failure.text
    assert "factor: batch_size (batch size)" in failure.text and "removed by: batch invariance" in failure.text


def test_junit_strict_turns_explained_new_missing_into_failures():
    root = ET.fromstring(junit_xml(sample(strict=True)))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("6", "5")
    cases = _cases(root)
    explained = cases["explained \u00e9"].find("failure")
    assert explained.get("type") == "explained_change"
    assert "changed components: model, suite\n  model: files changed: model.safetensors" in explained.text
    assert cases["new-one"].find("failure").get("type") == "new"
    assert cases["gone"].find("failure").get("type") == "missing"
    assert cases["ok"].find("failure") is None


def test_junit_one_testsuite_per_prompts_file_and_illegal_xml_characters():
    verdicts = [RequestVerdict("a\x01b", "batch_variance", "/w/one.jsonl:1",
                               Divergence(0, "token", 1, "\x00", 2, "\x1b[0m", 0.5),
                               passes={"reference_pass": 0, "reference_concurrency": 1, "other_pass": 1,
                                       "other_concurrency": 8, "differing_passes": 1, "total_passes": 2}),
                RequestVerdict("b", "stable", "/w/sub/two.jsonl:4")]
    report = Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1, verdicts=verdicts,
                    changed_components=[])
    root = ET.fromstring(junit_xml(report, suite_file="/w/evalgate.toml"))  # would raise on a raw \x01
    assert [s.get("name") for s in root.findall("testsuite")] == ["one.jsonl", "sub/two.jsonl"]
    assert [s.get("failures") for s in root.findall("testsuite")] == ["1", "0"]
    assert [c.get("name") for c in root.iter("testcase")] == ["a\\x01b", "b"]


def test_junit_lists_every_judged_request_with_the_stable_ones_the_report_only_counts():
    """`requests` (gate.judged_requests: every judged request from the store) makes the stable ones testcases;
    a key judged on two hardware classes (a merged report) keeps both verdicts; missing ones come last."""
    bad = RequestVerdict("k", "silent_regression", "/w/p.jsonl:2")
    report = Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1, changed_components=[], stable=3,
                    verdicts=[bad, replace(bad, verdict="batch_variance"), RequestVerdict("gone", "missing", "/w/p.jsonl:3")])
    rows = [("a", "/w/p.jsonl:1"), ("k", "/w/p.jsonl:2"), ("a", "/w/p.jsonl:1"), ("k", "/w/p.jsonl:2")]  # two classes
    root = ET.fromstring(junit_xml(report, suite_file="/w/evalgate.toml", requests=iter(rows)))
    cases = list(root.iter("testcase"))
    assert [c.get("name") for c in cases] == ["a", "k", "a", "k", "gone"]
    assert [c.find("failure").get("type") if c.find("failure") is not None else None for c in cases] == [
        None, "silent_regression", None, "batch_variance", None]  # missing fails only under strict
    assert root.find("testsuite").get("tests") == "5" and root.find("testsuite").get("failures") == "2"


def test_infra_error_junit_is_one_error():
    root = ET.fromstring(infra_error_xml("engine died: <signal 9> & more\n  fix: rerun", error_type="EngineError",
                                         suite_name="smoke", duration=3.25))
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("1", "0", "1", "0")
    cases = list(root.iter("testcase"))
    assert len(cases) == 1 and cases[0].get("name") == "evalgate" and cases[0].get("classname") == "evalgate"
    errors = list(root.iter("error"))
    assert len(errors) == 1 and root.find(".//failure") is None
    assert errors[0].get("type") == "EngineError"
    assert errors[0].get("message") == "engine died: <signal 9> & more"
    assert errors[0].text == "engine died: <signal 9> & more\n  fix: rerun\n"


def test_cli_writes_infra_junit_and_summary_on_exit_3(tmp_path):
    """The CLI hook for real: an unreachable database server is an infrastructure error (exit 3) before any
    engine starts; CI still gets a JUnit file with one <error>, a job summary and an annotation."""
    pytest.importorskip("psycopg")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "prompt": "hi"}\n')
    suite = tmp_path / "evalgate.toml"
    suite.write_text(f'[suite]\nname = "infra"\n[engine]\nmodel = "{model}"\n[prompts]\nfile = "prompts.jsonl"\n')
    summary = tmp_path / "summary.md"
    env = {"PATH": "/usr/bin:/bin", "GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary),
           "EVALGATE_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "evalgate", "check", str(suite), "--db",
                           "postgresql+psycopg://evalgate@127.0.0.1:1/nothing", "--junit", str(tmp_path / "j.xml")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    root = ET.parse(tmp_path / "j.xml").getroot()
    assert (root.find("testsuite").get("name"), root.find("testsuite").get("errors")) == ("infra", "1")
    error = root.find(".//testcase[@name='evalgate']/error")
    assert error.get("type") == "StoreError" and "could not use the database server" in error.get("message")
    assert summary.read_text().startswith("## evalgate check: ERROR\n")
    assert "::error title=evalgate%3A engine or infrastructure error (exit 3)::" in proc.stdout


# --- HTML ---------------------------------------------------------------------------------------------------

def _completion(ids, texts, pass_index=0, concurrency=1):
    n = len(ids)
    return Completion(key="k", prompt_ids=[1], output_ids=ids, logprobs=[-0.5] * n, top_ids=[[i, 7] for i in ids],
                      top_logprobs=[[-0.5, -0.75]] * n, token_texts=texts, text="".join(texts),
                      finish_reason="length", pass_index=pass_index, concurrency=concurrency)


def run_row(**fields) -> Run:
    """A run row as the store holds it (not in any session: the page reads its attributes only)."""
    return Run(**{"id": 7, "suite_name": "s <&>", "kind": "check", "status": "complete", "verdict": "regression",
                  "exit_code": 1, "baseline_run_id": 3, **fields})


def test_html_page_is_self_contained_escaped_and_highlights_the_divergence():
    v = sample().verdicts[1]  # the batch_variance request with the nasty key
    ref = _completion([5, 9822, 6], [" A", " Paris", "<script>alert(1)</script>"])
    cur = _completion([5, 1234, 6], [" A", " <the> & \"x\"", "\n"], pass_index=2, concurrency=16)
    v = RequestVerdict(v.key, v.verdict, v.location, Divergence(1, "token", 9822, " Paris", 1234, " <the>", 0.25),
                       passes=v.passes)
    missing = RequestVerdict("gone", "missing", f"{PROMPTS}:9", components=["suite"])
    report = Report(kind="check", suite_name="s <&>", run_id=7, baseline_run_id=3, verdicts=[v, missing],
                    changed_components=["model"], stable=1,
                    batch_invariance=BatchInvariance(True, False, "cpu"),
                    fingerprint_changes={"model": "files changed: <w>.safetensors"})
    html = render_html(run_row(), report, [RequestDiff(v, "prompt <b>bold</b>", Side("reference: run 7, pass 0", ref),
                                                       Side("disagreeing pass: run 7, pass 2", cur)),
                                           RequestDiff(missing, None, Side("baseline", ref), Side("this run", None))])
    assert "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src &#39;none&#39;; style-src " \
           "&#39;unsafe-inline&#39;\">" in html
    assert "<script" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html and "src=" not in html
    assert "s &lt;&amp;&gt;" in html and "files changed: &lt;w&gt;.safetensors" in html
    assert "prompt &lt;b&gt;bold&lt;/b&gt;" in html
    # the divergent token, highlighted on both sides, with its id in the tooltip; the margin shown
    assert html.count('class="tok first-divergence"') == 2
    assert 'title="position 1 · id 9822 · text &#39; Paris&#39; · logprob -0.5 · margin 0.25">' in html
    assert ">↵</span>" in html  # a newline token made visible
    assert '<strong class="margin">0.25</strong>' in html
    assert html.count('class="tok same"') == 2 and html.count('class="tok after"') == 2
    assert "no output" in html  # the missing request has no current side
    assert '<span class="badge s-batch_variance">batch_variance</span>' in html  # named by what failed it
    assert '<td><span class="badge v-stable">stable</span></td><td class="num">1</td>' in html  # counted, not listed


def test_html_marks_the_end_of_a_shorter_output():
    ref = _completion([5, 6], [" a", " b"])
    cur = _completion([5, 6, 7], [" a", " b", " c"])
    v = RequestVerdict("k", "explained_change", "/p.jsonl:1", Divergence(2, "length", None, None, 7, " c", None),
                       components=["model"])
    report = Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1, verdicts=[v], changed_components=["model"],)
    html = render_html(run_row(id=2, suite_name="s", verdict="pass", exit_code=0, baseline_run_id=1), report,
                       [RequestDiff(v, "p", Side("b", ref), Side("c", cur))])
    assert '<span class="tok end first-divergence"' in html and ">(end)</span>" in html
    assert html.count(" first-divergence\"") == 2  # both sides (the CSS rule aside)


def test_html_of_a_run_that_was_never_judged_says_so():
    html = render_html(run_row(status="failed", verdict=None, exit_code=None, error="EngineError: <boom>"), None)
    assert "no verdicts: the run is failed" in html and "error: EngineError: &lt;boom&gt;" in html
    assert "never judged against baseline run 3" in html


def test_a_report_reads_back_as_it_was_written():
    """A stored report (to_dict) read back renders the same: every section, the counts of stable requests
    it does not list, the policy it was judged under."""
    import json

    from evalgate.configuration.policy import GatePolicy

    report = sample()
    verdicts = [replace(report.verdicts[0]), replace(report.verdicts[1], kinds=frozenset({"token", "logprob"})),
                replace(report.verdicts[2], kinds=frozenset({"logprob"})), *report.verdicts[3:]]
    report = replace(report, verdicts=verdicts, policy=GatePolicy(fail_on="tokens"),
                     metrics=[MetricRow("t", "acc", 0.5, 0.25, -0.25, moved=[])],
                     fingerprint_changes={"model": "files changed"}, hardware_class="abc",
                     hardware_label="x86_64 · AVX-512")
    again = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert again.to_dict() == report.to_dict()
    assert again.counts == report.counts and again.counts["stable"] == 1
    assert again.status == report.status and again.exit_code == report.exit_code
    assert [v.kinds for v in again.verdicts[:2]] == [frozenset({"token", "logprob"}), frozenset({"logprob"})]
    assert [v.bits_only for v in again.verdicts[:2]] == [False, True] and [len(x) for x in (again.failing, again.drift)] == [
        len(report.failing), len(report.drift)]
    def plain(sections):  # verdicts and the hardware section as their dicts (a frozenset's repr has no fixed order)
        return json.loads(json.dumps(sections, default=lambda o: to_json(o) if is_dataclass(o) else str(o)))

    assert plain(again.sections()) == plain(report.sections())


def test_terminal_report_suggests_the_bisector_for_each_kind_of_difference():
    from rich.console import Console

    from evalgate.reports.terminal import next_steps, render_report

    report = sample()
    assert next_steps(report) == [
        "next: evalgate bisect batch 7 " + shlex.quote(NASTY) + "   (which neighbours flip it)",
        "next: evalgate repro 7 'story, 1: *bold* | pipe' -o repro/   (a plain vLLM script that shows it)",
    ]  # the explained change is a model change: no setting or commit to bisect
    report = replace(report, changed_components=["env", "code"])
    assert next_steps(report)[2:] == [
        "next: evalgate bisect config 3 7   (which setting changed the outputs)",
        "next: evalgate bisect commits --good <baseline commit> --bad HEAD   (which commit)"]
    console = Console(record=True, width=200)
    render_report(console, report)
    assert "next: evalgate bisect config 3 7" in console.export_text()


def test_terminal_report_off_a_terminal_prints_one_line_per_differing_request():
    """CI logs are not terminals: a table wrapped at 80 columns is unreadable there, so each differing
    request is one unwrapped line; on a terminal it is a table. Logprobs are shown by what tells them apart."""
    from rich.console import Console

    from evalgate.reports.terminal import render_report

    plain = Console(file=io.StringIO(), width=80, force_terminal=False)
    render_report(plain, sample())
    text = plain.file.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("  story, 1")]
    assert lines == ["  story, 1: *bold* | pipe: silent_regression at token 2 (logprob): reference 315 '\\n' "
                     "lp=-0.078125, current 315 '\\n' lp=-0.078125 (Δ -1e-15) (margin 2.531); nothing changed"]
    assert "┃" not in text.split("differing requests:")[1]  # no table for the requests
    assert "-0.078125000000001" not in text  # 16 digits are for JSON, not people

    tty = Console(file=io.StringIO(), width=200, force_terminal=True)
    render_report(tty, sample())
    assert "differing requests" in tty.file.getvalue() and "┃" in tty.file.getvalue()


def test_off_a_terminal_nothing_is_broken_inside_a_word_and_long_lists_are_capped():
    """A CI log (no terminal, 80 columns): every request key, task and metric name whole on one line, the
    differing requests capped with "and N more: see the report"."""
    import io

    from rich.console import Console

    from evalgate.reports.terminal import MAX_LINES, render_report

    keys = [f"evalgate_capitals/{i}/{i % 4}/0" for i in range(50)]
    verdicts = [RequestVerdict(k, "explained_change", f"{PROMPTS}:{i}", Divergence(2, "token", 5, " a", 6, " b", 0.5),
                               components=["model"]) for i, k in enumerate(keys)]
    metrics = [MetricRow("evalgate_capitals_and_a_long_task_name", "exact_match,strip_and_more", 0.75, 0.5, -0.25,
                         paired=PairedTest("mcnemar_exact", 50, 0, 12, 0.00049, 0.05, True, "down", True))]
    report = Report(kind="check", suite_name="s", run_id=2, baseline_run_id=1, verdicts=verdicts,
                    changed_components=["model"], metrics=metrics)
    out = io.StringIO()
    render_report(Console(file=out, width=80, force_terminal=False, highlight=False), report)
    text = out.getvalue()
    shown = [k for k in keys if k in text]
    assert shown == keys[:MAX_LINES] and f"... and {50 - MAX_LINES} more: see the report" in text
    line = next(x for x in text.splitlines() if "evalgate_capitals_and_a_long_task_name" in x)
    assert "exact_match,strip_and_more: 0.75 -> 0.5 (-0.25)" in line and "0 up, 12 down of 50 documents" in line
