"""GitHub Actions: a Markdown job summary and `::error` annotations (docs/ci.md).

Pure functions build the text (report -> str) so it can be checked byte for byte; `publish` is the only
side effect: when `GITHUB_ACTIONS=true` it appends the summary to the file named by `$GITHUB_STEP_SUMMARY`
and prints the annotations to stdout, where the runner picks up workflow commands.

Escaping follows GitHub's runner (actions/toolkit `command.ts`): in a command's message (data) `%`, CR and
LF become `%25`, `%0D`, `%0A`; in its properties (`file`, `line`, `title`) also `:` and `,` become `%3A`
and `%2C`. In the Markdown summary, untrusted text (request keys, token texts, change descriptions) is
shown literally: control characters as escapes, Markdown and HTML punctuation backslash-escaped.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterable, Mapping, TextIO

from ..judgement.report import Report
from ..judgement.verdict import VERDICTS, RequestVerdict
from .explain import (
    ACROSS_WORDS,
    STACK_NAMES,
    class_lines,
    delta_text,
    divergence_tokens,
    factor_lines,
    gate_lines,
    hardware_lines,
    invariance,
    is_failure,
    margin_text,
    metric_failure_line,
    number_text,
    one_line,
    paired_text,
    prompt_lines,
    request_label,
    split_location,
    why,
)

MAX_SUMMARY_ROWS = 20
MAX_ANNOTATIONS = 50  # GitHub shows at most 10 error annotations per step and 50 per job


# --- workflow commands ----------------------------------------------------------------------------------

def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(command: str, message: str, **properties: str | int | None) -> str:
    props = ",".join(f"{name}={escape_property(str(value))}" for name, value in properties.items()
                     if value is not None and value != "")
    return f"::{command}{' ' + props if props else ''}::{escape_data(message)}"


def relative_path(path: str, bases: Iterable[str | Path]) -> str:
    """`path` relative to the first base it lies under (GITHUB_WORKSPACE, then the working directory),
    with `/` separators, so GitHub can match it to a file of the repository; else unchanged."""
    p = Path(path)
    for base in bases:
        if not base:
            continue
        for candidate in dict.fromkeys((Path(base), Path(base).resolve())):  # the workspace may be a symlink
            try:
                return p.relative_to(candidate).as_posix()
            except ValueError:
                continue
    return path


def annotation(v: RequestVerdict, bases: Iterable[str | Path] = ()) -> str:
    """`::error file=prompts.jsonl,line=3,title=evalgate batch_variance: q1::batch_variance at token 4 ...`"""
    path, line = split_location(v.location)
    return workflow_command(
        "error", one_line(v), file=relative_path(path, bases) if path else None, line=line,
        title=f"evalgate {v.verdict}: {v.key}",
    )


def annotations(report: Report, bases: Iterable[str | Path] = (), limit: int = MAX_ANNOTATIONS) -> str:
    """One `::error` line per failing request (at most `limit`, then a `::warning` saying how many more)."""
    bases = list(bases)
    failing = report.failing
    lines = [annotation(v, bases) for v in failing[:limit]]
    if len(failing) > limit:
        lines.append(workflow_command(
            "warning", f"{len(failing) - limit} more failing request(s) not annotated: see the job summary or the "
                       "JSON report", title="evalgate"))
    return "".join(line + "\n" for line in lines)


def infra_annotation(message: str) -> str:
    return workflow_command("error", message, title="evalgate: engine or infrastructure error (exit 3)") + "\n"


# --- the Markdown job summary ---------------------------------------------------------------------------

_MD_SPECIAL = set("\\`*_[]<>|~&#!")
_CONTROL_NAMES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def md_text(text: str) -> str:
    """Untrusted text shown literally in Markdown (also inside a table cell): control characters become
    visible escapes (so a cell stays on one line), Markdown/HTML punctuation is backslash-escaped."""
    out = []
    for c in text:
        if c in _CONTROL_NAMES:
            c = _CONTROL_NAMES[c]
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            c = f"\\x{ord(c):02x}"
        out.append("".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in c))
    return "".join(out)


def _ordered_differences(report: Report) -> list[RequestVerdict]:
    """Failing requests first (report order), then the other non-stable ones."""
    differing = [v for v in report.verdicts if v.verdict != "stable"]
    failing = [v for v in differing if is_failure(v.verdict, report.strict)]
    return failing + [v for v in differing if not is_failure(v.verdict, report.strict)]


def step_summary(report: Report, max_rows: int = MAX_SUMMARY_ROWS) -> str:
    """The Markdown appended to `$GITHUB_STEP_SUMMARY` for one `check` / `baseline create`."""
    passed = not report.failing and not report.failing_metrics
    lines = [f"## evalgate {report.kind}: {'PASS' if passed else 'FAIL'}", ""]
    against = f" against baseline run {report.baseline_run_id}" if report.baseline_run_id is not None else ""
    strict = " (strict)" if report.strict else ""
    lines += [f"Suite **{md_text(report.suite_name)}**, run {report.run_id}{against}{strict}: "
              f"exit {int(report.exit_code)}.", ""]
    lines += [f"**batch invariance:** {md_text(invariance(report.batch_invariance)[1])}", ""]
    if report.baseline_run_id is not None:
        if report.changed_components:
            lines.append(f"**changed since baseline run {report.baseline_run_id}:** "
                         f"{', '.join(report.changed_components)}")
            lines.append("")
            for name in report.changed_components:
                change = report.fingerprint_changes.get(name)
                lines.append(f"- {name}" + (f": {md_text(change)}" if change else ""))
        else:
            lines.append(f"**identity unchanged** since baseline run {report.baseline_run_id} ({STACK_NAMES})")
        lines.append("")
    prompts = prompt_lines(report)
    if prompts:
        lines += [*(f"- {md_text(line)}" for line in prompts), ""]
    if report.kind == "baseline":
        lines += [f"Run {report.run_id} is now the baseline for this hardware." if report.promoted else
                  f"Run {report.run_id} was **NOT promoted** to baseline: its passes disagree.", ""]

    lines += ["| verdict | requests |", "|---|---:|"]
    counts = report.counts
    for name in VERDICTS:
        fails = counts[name] and is_failure(name, report.strict)
        lines.append(f"| {'**' + name + '**' if fails else name} | {counts[name]} |")
    lines.append("")
    factors = factor_lines(report.factors, report.cache_hits, report.not_run, report.alone_coverage, report.kind)
    factors += gate_lines(report.differences())
    factors += hardware_lines(report.hardware) + class_lines(report.classes)
    if factors:
        lines += [f"- {md_text(line.strip())}" for line in factors] + [""]

    differing = _ordered_differences(report)
    if differing:
        lines += ["### Differing requests", "",
                  "| request | verdict | class | position | reference token | current token | margin | why |",
                  "|---|---|---|---:|---|---|---:|---|"]
        for v in differing[:max_rows]:
            d = v.divergence
            ref, cur = divergence_tokens(d) if d is not None else ("", "")
            verdict = f"**{v.verdict}**" if is_failure(v.verdict, report.strict) else v.verdict
            cells = [md_text(request_label(v)), verdict, ACROSS_WORDS.get(v.difference_class or "", ""),
                     "" if d is None else str(d.position), md_text(ref), md_text(cur),
                     margin_text(d.margin if d else None), md_text(why(v))]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        if len(differing) > max_rows:
            lines += [f"... and {len(differing) - max_rows} more (see the JSON report or `evalgate report --html`)",
                      ""]
    if report.metrics:
        lines += _metrics_markdown(report)
    if report.failing:
        names = sorted({v.verdict for v in report.failing})
        lines += [f"**FAIL**: {len(report.failing)} request(s): {', '.join(names)} (exit {int(report.exit_code)})",
                  ""]
    metrics_failed = metric_failure_line(report)
    if metrics_failed:
        lines += [f"**FAIL**: {md_text(metrics_failed)} (fail_on_metric, exit {int(report.exit_code)})", ""]
    return "\n".join(lines)


def _metrics_markdown(report: Report) -> list[str]:
    """lm-eval metrics, baseline vs current, with how many documents moved each one."""
    lines = ["### Task metrics (lm-eval)", "",
             "| task | metric | baseline | current | delta | documents moved | did it move? |",
             "|---|---|---:|---:|---:|---:|---|"]
    for row in report.metrics:
        delta = row.delta
        paired = paired_text(row.paired)
        lines.append(f"| {md_text(row.task)} | {md_text(row.metric)} | {number_text(row.baseline)} "
                     f"| {number_text(row.current)} | {delta_text(delta)} | {len(row.moved) or ''} "
                     f"| {md_text(paired)} |")
    lines.append("")
    for name, change in report.task_changes.items():
        lines.append(f"- task `{md_text(name)}` changed since the baseline: {md_text(change)}")
    return lines + ([""] if report.task_changes else [])


def infra_summary(kind: str, message: str) -> str:
    """The summary of a run that could not be judged (exit 3)."""
    body = "\n".join(f"    {line}" for line in message.rstrip("\n").splitlines()) or "    (no message)"
    return (f"## evalgate {kind}: ERROR\n\nThe run could not be judged: engine or infrastructure error "
            f"(exit 3). No verdict.\n\n{body}\n\n")


# --- the side effect ------------------------------------------------------------------------------------

def on_github(environ: Mapping[str, str] | None = None) -> bool:
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def _bases(environ: Mapping[str, str]) -> list[str]:
    return [environ.get("GITHUB_WORKSPACE", ""), os.getcwd()]


def append_summary(text: str, environ: Mapping[str, str] | None = None) -> None:
    """Append Markdown to the job summary (`$GITHUB_STEP_SUMMARY`; nothing when it is not set)."""
    environ = os.environ if environ is None else environ
    path = environ.get("GITHUB_STEP_SUMMARY")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)


def publish(report: Report, *, environ: Mapping[str, str] | None = None, out: TextIO | None = None) -> bool:
    """On GitHub Actions: append the summary and print the annotations. Returns whether it did."""
    environ = os.environ if environ is None else environ
    if not on_github(environ):
        return False
    append_summary(step_summary(report), environ)
    out = out or sys.stdout
    out.write(annotations(report, _bases(environ)))
    out.flush()
    return True


def publish_infra_error(kind: str, message: str, *, environ: Mapping[str, str] | None = None,
                        out: TextIO | None = None) -> bool:
    environ = os.environ if environ is None else environ
    if not on_github(environ):
        return False
    append_summary(infra_summary(kind, message), environ)
    out = out or sys.stdout
    out.write(infra_annotation(message))
    out.flush()
    return True
