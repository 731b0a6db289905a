"""Plain-text wording shared by every rendering of a verdict (terminal, JUnit, GitHub, HTML): how a token,
a margin and the reason for a difference are spelled, so the same request reads the same everywhere."""

from __future__ import annotations

import json

from ..configuration.template_date import WALL_CLOCK
from ..judgement.compare import Divergence
from ..judgement.factors import is_batch_factor, remedy, words
from ..judgement.hardware import AcrossHardware
from ..judgement.paired import PairedTest
from ..judgement.report import BatchInvariance, ClassRow, Coverage, NotRun
from ..judgement.verdict import FAILURES, STRICT_FAILURES, CacheHits, FactorRow, RequestVerdict

STACK_NAMES = "model, tokenizer, engine, code, hardware, env"


def token_label(token_id: int | None, text: str | None) -> str:
    """`9822 ' Paris'`: the id (the truth) and the repr of its decoded text; `(end)` past an output's end."""
    if token_id is None:
        return "(end)"
    return f"{token_id} {text!r}" if text is not None else str(token_id)


def divergence_tokens(d: Divergence, *, compact: bool = False) -> tuple[str, str]:
    """Reference and current token at the first divergence; a logprob divergence also shows both logprobs:
    every digit (CI files), or `compact` for people: 7 significant digits and the difference."""
    ref, cur = token_label(d.reference_id, d.reference_text), token_label(d.other_id, d.other_text)
    if d.kind == "logprob":
        if compact:
            a, b = d.reference_logprob, d.other_logprob
            ref, cur = f"{ref} lp={a:.7g}", f"{cur} lp={b:.7g} (Δ {b - a:+.2g})"
        else:
            ref, cur = f"{ref} lp={d.reference_logprob!r}", f"{cur} lp={d.other_logprob!r}"
    return ref, cur


def number_text(value: float | None) -> str:
    """A figure as reports print it: four significant digits, "" when there is none."""
    return "" if value is None else f"{value:.4g}"


def margin_text(margin: float | None) -> str:
    return number_text(margin)


def delta_text(delta: float | None) -> str:
    """A metric's change from the baseline: `+0.04`, `=` when it did not move, "" without a baseline."""
    return "" if delta is None else "=" if delta == 0 else f"{delta:+.4g}"


def why(v: RequestVerdict) -> str:
    """What makes this request differ: the disagreeing passes, the components that changed, or nothing."""
    if v.verdict == "batch_variance" and v.passes:
        p = v.passes
        also = [words(f) for f in p.get("factors") or [] if f != v.factor]
        return (f"{words(v.factor)}: pass {p['reference_pass']} (c={p['reference_concurrency']}) vs pass "
                f"{p['other_pass']} (c={p['other_concurrency']}); {p['differing_passes']}/{p['total_passes'] - 1} "
                "comparisons differ" + (f"; also varies under {', '.join(also)}" if also else ""))
    if v.across and v.verdict == "silent_regression":
        return (f"{ACROSS_WORDS[v.across]} across hardware: not rounding (the hardware explains drift and near ties, "
                "not this)" if v.across == "confident" else
                f"{ACROSS_WORDS[v.across]} across hardware, failing: [gate] other_hardware = \"exact\"")
    if v.components:
        tag = f" ({ACROSS_WORDS[v.across]})" if v.across else ""
        moved = f" ({prompt_text(v.prompt)})" if v.prompt else ""
        return ", ".join(v.components) + tag + moved
    return "nothing changed" if v.verdict == "silent_regression" else ""


def prompt_text(change) -> str:
    """`rendered prompt differs at token 12: "…Today Date: 01 Mar 2026…" -> "…Today Date: 02 Mar 2026…"`."""
    return (f"rendered prompt differs at token {change.position}: {_quoted(change.baseline_text)} -> "
            f"{_quoted(change.text)}")


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # newlines and quotes escaped: one line, unambiguous


def prompts_line(report) -> str | None:
    """`rendered prompts: equal, 12 of 12` against a baseline: what a silent regression's proof rests on."""
    counts = report.prompts
    if not counts:
        return None
    if counts.equal == counts.compared:
        return f"rendered prompts: equal, {counts.equal} of {counts.compared}"
    return (f"rendered prompts: {counts.compared - counts.equal} of {counts.compared} differ from the "
            "baseline's (each an explained change: `prompt`, or `suite` where the request itself changed)")


