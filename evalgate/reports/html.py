"""A stored run as one self-contained HTML file (`evalgate report RUN --html PATH`, docs/ci.md).

The page renders the run's stored Report (gate.stored_report: the object the check wrote, read back) with
the template `templates/report.html.j2`, through Jinja2 with autoescape on: every value is escaped by the
template engine, never by hand. Inline CSS only, no script, no external resource (the
Content-Security-Policy forbids everything but inline styles, so the file is readable offline and cannot
call out). Contents: the run header, batch invariance, the factors, verdict counts, the fingerprint
components that differ from the run's baseline, the lm-eval metrics, and for each non-stable request a
side-by-side token diff with the first divergent token highlighted (CSS class `first-divergence`) and the
reference's top-1/top-2 margin there. Every token shows its text; its id, logprob and margin are in its
tooltip.

`build_html(store, run_id, report)` loads the outputs the diffs show; `render_html(run, report, diffs)` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..codec import to_json
from ..judgement.report import Report
from ..judgement.scores import MetricRow
from ..judgement.verdict import FAILURES, CacheHits, FactorRow, RequestVerdict
from ..records import Completion
from ..store import display_status
from .explain import (
    ACROSS_WORDS,
    STACK_NAMES,
    delta_text,
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
    token_label,
    why,
)
from .history_strip import HISTORY_RUNS, HistoryStrip, history_strip

if TYPE_CHECKING:
    from ..store import Run

PAGE_SIZE = 500  # differing requests a page renders as token diffs (`evalgate report --page N`: the others)
LISTED = 5000  # differing requests of the other pages a page lists by key; past that, their count
MAX_PROMPT_CHARS = 4000
CSP = "default-src 'none'; style-src 'unsafe-inline'"
TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class Side:
    """One column of a token diff: which output it is, and the output (None if there is none)."""

    label: str
    completion: Completion | None


@dataclass
class RequestDiff:
    """A differing request's two sides, loaded from the store for the page."""

    verdict: RequestVerdict
    prompt: str | None
    reference: Side
    current: Side


_VISIBLE = {"\n": "\u21b5", "\r": "\u240d", "\t": "\u2192"}


def token_display(text: str | None) -> str:
    """Token text as shown: newline/CR/tab as arrows, other control characters as escapes, "" as a mark."""
    if text is None:
        return "?"
    if text == "":
        return "\u2205"
    out = []
    for c in text:
        if c in _VISIBLE:
            out.append(_VISIBLE[c])
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    return "".join(out)


def token_spans(c: Completion, position: int | None) -> list[dict[str, str]]:
    """Each output token as the page shows it: its class (same, first-divergence, after), tooltip and text."""
    spans = []
    logprobs = c.logprobs.tolist()
    for i, token_id in enumerate(c.output_ids.tolist()):
        text = c.token_texts[i] if i < len(c.token_texts) else None
        lp = logprobs[i] if i < len(logprobs) else None
        margin = c.margin(i)
        title = f"position {i} \u00b7 id {token_id} \u00b7 text {text!r}"
        if lp is not None:
            title += f" \u00b7 logprob {lp:.6g}"
        if margin is not None:
            title += f" \u00b7 margin {margin:.4g}"
        cls = "tok"
        if position is not None:
            cls += " first-divergence" if i == position else (" after" if i > position else " same")
        spans.append({"cls": cls, "title": title, "text": token_display(text)})
    if position is not None and position >= len(c.output_ids):
        spans.append({"cls": "tok end first-divergence", "text": "(end)",
                      "title": f"position {position}: this output ended ({c.finish_reason})"})
    return spans


def named_verdict(report: Report | None) -> str | None:
    """A failing run named by what failed it (a baseline with batch variance is no regression of anything)."""
    if report is None:
        return None
    failed = [name for name in FAILURES if report.counts.get(name)]
    return " + ".join(failed) if report.status == "regression" and failed else report.status


def _request(diff: RequestDiff) -> dict[str, Any]:
    v, d = diff.verdict, diff.verdict.divergence
    position = d.position if d is not None else None
    prompt = diff.prompt
    if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
        prompt = prompt[:MAX_PROMPT_CHARS] + " \u2026"
    return {
        "key": v.key, "label": request_label(v), "verdict": v.verdict, "failing": v.verdict in FAILURES,
        "location": v.location, "why": why(v),
        "divergence": d, "position": position, "margin": margin_text(d.margin) if d is not None else "",
        "difference": ACROSS_WORDS.get(v.difference_class or "", ""),
        "reference_token": token_label(d.reference_id, d.reference_text) if d is not None else "",
        "other_token": token_label(d.other_id, d.other_text) if d is not None else "",
        "logprob_bits": f"{d.reference_logprob!r} vs {d.other_logprob!r}" if d is not None else "",
        "one_line": one_line(v), "prompt": prompt,
        "sides": [{"label": side.label, "spans": token_spans(side.completion, position)
                   if side.completion is not None else None} for side in (diff.reference, diff.current)],
    }


