"""JUnit XML, in the shape pytest's `--junitxml` emits, for CI test reporters (docs/ci.md).

`<testsuites>` > one `<testsuite>` per prompts file (named by its path relative to the suite file) > one
`<testcase>` per request key. A request that fails the gate (batch_variance, silent_regression; with
`strict` also explained_change, new, missing) gets a `<failure>` whose message is one line and whose text
is the whole first divergence; every other request is a passing testcase. A run that could not be judged
(engine or infrastructure error, exit 3) is one testcase `evalgate` with an `<error>`.

Built with xml.etree.ElementTree, which escapes markup; characters XML 1.0 cannot carry at all (control
characters, U+FFFE/U+FFFF, lone surrogates) are written as `\\xNN` / `\\uNNNN` instead, as pytest does.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import OrderedDict, deque
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..atomic import write_text_atomic
from ..judgement.report import Report
from ..judgement.verdict import RequestVerdict
from .explain import delta_text, failure_text, number_text, one_line, paired_text, split_location

_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_safe(text: str) -> str:
    def escape(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _ILLEGAL_XML.sub(escape, text)


def _seconds(value: float | None) -> str:
    return f"{value or 0.0:.3f}"


def suite_label(prompts_file: str | None, suite_file: str | Path | None) -> str:
    """The testsuite name: the prompts file relative to the suite file's directory where it lies below it."""
    if not prompts_file:
        return "prompts"
    if suite_file is not None:
        base = Path(suite_file).parent
        try:
            return Path(prompts_file).relative_to(base).as_posix()
        except ValueError:
            pass
    return prompts_file


def _sub(parent: ET.Element, tag: str, **attrs: str) -> ET.Element:
    return ET.SubElement(parent, tag, {k: _xml_safe(v) for k, v in attrs.items()})