def own_changes_line(report) -> str | None:
    """`changed in the suite itself: 2 differing requests ...`: the differences `suite` explains (a request's
    own text, sampling or lm-eval task changed), which the identity line, of the stack around the suite, leaves out."""
    n = sum("suite" in v.components for v in report.verdicts if v.verdict == "explained_change")
    if not n:
        return None
    return (f"changed in the suite itself: {n} differing request{'s' if n > 1 else ''} (the request's own text, sampling or "
            "lm-eval task: explained by `suite`)")


def prompt_lines(report) -> list[str]:
    """What a report says of what the engine was asked: the pinned calendar, the rendered prompts compared with
    the baseline's, and the requests the suite itself changed."""
    return [line for line in (template_date_line(report), prompts_line(report), own_changes_line(report)) if line]


def template_date_line(report) -> str | None:
    """`this chat template writes today's date; pinned to 2026-12-04 (the baseline's)`."""
    pinned = report.template_date
    if not pinned:
        return None
    if pinned.date == WALL_CLOCK:
        return ('this chat template writes today\'s date; not pinned ([suite] template_date = "wall-clock"): '
                "its prompts move with the calendar")
    base = pinned.baseline_date
    whose = (" (the baseline's)" if base == pinned.date else
             f" (the baseline's was {base}: `prompt` explains what moved)" if base else "")
    return f"this chat template writes today's date; pinned to {pinned.date}{whose}"


def invariance(inv: BatchInvariance | None) -> tuple[str, str]:
    """(state, words) for a run's batch invariance; state: in_force, not_in_force, not_requested or unknown."""
    if inv is None or not inv.known:
        return "unknown", "unknown"
    if inv.in_force:
        # CPU: evalgate's kernels (evalgate/kernels); CUDA, ROCm, XPU: vLLM's own
        return "in_force", f"in force (evalgate CPU kernels, {inv.kernels})" if inv.kernels else \
            "in force (VLLM_BATCH_INVARIANT=1)"
    if inv.requested:
        return "not_in_force", "requested, NOT in force" + (f": {inv.reason}" if inv.reason else "")
    return "not_requested", "not requested"


def is_failure(verdict: str, strict: bool) -> bool:
    return verdict in (STRICT_FAILURES if strict else FAILURES)


def request_label(v: RequestVerdict) -> str:
    """The request as people read it: its key, and the LoRA adapter it ran under."""
    return f"{v.key} [adapter {v.adapter}]" if v.adapter else v.key


def one_line(v: RequestVerdict, *, compact: bool = False) -> str:
    """`explained_change at token 2: reference 315 ' upon', current 99 ' in' (margin 2.531); model`."""
    d = v.divergence
    if v.verdict == "new":
        return "new: only in this run (no baseline output to compare)"
    if v.verdict == "missing":
        return "missing: in the baseline, not in this run"
    under = f" [adapter {v.adapter}]" if v.adapter else ""
    if d is None:
        return v.verdict + under
    ref, cur = divergence_tokens(d, compact=compact)
    margin = f" (margin {margin_text(d.margin)})" if d.margin is not None else ""
    reason = why(v)
    flip = (f" [{ACROSS_WORDS[v.across]} across hardware]" if v.across else f" [{FLIP_WORDS[v.flip]}]" if v.flip
            else "")
    return f"{v.verdict}{under} at token {d.position} ({d.kind}){flip}: reference {ref}, current {cur}{margin}" + (
        f"; {reason}" if reason else "")


FLIP_WORDS = {"near_tie": "near-tie flip", "confident": "confident flip"}
ACROSS_WORDS = {"identical": "identical", "drift": "drift", "near_tie": "near tie", "confident": "confident"}


