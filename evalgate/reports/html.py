"""A stored run as one self-contained HTML file (`evalgate report RUN --html PATH`, docs/ci.md).

Inline CSS only, no script, no external resource (the Content-Security-Policy forbids everything but
inline styles, so the file is readable offline and cannot call out). Contents: the run header, batch
invariance, verdict counts, the fingerprint components that differ from the run's baseline, and for each
non-stable request a side-by-side token diff with the first divergent token highlighted (CSS class
`first-divergence`) and the reference's top-1/top-2 margin there. Every token shows its text; its id,
logprob and margin are in its tooltip. All text goes through html.escape.

`build_html(store, run_id)` loads what a page needs; `render_html(page)` is pure.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from ..fingerprint import delta, describe_changes
from ..judgement.verdict import FAILURES, VERDICTS, RequestVerdict
from ..records import Completion
from ..store import display_status
from .explain import (
    ACROSS_WORDS,
    STACK_NAMES,
    factor_lines,
    gate_lines,
    hardware_lines,
    invariance,
    margin_text,
    one_line,
    token_label,
    verdict_from_dict,
    why,
)

MAX_REQUESTS = 500  # token diffs rendered; the rest are listed by key only
MAX_PROMPT_CHARS = 4000
CSP = "default-src 'none'; style-src 'unsafe-inline'"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5rem; color: #1f2328;
       background: #fff; line-height: 1.4; }
h1 { font-size: 1.4rem; margin: 0 0 .8rem; }
h2 { font-size: 1.15rem; margin: 1.6rem 0 .6rem; border-bottom: 1px solid #d0d7de; padding-bottom: .2rem; }
h3 { font-size: 1rem; margin: 0 0 .4rem; word-break: break-all; }
table { border-collapse: collapse; margin: .3rem 0; }
th, td { border: 1px solid #d0d7de; padding: .2rem .6rem; text-align: left; vertical-align: top; }
th { background: #f6f8fa; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
code, .mono { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .85rem; }
.badge { display: inline-block; padding: 0 .45rem; border-radius: .8rem; font-size: .85rem; font-weight: 600;
         border: 1px solid transparent; }
.v-stable, .s-pass, .s-complete { background: #dafbe1; color: #116329; }
.v-batch_variance, .v-silent_regression, .s-regression, .s-batch_variance, .s-silent_regression,
.s-failed, .s-interrupted { background: #ffebe9;
         color: #a40e26; }
.v-explained_change, .s-running { background: #fff8c5; color: #7d4e00; }
.v-new, .v-missing { background: #ddf4ff; color: #0a3069; }
.warn { color: #9a6700; font-weight: 600; }
.ok { color: #116329; font-weight: 600; }
section.request { border: 1px solid #d0d7de; border-radius: 6px; padding: .8rem 1rem; margin: 1rem 0; }
section.request.failing { border-left: 5px solid #cf222e; }
.meta { color: #57606a; font-size: .9rem; margin: .2rem 0; }
.divergence { margin: .4rem 0; }
.diff { display: grid; grid-template-columns: 1fr 1fr; gap: .8rem; margin-top: .6rem; }
.side { border: 1px solid #d0d7de; border-radius: 6px; padding: .5rem; min-width: 0; }
.side h4 { margin: 0 0 .4rem; font-size: .85rem; color: #57606a; font-weight: 600; }
.tokens { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size: .85rem;
          white-space: pre-wrap; word-break: break-all; line-height: 1.9; }
.tok { border: 1px solid #d8dee4; border-radius: 3px; padding: 0 1px; margin: 0 1px; }
.tok:hover { background: #ddf4ff; }
.tok.after { color: #8c959f; }
.tok.end { font-style: italic; color: #57606a; }
.tok.first-divergence { background: #ffd8b5; border: 2px solid #cf222e; color: #1f2328; font-weight: 700; }
details { margin: .3rem 0; }
pre.prompt { white-space: pre-wrap; word-break: break-word; background: #f6f8fa; padding: .5rem;
             border-radius: 6px; max-height: 14rem; overflow: auto; }
.empty { color: #57606a; font-style: italic; }
"""


@dataclass
class Side:
    """One column of a token diff: which output it is, and the output (None if there is none)."""

    label: str
    completion: Completion | None


@dataclass
class RequestDiff:
    verdict: RequestVerdict
    prompt: str | None
    reference: Side
    current: Side