def _tostring(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def hardware_properties(report: Report) -> list[tuple[str, str]]:
    """A cross-hardware check's section as properties: the two classes, the counts, the envelope."""
    if report.hardware is None:
        return []
    h = report.hardware
    env = h.envelope or {}
    return [("baseline_hardware", h.baseline_label), ("hardware", h.here_label), ("other_hardware", h.mode),
            ("across_identical", h.identical), *((f"across_{name}", str(n)) for name, n in h.counts.items()),
            ("envelope_max", "" if env.get("max") is None else repr(env["max"])),
            ("envelope_p99", "" if env.get("p99") is None else repr(env["p99"])),
            ("tie_epsilon", repr(h.tolerance.epsilon)), ("drift_cap", repr(h.tolerance.cap))]


def metric_properties(report: Report) -> list[tuple[str, str]]:
    """The gate's metric policy, and each lm-eval metric with its delta and paired test, as properties."""
    if not report.metrics:
        return []
    props = [("metric_alpha", repr(report.policy.metric_alpha)), ("fail_on_metric", report.policy.fail_on_metric or "")]
    for m in report.metrics:
        delta = f" ({delta_text(m.delta)})" if m.delta is not None else ""
        props.append((f"metric {m.task} {m.metric}",
                      f"{number_text(m.current)}{delta}; {paired_text(m.paired)}".rstrip("; ")))
    return props


def prompt_properties(report: Report) -> list[tuple[str, str]]:
    """The pinned calendar and the rendered prompts compared with the baseline's, as properties."""
    props = []
    if report.template_date:
        props.append(("template_date", report.template_date.date))
    if report.prompts:
        props.append(("rendered_prompts_equal", f"{report.prompts.equal} of {report.prompts.compared}"))
    return props


def junit_xml(report: Report, *, suite_file: str | Path | None = None, duration: float | None = None,
              timestamp: str | None = None, hostname: str | None = None,
              requests: Iterable[tuple[str, str | None]] | None = None) -> str:
    """The report as a JUnit XML document (a str). `duration`: the run's wall time in seconds, put on the
    testsuite (testcases are judged together, so each says 0). `requests`: every request judged, (key,
    location) in order (`gate.judged_requests`), so the stable ones, which a report only counts, are
    testcases too; None: the report's verdicts alone."""
    groups: OrderedDict[str, list[RequestVerdict]] = OrderedDict()
    for v in report.verdicts if requests is None else every_verdict(report, requests):
        path, _ = split_location(v.location)
        groups.setdefault(suite_label(path, suite_file), []).append(v)

    root = ET.Element("testsuites", {"name": _xml_safe(f"evalgate {report.kind} {report.suite_name}")})
    totals = {"tests": 0, "failures": 0}
    failing_ids = {id(v) for v in report.failing}  # the policy decides (fail_on = "tokens": drift passes)
    for label, verdicts in groups.items():
        failing = [v for v in verdicts if id(v) in failing_ids]
        attrs = {"name": label, "errors": "0", "failures": str(len(failing)), "skipped": "0",
                 "tests": str(len(verdicts)), "time": _seconds(duration if len(groups) == 1 else None)}
        if timestamp:
            attrs["timestamp"] = timestamp
        if hostname:
            attrs["hostname"] = hostname
        suite_el = _sub(root, "testsuite", **attrs)
        props = _sub(suite_el, "properties")
        for name, value in (("suite", report.suite_name), ("kind", report.kind), ("run_id", str(report.run_id)),
                            ("baseline_run_id", "" if report.baseline_run_id is None else str(report.baseline_run_id)),
                            ("strict", str(report.strict).lower()), ("fail_on", report.policy.fail_on),
                            *hardware_properties(report), *metric_properties(report), *prompt_properties(report)):
            _sub(props, "property", name=name, value=value)
        for v in verdicts:
            case = _sub(suite_el, "testcase", classname=label, name=v.key, time="0.000")
            if id(v) in failing_ids:
                failure = _sub(case, "failure", message=one_line(v), type=v.verdict)
                failure.text = _xml_safe(failure_text(v, report.fingerprint_changes))
        totals["tests"] += len(verdicts)
        totals["failures"] += len(failing)
    if report.policy.fail_on_metric and report.metrics and report.baseline_run_id is not None:
        # the metrics can fail this run (fail_on_metric): a testcase each, so a reporter shows which did
        failing_metrics = {id(m) for m in report.failing_metrics}
        suite_el = _sub(root, "testsuite", name="lm-eval metrics", errors="0", failures=str(len(failing_metrics)),
                        skipped="0", tests=str(len(report.metrics)), time=_seconds(None))
        for m in report.metrics:
            case = _sub(suite_el, "testcase", classname="lm-eval metrics", name=f"{m.task} {m.metric}", time="0.000")
            if id(m) in failing_metrics:
                _sub(case, "failure", message=f"significantly worse: {paired_text(m.paired)}", type="significant_drop")
        totals["tests"] += len(report.metrics)
        totals["failures"] += len(failing_metrics)
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    root.set("skipped", "0")
    root.set("time", _seconds(duration))
    return _tostring(root)


def infra_error_xml(message: str, *, error_type: str = "EngineError", suite_name: str | None = None,
                    duration: float | None = None, timestamp: str | None = None) -> str:
    """The run failed before it could be judged (exit 3): one testcase `evalgate` with an `<error>`, so a
    CI test reporter shows an error instead of finding no results (which some treat as a pass)."""
    name = f"evalgate {suite_name}" if suite_name else "evalgate"
    root = ET.Element("testsuites", {"name": _xml_safe(name), "tests": "1", "failures": "0", "errors": "1",
                                     "skipped": "0", "time": _seconds(duration)})
    attrs = {"name": suite_name or "evalgate", "errors": "1", "failures": "0", "skipped": "0", "tests": "1",
             "time": _seconds(duration)}
    if timestamp:
        attrs["timestamp"] = timestamp
    suite_el = _sub(root, "testsuite", **attrs)
    case = _sub(suite_el, "testcase", classname="evalgate", name="evalgate", time=_seconds(duration))
    first = message.strip().splitlines()[0] if message.strip() else error_type
    error = _sub(case, "error", message=first, type=error_type)
    error.text = _xml_safe(message.rstrip("\n") + "\n")
    return _tostring(root)


def every_verdict(report: Report, requests: Iterable[tuple[str, str | None]]) -> Iterator[RequestVerdict]:
    """Each request's verdict in the order of `requests` (a stable one made from its key and location), then
    the report's verdicts of requests it does not name (missing ones). A key may come once per hardware class
    of a merged report: each of its verdicts is used once, in order."""
    differing: dict[str, deque[RequestVerdict]] = {}
    for v in report.verdicts:
        differing.setdefault(v.key, deque()).append(v)
    for key, location in requests:
        found = differing.get(key)
        yield found.popleft() if found else RequestVerdict(key, "stable", location)
    yield from (v for left in differing.values() for v in left)


def write_junit(report: Report, path: str | Path, **kwargs) -> None:
    write_text_atomic(path, junit_xml(report, **kwargs))


def write_infra_error(path: str | Path, message: str, **kwargs) -> None:
    write_text_atomic(path, infra_error_xml(message, **kwargs))