def hardware_lines(section: AcrossHardware | None, *, flips: int = 10) -> list[str]:
    """A check judged against another hardware class's baseline (judgement/hardware.py AcrossHardware): the two
    classes side by side, the bitwise agreement, the counts per class, the envelope, the tolerances, and each
    near tie and confident flip with both tokens and both margins."""
    if section is None:
        return []
    counts, tol, env = section.counts, section.tolerance, section.envelope
    verdict = ("any difference fails" if section.mode == "exact"
               else "drift and near ties pass, confident flips fail")
    lines = [f"across hardware: baseline class {section.baseline_class[:12]} ({section.baseline_label})",
             f"                 this class     {section.here_class[:12]} ({section.here_label})",
             f"bitwise: {counts['identical']} of {section.compared} identical across the two classes; drift "
             f"{counts['drift']}, near ties {counts['near_tie']}, confident {counts['confident']}",
             f"tolerance ({tol.dtype}): near tie within ε {tol.epsilon:g}, drift within cap {tol.cap:g} nats; "
             f"other_hardware = {section.mode}: {verdict}"]
    if env and env.get("positions"):
        lines.append(f"envelope: |Δ logprob| between the two rescorings of the baseline's tokens: max {env['max']:.3g}, "
                     f"p99 {env['p99']:.3g} over {env['positions']} positions of {env['requests']} requests")
    for flip in section.flips[:flips]:
        base, here = flip.baseline_token, flip.here_token
        gap = f", gap here {flip.gap:.3g}" if flip.gap is not None else ""
        lines.append(f"  {flip.key}: {ACROSS_WORDS[flip.cls]} at token {flip.position}: baseline "
                     f"{token_label(base['id'], base['text'])} (margin {margin_text(flip.baseline_margin) or '?'}), "
                     f"here {token_label(here['id'], here['text'])} (margin {margin_text(flip.here_margin) or '?'}){gap}")
    if len(section.flips) > flips:
        lines.append(f"  ... {len(section.flips) - flips} more (the JSON report has them all)")
    lines += [f"note: {note}" for note in section.notes]
    if section.adopted:
        lines.append("adopted: this run is now the baseline of its hardware class (`evalgate baseline list`)")
    return lines


def class_lines(classes: list[ClassRow]) -> list[str]:
    """A check's shards merged per hardware class (judging.combine): each class's run, baseline and result."""
    lines = []
    for c in classes:
        counts = ", ".join(f"{name} {n}" for name, n in c.counts.items() if n)
        across = c.hardware
        if across:
            h = across.counts
            against = (f"across hardware against baseline run {c.baseline_run_id} ({across.baseline_label}): "
                       f"{h['identical']} of {across.compared} identical, drift {h['drift']}, near ties "
                       f"{h['near_tie']}, confident {h['confident']}")
        else:
            against = f"against its own class's baseline run {c.baseline_run_id}"
        lines.append(f"class {(c.hardware_class or '')[:12]} ({c.label}): merged run {c.run_id} {against}; "
                     f"{c.status} ({counts})")
    return lines


def gate_lines(d: dict | None) -> list[str]:
    """The judging level, then how the differences split: bits only (drift) or token flips, near ties apart
    from confident ones (`d`: verdict.Report.differences(); policy.py). None: a run judged before [gate]."""
    if not d:
        return []
    if d["fail_on"] == "tokens":
        lines = [f"gate: fail on tokens (token flips fail; logprob-bit drift is reported and passes; near tie: margin "
                 f"<= {d['near_tie_margin']:g})"]
    else:
        lines = ["gate: fail on bits (any difference fails, down to one logprob bit)"]
    flips = d["token_flips"]
    if d["bits_only"] or flips["near_tie"] or flips["confident"]:
        bits = (f"{d['bits_only']} in logprob bits only (largest |Δ| {d['max_delta']:.3g}, smallest margin "
                f"{margin_text(d['min_margin']) or 'unknown'})" if d["bits_only"] else "none in bits only")
        tie = f" (near tie: margin <= {d['near_tie_margin']:g})" if d.get("near_tie_margin") is not None else ""
        lines.append(f"differences: {bits}; token flips: {flips['near_tie']} near-tie, {flips['confident']} confident{tie}")
    if d["drift"]:
        lines.append(f"drift: {d['drift']} request(s) differ in logprob bits only: reported, not failing (fail_on = tokens)")
    return lines