@dataclass
class ReportPage:
    suite_name: str
    run_id: int
    kind: str
    status: str
    verdict: str | None = None
    exit_code: int | None = None
    error: str | None = None
    suite_path: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    baseline_run_id: int | None = None
    batch_invariance: dict = field(default_factory=dict)
    counts: dict | None = None
    changed_components: list[str] = field(default_factory=list)
    fingerprint_changes: dict[str, str] = field(default_factory=dict)
    requests: list[RequestDiff] = field(default_factory=list)
    baseline_missing: bool = False  # the run names a baseline run that could not be loaded
    metrics: list[dict] = field(default_factory=list)  # lm-eval metrics vs the baseline (evalgate/judgement/scores.py)
    judged: dict = field(default_factory=dict)  # the run's factors, cache hits, what did not run (verdict.Report.judged)


def e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


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


def _token_spans(c: Completion, position: int | None) -> str:
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
        spans.append(f'<span class="{cls}" title="{e(title)}">{e(token_display(text))}</span>')
    if position is not None and position >= len(c.output_ids):
        spans.append(f'<span class="tok end first-divergence" title="position {position}: this output ended '
                     f'({e(c.finish_reason)})">(end)</span>')
    return "".join(spans)


def _side(side: Side, position: int | None) -> str:
    body = (f'<div class="tokens">{_token_spans(side.completion, position)}</div>' if side.completion is not None
            else '<p class="empty">no output</p>')
    return f'<div class="side"><h4>{e(side.label)}</h4>{body}</div>'


def _named_verdict(page) -> str:
    """A failing run named by what failed it (a baseline with batch variance is no regression of anything)."""
    failed = [name for name in FAILURES if (page.counts or {}).get(name)]
    return "regression" if page.verdict == "regression" and not failed else (
        " + ".join(failed) if page.verdict == "regression" else page.verdict)


def _factor_table(factors: list[dict], cache_hits: list[dict]) -> str:
    """What varies here, at a glance: one row per comparison the run made, with a bar of its share."""
    hits = {h["pass"]: h for h in cache_hits}
    rows = []
    for f in factors:
        share = f["differing"] / f["compared"] if f.get("compared") else 0.0
        hit = hits.get(f["pass"])
        rows.append(
            f"<tr{' class=warn' if f['differing'] else ''}><td>{e(f['factor'])}</td><td>{e(f['comparison'])}</td>"
            f"<td>pass {e(f['reference_pass'])} → {e(f['pass'])}</td>"
            f"<td class=num>{e(f['differing'])}/{e(f.get('compared', ''))}</td>"
            f"<td class=num>{e(hit['hit']) if hit else ''}</td>"
            f'<td><span class=bar style="display:inline-block;height:0.8em;background:#c0392b;width:{100 * share:.0f}px">'
            f"</span></td></tr>")
    return ('<table class="factors"><tr><th>factor</th><th>comparison</th><th>passes</th><th>differing/compared</th>'
            "<th>cache hits</th><th></th></tr>" + "".join(rows) + "</table>")


def _badge(verdict: str, prefix: str = "v") -> str:
    return f'<span class="badge {prefix}-{e(verdict)}">{e(verdict)}</span>'


def _request(index: int, r: RequestDiff) -> str:
    v, d = r.verdict, r.verdict.divergence
    failing = v.verdict in FAILURES
    parts = [f'<section class="request{" failing" if failing else ""}" id="req-{index}">',
             f"<h3>{e(v.key)} {_badge(v.verdict)}</h3>"]
    if v.location:
        parts.append(f'<p class="meta">prompt at <code>{e(v.location)}</code></p>')
    reason = why(v)
    if reason:
        parts.append(f'<p class="meta">why: {e(reason)}</p>')
    if d is not None:
        parts.append(
            f'<p class="divergence">first divergence at token <strong>{d.position}</strong> ({e(d.kind)}): '
            f'reference <code>{e(token_label(d.reference_id, d.reference_text))}</code> vs current '
            f'<code>{e(token_label(d.other_id, d.other_text))}</code>; margin at that position: '
            f'<strong class="margin">{e(margin_text(d.margin) or "unknown")}</strong> '
            f'<span class="meta">(reference top-1 minus top-2 logprob)</span></p>')
        if d.kind == "logprob":
            parts.append(f'<p class="meta">same token, different logprob bits: {e(repr(d.reference_logprob))} vs '
                         f'{e(repr(d.other_logprob))}</p>')
    else:
        parts.append(f'<p class="divergence">{e(one_line(v))}</p>')
    if r.prompt is not None:
        prompt = r.prompt if len(r.prompt) <= MAX_PROMPT_CHARS else r.prompt[:MAX_PROMPT_CHARS] + " \u2026"
        parts.append(f'<details><summary>prompt</summary><pre class="prompt">{e(prompt)}</pre></details>')
    position = d.position if d is not None else None
    parts.append(f'<div class="diff">{_side(r.reference, position)}{_side(r.current, position)}</div>')
    parts.append("</section>")
    return "\n".join(parts)