def _metric(m: MetricRow) -> dict[str, str]:
    moved = ", ".join(f'doc {d["doc_id"]} ({number_text(d["baseline"])} \u2192 {number_text(d["current"])})'
                      for d in m.moved[:20])
    return {"task": m.task, "metric": m.metric, "baseline": number_text(m.baseline),
            "current": number_text(m.current), "delta": delta_text(m.delta),
            "moved": moved + (" ..." if len(m.moved) > 20 else ""), "paired": paired_text(m.paired),
            "worse": bool(m.paired and m.paired.drop)}


def _factor_rows(factors: list[FactorRow], cache_hits: list[CacheHits]) -> list[dict[str, Any]]:
    """What varies here, at a glance: one row per comparison the run made, with a bar of its share."""
    hits = {h.pass_: h.hit for h in cache_hits}
    return [{**to_json(f), "compared": "" if f.compared is None else f.compared, "hit": hits.get(f.pass_, ""),
             "width": f"{100 * (f.differing / f.compared if f.compared else 0.0):.0f}"} for f in factors]


@dataclass(frozen=True)
class Paging:
    """Which page of a report's differing requests a page renders (1-based), and what the others are:
    (key, verdict) of up to `LISTED` of them."""

    page: int = 1
    pages: int = 1
    differing: int = 0
    others: tuple[tuple[str, str], ...] = ()

    @property
    def line(self) -> str | None:
        if self.pages == 1:
            return None
        first = (self.page - 1) * PAGE_SIZE + 1
        return (f"page {self.page} of {self.pages}: differing requests {first:,} to "
                f"{min(self.page * PAGE_SIZE, self.differing):,} of {self.differing:,} (`evalgate report RUN --html FILE "
                f"--page N` writes another)")


def page_context(run: Run, report: Report | None, sections: dict, diffs: list[RequestDiff],
                 paging: Paging | None = None) -> dict[str, Any]:
    """What the template shows beyond the Report's sections: the lines and rows for people. `diffs`: the
    page's; without `paging`, the first PAGE_SIZE are rendered and the rest listed by key."""
    if paging is None:
        paging = Paging(others=tuple((d.verdict.key, d.verdict.verdict) for d in diffs[PAGE_SIZE:]))
    conditions = sections.get("conditions") or {}
    factors, hits = conditions.get("factors") or [], conditions.get("cache_hits") or []
    lines = factor_lines(factors, hits, conditions.get("not_run") or [], conditions.get("alone_coverage"), run.kind)
    if lines and report is not None:
        lines += gate_lines(report.differences())
    hardware = conditions.get("hardware")
    engine = (report.batch_invariance if report is not None else None)
    warn = ("varies", "  ", "not run", "drift", "passes compared: none")
    return {
        "title": f"evalgate report: suite {run.suite_name}, run {run.id}",
        "verdict": named_verdict(report) or run.verdict,
        "started": _when(run.started_at), "finished": _when(run.finished_at),
        "invariance": invariance(engine), "stack": STACK_NAMES,
        "prompt_lines": prompt_lines(report) if report is not None else [],
        "factor_rows": _factor_rows(factors, hits),
        "factor_lines": [(line.strip(), line.startswith(warn)) for line in lines],
        "across_lines": [(line.strip(), "confident at" in line)
                         for line in hardware_lines(hardware, flips=50)],
        "metrics": [_metric(m) for m in (report.metrics if report is not None else [])],
        "metrics_failed": metric_failure_line(report) if report is not None else None,
        "requests": [_request(d) for d in diffs[:PAGE_SIZE]],
        "rest": list(paging.others),
        "unlisted": paging.differing - len(diffs[:PAGE_SIZE]) - len(paging.others) if paging.pages > 1 else 0,
        "paging": paging.line,
    }


@cache
def _template():
    try:
        import jinja2
    except ImportError:  # a dependency of evalgate; an install without it is broken
        from ..errors import MissingDependency

        raise MissingDependency("jinja2 (the HTML report)", fix="pip install jinja2") from None
    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return environment.get_template("report.html.j2")