def coverage_line(coverage: Coverage) -> str:
    """`alone coverage: 100% over the last 16 runs`: the rotating preset's promise, measured."""
    covered, requests, runs, window = coverage.covered, coverage.requests, coverage.runs, coverage.window
    share = f"{100 * covered / requests:.0f}%" if requests else "n/a"
    line = f"alone coverage: {share} over the last {runs} run{'s' if runs != 1 else ''} ({covered} of {requests} requests"
    if runs < window:
        return line + f"; the rotation of {window} completes after {window - runs} more)"
    return line + ")"


ONE_PASS = ("passes compared: none (the schedule ran one pass): batch variance was not judged; add a "
            "concurrency level, a shuffle or `hot_pass = true` to [schedule]")


def factor_lines(factors: list[FactorRow], cache_hits: list[CacheHits] = (), not_run: list[NotRun] = (),
                 alone_coverage: Coverage | None = None, kind: str | None = None) -> list[str]:
    """`invariant under: batch size 1→8, order ...` / `varies under: prefix cache cold→hot (8 requests)`, the
    settings that remove each varying factor, whether the hot passes really hit the cache, what the plan
    asked for that could not run, and the rotating preset's alone coverage (verdict.Report.factors,
    .cache_hits, .not_run, .alone_coverage). A run of `kind` baseline, check or survey with no comparison at
    all says so: its `stable` counts say nothing of batch variance."""
    lines = [coverage_line(alone_coverage)] if alone_coverage else []
    if not factors and not alone_coverage and kind in ("baseline", "check", "survey"):
        lines.append(ONE_PASS)
    # a hot pass that no request hit proves nothing about the cache: not exercised, rather than invariant
    # and a comparison no request ran in both passes of proves nothing at all
    cold_hot = {h.pass_ for h in cache_hits if h.hit == 0 and h.unknown == 0}
    empty = [f.comparison for f in factors if f.compared == 0]
    unexercised = [f.comparison for f in factors if not f.differing and f.pass_ in cold_hot and f.compared != 0]
    invariant = [f.comparison for f in factors if not f.differing and f.pass_ not in cold_hot and f.compared != 0]
    varying = [f for f in factors if f.differing]
    if invariant:
        lines.append("invariant under: " + ", ".join(invariant))
    if unexercised:
        lines.append("not exercised: " + ", ".join(unexercised) + " (no request was served from the cache)")
    if empty:
        lines.append("not exercised: " + ", ".join(empty) + " (no request ran in both passes)")
    if varying:
        lines.append("varies under: " + ", ".join(
            f"{f.comparison} ({f.differing} request{'s' if f.differing != 1 else ''})" for f in varying))
        for factor in dict.fromkeys(f.factor for f in varying):
            if remedy(factor):
                lines.append(f"  {words(factor)}: removed by {remedy(factor)}")
    for hits in cache_hits:
        total = hits.hit + hits.missed + hits.unknown
        if hits.unknown == total:
            lines.append(f"hot pass {hits.pass_}: the engine did not report cached prompt tokens (hits unproven)")
        elif hits.missed:
            verb = "was" if hits.missed == 1 else "were"
            lines.append(f"hot pass {hits.pass_}: {hits.hit} of {total} requests were served from the prefix "
                         f"cache; {hits.missed} {verb} not (a prompt shorter than one cache block is never "
                         "cached), so for those the hot pass is a repeat")
        else:
            lines.append(f"hot pass {hits.pass_}: all {total} requests were served from the prefix cache")
    for item in not_run:
        lines.append(f"not run: {item.pass_}: {item.reason}")
    return lines


def batch_bisectable(v: RequestVerdict) -> bool:
    """Whether the batch bisector can take this variance apart: it varies with who shares its batch (or the
    run predates conditions, so no one knows)."""
    return is_batch_factor(v.factor) or v.factor is None


def split_location(location: str | None) -> tuple[str | None, int | None]:
    """`/ci/suite/prompts.jsonl:12` -> (`/ci/suite/prompts.jsonl`, 12); the path may itself hold colons."""
    if not location:
        return None, None
    path, sep, line = location.rpartition(":")
    if sep and line.isdigit() and path:
        return path, int(line)
    return location, None


