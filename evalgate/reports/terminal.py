"""Terminal rendering with rich: verdict counts, then one row per differing request."""

from __future__ import annotations

import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ..judgement.factors import remedies
from ..judgement.report import Report
from ..judgement.verdict import FAILURES, CacheHits, FactorRow
from .explain import (
    ACROSS_WORDS,
    batch_bisectable,
    class_lines,
    delta_text,
    divergence_tokens,
    factor_lines,
    gate_lines,
    hardware_lines,
    invariance,
    margin_text,
    metric_failure_line,
    number_text,
    one_line,
    paired_text,
    prompt_lines,
    request_label,
    why,
)

STYLE = {
    "stable": "green", "batch_variance": "bold red", "silent_regression": "bold red",
    "explained_change": "yellow", "new": "cyan", "missing": "cyan",
}
MAX_ROWS = 50
MAX_LINES = 20  # off a terminal (a CI log): the differing requests listed, then "and N more: see the report"


def render_report(console: Console, report: Report) -> None:
    state, words = invariance(report.batch_invariance)
    if state == "not_in_force":
        console.print(f"[yellow]batch invariance: {escape(words)}[/]")
    elif state == "in_force":
        console.print(f"[green]batch invariance: {escape(words)}[/]")

    if report.baseline_run_id is not None:
        if report.changed_components:
            console.print(f"changed since baseline run {report.baseline_run_id}: "
                          f"[yellow]{', '.join(report.changed_components)}[/]")
            for name, change in report.fingerprint_changes.items():
                console.print(f"  {name}: {change}")
        else:
            console.print(f"identity unchanged since baseline run {report.baseline_run_id} "
                          "(model, tokenizer, engine, code, hardware, env)")
    for line in prompt_lines(report):
        console.print(escape(line), style="yellow" if "differ" in line or "not pinned" in line else "", soft_wrap=True)

    counts = Table(title=f"{report.kind} run {report.run_id} — suite {report.suite_name!r}", title_justify="left")
    counts.add_column("verdict")
    counts.add_column("requests", justify="right")
    for name, n in report.counts.items():
        if n or name in ("stable",) + FAILURES:
            counts.add_row(Text(name, style=STYLE[name] if n else ""), str(n))
    console.print(counts)
    warn = ("varies", "  ", "not run", "passes compared: none")
    for line in factor_lines(report.factors, report.cache_hits, report.not_run, report.alone_coverage, report.kind):
        console.print(escape(line), style="yellow" if line.startswith(warn) else "", soft_wrap=True)
    for line in comparison_rows(report.factors, report.cache_hits):
        console.print(escape(line), style="yellow" if "█" in line else "", soft_wrap=True)
    for line in gate_lines(report.differences()):
        console.print(escape(line), style="yellow" if line.startswith("drift") else "", soft_wrap=True)
    for line in hardware_lines(report.hardware) + class_lines(report.classes):
        console.print(escape(line), style="yellow" if "confident at" in line else "", soft_wrap=True)
    for pair in report.baseline_pairs:
        if not pair.same_condition:
            console.print(escape(f"no pass condition in common with the baseline: compared {pair.condition}"),
                          style="yellow", soft_wrap=True)

    differing = [v for v in report.verdicts if v.verdict != "stable"]
    if differing and not console.is_terminal:  # CI logs: a table wrapped at 80 columns is unreadable
        console.print("differing requests:")
        for v in differing[:MAX_LINES]:
            console.print(escape(f"  {v.key}: {one_line(v, compact=True)}"), soft_wrap=True)
        if len(differing) > MAX_LINES:
            console.print(f"  ... and {len(differing) - MAX_LINES} more: see the report (--json-report, "
                          "evalgate report --html)", soft_wrap=True)
    elif differing:
        table = Table(title="differing requests", title_justify="left")
        for col in ("request", "verdict", "class", "pos", "reference token", "current token", "margin", "why"):
            table.add_column(col, overflow="fold")
        for v in differing[:MAX_ROWS]:
            d = v.divergence
            ref_tok, cur_tok = divergence_tokens(d, compact=True) if d is not None else ("", "")
            table.add_row(
                Text(request_label(v)), Text(v.verdict, style=STYLE[v.verdict]), ACROSS_WORDS.get(v.difference_class or "", ""),
                "" if d is None else str(d.position), ref_tok, cur_tok, margin_text(d.margin if d else None), why(v),
            )
        console.print(table)
        if len(differing) > MAX_ROWS:
            console.print(f"... and {len(differing) - MAX_ROWS} more (see --json-report)")

    if report.metrics:
        render_metrics(console, report)

    if report.failing:
        names = sorted({v.verdict for v in report.failing})
        console.print(f"[bold red]FAIL[/]: {len(report.failing)} request(s): {', '.join(names)} (exit {int(report.exit_code)})")
    metrics_failed = metric_failure_line(report)
    if metrics_failed:
        console.print(f"[bold red]FAIL[/]: {escape(metrics_failed)} (fail_on_metric, exit {int(report.exit_code)})")
    if not report.failing and not metrics_failed:
        console.print("[bold green]PASS[/] (exit 0)")
    for line in next_steps(report):
        console.print(escape(line), style="dim")
    if report.engine_log:
        console.print(escape(f"engine log: {report.engine_log}"), style="dim", soft_wrap=True)
    for update in report.updates:  # what happened to the run since it was judged
        console.print(f"{update.action} {update.at}: run {report.run_id} is the baseline of its hardware class since")
    if report.kind == "baseline":
        if report.promoted:
            console.print(f"run {report.run_id} is now the baseline for suite {report.suite_name!r} on this hardware")
        else:
            fixes = remedies(_varying(report))
            console.print(f"[red]run {report.run_id} was NOT promoted to baseline[/]: its passes disagree. "
                          + escape(f"Fix the variance ({fixes or 'batch invariance, max_num_seqs=1'}) or pass --allow-variance."))