def _invariance(inv: dict) -> str:
    state, words = invariance(inv)
    css = {"in_force": ' class="ok"', "not_in_force": ' class="warn"'}.get(state, "")
    return f"<p{css}>batch invariance: {e(words)}</p>"


def render_html(page: ReportPage) -> str:
    title = f"evalgate report: suite {page.suite_name}, run {page.run_id}"
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           f'<meta http-equiv="Content-Security-Policy" content="{e(CSP)}">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{e(title)}</title>", f"<style>{CSS}</style>", "</head>", "<body>",
           f"<h1>{e(title)}</h1>"]

    rows = [("suite", e(page.suite_name)), ("run", e(page.run_id)), ("kind", e(page.kind)),
            ("status", _badge(page.status, "s")),
            ("verdict", _badge(_named_verdict(page), "s") if page.verdict else ""),
            ("exit code", e(page.exit_code)),
            ("baseline run", e(page.baseline_run_id) if page.baseline_run_id is not None else "none"),
            ("suite file", f"<code>{e(page.suite_path)}</code>" if page.suite_path else ""),
            ("started", e(page.started_at)), ("finished", e(page.finished_at))]
    out.append('<table class="run">' + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>")
    if page.error:
        out.append(f'<p class="warn">error: {e(page.error)}</p>')
    out.append(_invariance(page.batch_invariance))
    judged = page.judged or {}
    factors = factor_lines(judged.get("factors") or [], judged.get("cache_hits") or [], judged.get("not_run") or [],
                           judged.get("alone_coverage"))
    if factors:
        out.append("<h2>Factors</h2>")
        out.append(_factor_table(judged.get("factors") or [], judged.get("cache_hits") or []))
        warn = ("varies", "  ", "not run", "drift")
        out.append('<ul class="factors">' + "".join(
            f"<li{' class=warn' if line.startswith(warn) else ''}>{e(line.strip())}</li>"
            for line in factors + gate_lines(judged.get("differences"))) + "</ul>")

    across = hardware_lines(judged.get("hardware"), flips=50)
    if across:
        out.append("<h2>Across hardware</h2>")
        out.append('<ul class="factors">' + "".join(
            f"<li{' class=warn' if 'confident at' in line else ''}>{e(line.strip())}</li>" for line in across) + "</ul>")

    out.append("<h2>Verdicts</h2>")
    if page.counts:
        out.append('<table class="counts"><tr><th>verdict</th><th>requests</th></tr>' + "".join(
            f'<tr><td>{_badge(name) if page.counts.get(name) else e(name)}</td>'
            f'<td class="num">{e(page.counts.get(name, 0))}</td></tr>' for name in VERDICTS) + "</table>")
    else:
        out.append(f'<p class="empty">no verdicts: the run is {e(page.status)}</p>')

    out.append("<h2>Fingerprint</h2>")
    if page.baseline_run_id is None:
        out.append('<p class="empty">no baseline run to compare the fingerprint with</p>')
    elif page.baseline_missing:
        out.append(f'<p class="warn">baseline run {e(page.baseline_run_id)} could not be loaded</p>')
    elif page.changed_components:
        out.append(f"<p>components that differ from baseline run {e(page.baseline_run_id)}:</p>")
        out.append('<table class="changes"><tr><th>component</th><th>change</th></tr>' + "".join(
            f"<tr><td><code>{e(name)}</code></td><td>{e(page.fingerprint_changes.get(name, ''))}</td></tr>"
            for name in page.changed_components) + "</table>")
    else:
        out.append(f'<p class="ok">identity unchanged since baseline run {e(page.baseline_run_id)} '
                   f'({e(STACK_NAMES)})</p>')

    if page.metrics:
        out.append(_metrics(page))
    out.append("<h2>Differing requests</h2>")
    if not page.requests:
        out.append('<p class="empty">none: every request is stable</p>' if page.counts else
                   '<p class="empty">none recorded</p>')
    else:
        shown = page.requests[:MAX_REQUESTS]
        out.append('<table class="index"><tr><th>request</th><th>verdict</th><th>class</th><th>position</th>'
                   '<th>margin</th></tr>' + "".join(
                       f'<tr><td><a href="#req-{i}">{e(r.verdict.key)}</a></td><td>{_badge(r.verdict.verdict)}</td>'
                       f'<td>{e(ACROSS_WORDS.get(r.verdict.difference_class or "", ""))}</td>'
                       f'<td class="num">{e(r.verdict.divergence.position) if r.verdict.divergence else ""}</td>'
                       f'<td class="num">{e(margin_text(r.verdict.divergence.margin) if r.verdict.divergence else "")}'
                       f"</td></tr>" for i, r in enumerate(shown)) + "</table>")
        out.extend(_request(i, r) for i, r in enumerate(shown))
        if len(page.requests) > MAX_REQUESTS:
            rest = page.requests[MAX_REQUESTS:]
            out.append(f"<p>... and {len(rest)} more: " + ", ".join(
                f"{e(r.verdict.key)} ({e(r.verdict.verdict)})" for r in rest) + "</p>")
    out += ["</body>", "</html>", ""]
    return "\n".join(out)


def _metrics(page: ReportPage) -> str:
    def num(value) -> str:
        return "" if value is None else f"{value:.4g}"

    rows = []
    for m in page.metrics:
        delta = m["delta"]
        moved = ", ".join(f'doc {e(d["doc_id"])} ({e(num(d["baseline"]))} &rarr; {e(num(d["current"]))})'
                          for d in m["moved"][:20]) + (" ..." if len(m["moved"]) > 20 else "")
        rows.append(f'<tr><td>{e(m["task"])}</td><td>{e(m["metric"])}</td><td class="num">{e(num(m["baseline"]))}</td>'
                    f'<td class="num">{e(num(m["current"]))}</td>'
                    f'<td class="num">{"" if delta is None else "=" if delta == 0 else e(f"{delta:+.4g}")}</td>'
                    f"<td>{moved}</td></tr>")
    return ("<h2>Task metrics (lm-eval)</h2>"
            '<table class="index"><tr><th>task</th><th>metric</th><th>baseline</th><th>current</th><th>delta</th>'
            "<th>documents moved</th></tr>" + "".join(rows) + "</table>")


# --- loading a stored run -------------------------------------------------------------------------------

def _pass(completions: list[Completion], pass_index: int | None) -> Completion | None:
    for c in completions:
        if c.pass_index == pass_index:
            return c
    return None


def _describe(c: Completion | None, run_id: int, what: str) -> str:
    if c is None:
        return f"{what}: no output"
    return f"{what}: run {run_id}, pass {c.pass_index} (concurrency {c.concurrency})"


def _when(dt) -> str | None:
    return dt.strftime("%Y-%m-%d %H:%M:%S UTC") if dt else None


def build_page(store, run_id: int) -> ReportPage:
    """Everything the page shows about a stored run (Store: evalgate.store)."""
    from ..errors import EvalgateError
    from ..judgement.scores import compare_scores

    record = store.load(run_id)
    run = record.run
    baseline = None
    baseline_missing = False
    if run.baseline_run_id is not None:
        try:
            baseline = store.load(run.baseline_run_id)
        except EvalgateError:
            baseline_missing = True
    changed = delta(baseline.fingerprint, record.fingerprint) if baseline else []
    changes = describe_changes(baseline.fingerprint, record.fingerprint, changed) if baseline else {}

    requests = []
    for data in store.verdicts(run_id):
        v = verdict_from_dict(data)
        if v.verdict == "stable":
            continue
        current = record.outputs.get(v.key, [])
        base = baseline.outputs.get(v.key, []) if baseline else []
        request = record.requests.get(v.key) or (baseline.requests.get(v.key) if baseline else None)
        if v.verdict == "batch_variance" and v.passes:
            ref = _pass(current, v.passes.get("reference_pass"))
            cur = _pass(current, v.passes.get("other_pass"))
            sides = (Side(_describe(ref, run.id, "reference"), ref), Side(_describe(cur, run.id, "disagreeing pass"), cur))
        else:  # the baseline's pass of the condition that differs (verdict.matching_passes), else the first
            pair = v.passes or {}
            ref = _pass(base, pair.get("baseline_pass")) if pair else (base[0] if base else None)
            cur = _pass(current, pair.get("pass")) if pair else (current[0] if current else None)
            sides = (Side(_describe(ref, run.baseline_run_id, "baseline"), ref),
                     Side(_describe(cur, run.id, "this run"), cur))
        requests.append(RequestDiff(v, request.prompt if request is not None else None, *sides))

    engine = record.fingerprint.get("engine", {}).get("data", {})
    return ReportPage(
        suite_name=run.suite_name, run_id=run.id, kind=run.kind, status=display_status(run), verdict=run.verdict,
        exit_code=run.exit_code, error=run.error, suite_path=run.suite_path, started_at=_when(run.started_at),
        finished_at=_when(run.finished_at), baseline_run_id=run.baseline_run_id,
        batch_invariance=engine.get("batch_invariance", {}) if isinstance(engine, dict) else {},
        counts=run.summary, changed_components=changed, fingerprint_changes=changes, requests=requests,
        baseline_missing=baseline_missing, judged=(run.schedule or {}).get("judged") or {},
        metrics=compare_scores(store, run.id, baseline.id if baseline else None,
                               {r.verdict.key: r.verdict.verdict for r in requests}),
    )


def build_html(store, run_id: int) -> str:
    return render_html(build_page(store, run_id))