def failure_text(v: RequestVerdict, fingerprint_changes: dict | None = None) -> str:
    """The body of a `<failure>`: verdict, where, the first divergence in full, and why."""
    lines = [f"verdict: {v.verdict}"]
    if v.location:
        lines.append(f"location: {v.location}")
    if v.adapter:
        lines.append(f"adapter: {v.adapter}")
    d = v.divergence
    if d is not None:
        ref, cur = divergence_tokens(d)
        lines += [
            f"first divergence: token {d.position} ({d.kind})",
            f"reference token: {ref}",
            f"current token:   {cur}",
            f"margin: {margin_text(d.margin) or 'unknown'} (reference top-1 minus top-2 logprob at that position)",
        ]
        if v.across:
            lines.append(f"across hardware: {ACROSS_WORDS[v.across]}")
        elif v.flip:
            lines.append(f"flip: {FLIP_WORDS[v.flip]}")
        elif v.bits_only:
            lines.append(f"logprob bits only: token ids equal, largest |Δ logprob| {v.max_delta:.3g}")
    if v.verdict == "batch_variance" and v.passes:
        p = v.passes
        lines.append(f"factor: {v.factor or 'unattributed'} ({words(v.factor)})")
        lines.append(f"passes: pass {p['reference_pass']} (concurrency {p['reference_concurrency']}) vs pass "
                     f"{p['other_pass']} (concurrency {p['other_concurrency']}); {p['differing_passes']} of "
                     f"{p['total_passes'] - 1} comparisons differ")
        if len(p.get("factors") or []) > 1:
            lines.append(f"varies under: {', '.join(str(f) for f in p['factors'])}")
        if remedy(v.factor):
            lines.append(f"removed by: {remedy(v.factor)}")
    elif v.verdict == "silent_regression" and v.across:
        lines.append(f"why: {why(v)}")
    elif v.verdict == "silent_regression":
        lines.append("changed components: none (model, tokenizer, engine, code, hardware, env are all unchanged, "
                     "and the rendered prompt equals the baseline's)")
    if v.verdict in ("silent_regression", "explained_change") and v.passes and v.passes.get("condition"):
        lines.append(f"compared: baseline pass {v.passes['baseline_pass']} vs pass {v.passes['pass']} "
                     f"({v.passes['condition']})")
    elif v.verdict == "new":
        lines.append("only in this run: no baseline output to compare")
    elif v.verdict == "missing":
        lines.append("only in the baseline: not in this run")
    if v.prompt:
        lines.append(prompt_text(v.prompt))
    if v.components:
        lines.append(f"changed components: {', '.join(v.components)}")
        for name in v.components:
            if fingerprint_changes and name in fingerprint_changes:
                lines.append(f"  {name}: {fingerprint_changes[name]}")
    return "\n".join(lines) + "\n"


PAIRED_TESTS = {"mcnemar_exact": "McNemar exact", "sign_flip_permutation": "paired permutation"}


def paired_text(paired: PairedTest | None) -> str:
    """`2 up, 5 down of 50 documents, p = 0.453 (McNemar exact)`, then `significant at 0.05: worse` when
    it is: whether a metric really moved (judgement/paired.py)."""
    if not paired:
        return ""
    text = (f"{paired.up} up, {paired.down} down of {paired.documents} documents, "
            f"p = {paired.p_value:.3g} ({PAIRED_TESTS.get(paired.test, paired.test)})")
    if paired.significant:
        text += f"; significant at {paired.alpha:g}" + (": worse" if paired.drop else
                                                        f": {paired.direction}" if paired.direction else "")
    return text


def metric_failure_line(report) -> str | None:
    """`2 metric(s) significantly worse: evalgate_arith exact_match,strip (p = 0.0078), ...` under
    `[gate] fail_on_metric = "significant_drop"`; None when none is."""
    failing = report.failing_metrics
    if not failing:
        return None
    names = ", ".join(f"{m.task} {m.metric} (p = {m.paired.p_value:.3g})" for m in failing)
    return f"{len(failing)} metric(s) significantly worse: {names}"