def comparison_rows(factors: list[FactorRow], cache_hits: list[CacheHits]) -> list[str]:
    """What varies here at a glance, one line per comparison (the HTML report's Factors table)."""
    hits = {h.pass_: h.hit for h in cache_hits}
    width = max((len(f.comparison) for f in factors), default=0)
    rows = []
    for f in factors:
        share = f.differing / f.compared if f.compared else 0.0
        hit = f"  {hits[f.pass_]} cache hits" if f.pass_ in hits else ""
        rows.append(f"  {f.comparison:<{width}}  {f.factor or '':<14} {f.differing:>4}/{f.compared or 0:<4} "
                    f"{'█' * round(20 * share):<20}{hit}")
    return ["comparisons (differing/compared):"] + rows if rows else []


def next_steps(report: Report) -> list[str]:
    """Where to look next for each kind of difference (docs/bisect.md): one suggested command each."""
    first = {}
    for v in report.verdicts:
        first.setdefault(v.verdict, v.key)
    steps = []
    variance = [v for v in report.verdicts if v.verdict == "batch_variance"]
    bisectable = next((v for v in variance if batch_bisectable(v)), None)
    if bisectable is not None:
        steps.append(f"next: evalgate bisect batch {report.run_id} {shlex.quote(bisectable.key)}   "
                     "(which neighbours flip it)")
    for factor in _varying(report):
        if factor == "prefix_cache":
            steps.append("next: evalgate cost <suite>   (the price of each fix; candidate no-prefix-cache turns the "
                         "prefix cache off)")
        elif factor == "repeat":
            key = next(v.key for v in variance if "repeat" in (v.passes or {}).get("factors", []))
            steps.append(f"next: evalgate repro {report.run_id} {shlex.quote(key)} -o repro/   (it varies under the "
                         "same condition: nondeterminism)")
    if "silent_regression" in first:
        steps.append(f"next: evalgate repro {report.run_id} {shlex.quote(first['silent_regression'])} -o repro/   "
                     "(a plain vLLM script that shows it)")
    if "explained_change" in first and report.baseline_run_id is not None:
        if {"engine", "env"} & set(report.changed_components):
            steps.append(f"next: evalgate bisect config {report.baseline_run_id} {report.run_id}   "
                         "(which setting changed the outputs)")
        if "code" in report.changed_components:
            steps.append("next: evalgate bisect commits --good <baseline commit> --bad HEAD   (which commit)")
    return steps


def _varying(report: Report) -> list[str]:
    """The factors under which some request varies, in the order the run compared them."""
    return list(dict.fromkeys(f.factor for f in report.factors if f.differing and f.factor))


MAX_MOVED = 10


def render_metrics(console: Console, report: Report) -> None:
    """lm-eval metrics, baseline and current side by side, then the documents that moved a metric."""
    compared = report.baseline_run_id is not None
    if not console.is_terminal:  # a CI log: one line a metric, never a name broken over two lines
        console.print("task metrics (lm-eval, first pass):")
        for row in report.metrics:
            if not compared:
                console.print(escape(f"  {row.task} {row.metric} = {number_text(row.current)}"
                                     + (f" ± {number_text(row.stderr)}" if row.stderr else "")), soft_wrap=True)
                continue
            delta = row.delta
            console.print(escape(f"  {row.task} {row.metric}: {number_text(row.baseline)} -> {number_text(row.current)}"
                                 f" ({delta_text(delta)})"
                                 + (f", {len(row.moved)} document(s) moved" if row.moved else "")
                                 + (f"; {paired_text(row.paired)}" if row.paired else "")), soft_wrap=True)
        _moved_documents(console, report)
        return
    table = Table(title="task metrics (lm-eval, first pass)", title_justify="left")
    columns = (("task", "metric", "baseline", "current", "delta", "docs moved", "did it move?") if compared
               else ("task", "metric", "value", "stderr"))
    for col in columns:
        table.add_column(col, overflow="fold",
                         **({} if col in ("task", "metric", "did it move?") else {"justify": "right", "no_wrap": True}))
    for row in report.metrics:
        if not compared:
            table.add_row(row.task, row.metric, number_text(row.current), number_text(row.stderr))
            continue
        delta = row.delta
        change = Text(delta_text(delta), style="yellow" if delta else "")
        paired = row.paired
        moved_text = Text(paired_text(paired), style="bold red" if paired and paired.drop else
                          "yellow" if paired and paired.significant else "")
        table.add_row(row.task, row.metric, number_text(row.baseline), number_text(row.current), change,
                      str(len(row.moved)) if row.moved else "", moved_text)
    console.print(table)
    _moved_documents(console, report)


def _moved_documents(console: Console, report: Report) -> None:
    for name, change in report.task_changes.items():
        console.print(escape(f"  task {name} changed since the baseline: {change}"), style="yellow", soft_wrap=True)
    for row in report.metrics:
        for doc in row.moved[:MAX_MOVED]:
            requests = ", ".join(f"{r['key']} ({r['verdict']})" for r in doc["requests"])
            console.print(escape(f"  {row.task} doc {doc['doc_id']}: {row.metric} {number_text(doc['baseline'])} -> "
                                 f"{number_text(doc['current'])}  [{requests}]"), soft_wrap=True)
        if len(row.moved) > MAX_MOVED:
            console.print(f"  ... and {len(row.moved) - MAX_MOVED} more documents (see --json-report)")