def render_html(run: Run, report: Report | None, diffs: list[RequestDiff] = (),
                history: HistoryStrip | None = None, paging: Paging | None = None) -> str:
    """The page of a run (its row), its stored report (None: never judged), its differing requests' sides
    (those of `paging`'s page) and the suite's recent runs on its hardware class (`history`)."""
    sections = report.sections() if report is not None else {}
    return _template().render(run=run, status=display_status(run), report=report, sections=sections,
                              page=page_context(run, report, sections, list(diffs), paging), history=history,
                              css=(TEMPLATES / "report.css").read_text(), csp=CSP)


# --- loading a stored run -------------------------------------------------------------------------------

def _pass(completions: list[Completion], pass_index: int | None) -> Completion | None:
    for c in completions:
        if c.pass_index == pass_index:
            return c
    return None


def _describe(c: Completion | None, run_id: int | None, what: str) -> str:
    if c is None:
        return f"{what}: no output"
    return f"{what}: run {run_id}, pass {c.pass_index} (concurrency {c.concurrency})"


def _when(dt) -> str | None:
    return dt.strftime("%Y-%m-%d %H:%M:%S UTC") if dt else None


def request_diffs(store, run_id: int, report: Report | None, verdicts: list | None = None) -> list[RequestDiff]:
    """The two sides of each request of `verdicts` (default: every one the report lists as differing), read
    for those requests alone: within the run, the disagreeing passes; against the baseline, the baseline's
    pass of the condition that differs (verdict.matching_passes)."""
    from ..errors import EvalgateError

    if verdicts is None:
        verdicts = [v for v in (report.verdicts if report is not None else []) if v.verdict != "stable"]
    if not verdicts:
        return []
    keys = [v.key for v in verdicts]
    record = store.load(run_id, keys=keys)
    record.prefetch(keys)
    baseline = None
    if report.baseline_run_id is not None:
        try:
            baseline = store.load(report.baseline_run_id, keys=keys)
            baseline.prefetch(keys)
        except EvalgateError:  # deleted since: the page still shows this run's side
            baseline = None
    diffs = []
    for v in verdicts:
        current = record.outputs.get(v.key, [])
        base = baseline.outputs.get(v.key, []) if baseline else []
        request = record.requests.get(v.key) or (baseline.requests.get(v.key) if baseline else None)
        if v.verdict == "batch_variance" and v.passes:
            ref = _pass(current, v.passes.get("reference_pass"))
            cur = _pass(current, v.passes.get("other_pass"))
            sides = (Side(_describe(ref, run_id, "reference"), ref), Side(_describe(cur, run_id, "disagreeing pass"), cur))
        else:
            pair = v.passes or {}
            ref = _pass(base, pair.get("baseline_pass")) if pair else (base[0] if base else None)
            cur = _pass(current, pair.get("pass")) if pair else (current[0] if current else None)
            sides = (Side(_describe(ref, report.baseline_run_id, "baseline"), ref),
                     Side(_describe(cur, run_id, "this run"), cur))
        diffs.append(RequestDiff(v, request.prompt if request is not None else None, *sides))
    return diffs


def build_html(store, run_id: int, report: Report | None, page: int = 1) -> str:
    """A page of a stored run and its stored report (gate.stored_report), with the history strip: the token
    diffs of its differing requests `PAGE_SIZE` a page (`page`, from 1), so a page of a leaderboard-sized run
    reads and renders a bounded part of it."""
    from ..errors import ConfigError
    from ..store.listing import history_rows

    run = store.get_run(run_id)
    differing = [v for v in (report.verdicts if report is not None else []) if v.verdict != "stable"]
    pages = max(1, -(-len(differing) // PAGE_SIZE))
    if not 1 <= page <= pages:
        raise ConfigError(f"the report of run {run_id} has {pages} page{'s' if pages > 1 else ''} of differing "
                          f"requests ({PAGE_SIZE} a page), not page {page}", fix=f"--page 1 to {pages}")
    start = (page - 1) * PAGE_SIZE
    shown, others = differing[start : start + PAGE_SIZE], differing[:start] + differing[start + PAGE_SIZE :]
    paging = Paging(page, pages, len(differing), tuple((v.key, v.verdict) for v in others[:LISTED]))
    rows = history_rows(store.url, run.suite_name, limit=4 * HISTORY_RUNS)  # other classes' runs are left out
    return render_html(run, report, request_diffs(store, run_id, report, shown),
                       history_strip(rows, run_id, run.hardware_class), paging)
