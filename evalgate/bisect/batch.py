"""`evalgate bisect batch RUN KEY`: which co-batched requests flip a request's output.

For a request with batch variance, the bisect takes the wave it shared in the first pass that differs
from the reference pass (its recorded neighbours, in submission order) and, in ONE engine process with the
run's configuration (engine arguments and allow-listed environment; batch composition is a runtime knob,
so one engine serves every trial):

1. "alone" (the target only) -> A, the reference every other trial is compared with;
2. "recorded batch" (target + every recorded neighbour, recorded order) -> must differ from A, else the
   flip does not reproduce in a fresh engine (inconclusive, exit 1);
3. the smallest flipping concurrency along the recorded order: a binary search over c (the target plus the
   first c-1 neighbours) that keeps "c-1 does not flip, c flips" as its invariant, so the c it finds is a
   real boundary even where flips are not monotonic in c;
4. a 1-minimal set of the neighbours of that flipping prefix whose batch still flips the target. First a
   control: a batch of the same size with other neighbours. If it flips too, the batch size drives the
   flip (on CPU, oneDNN picks another GEMM path past some row count) and the whole prefix is usually
   already 1-minimal: each neighbour is left out once to prove it (c-2 new trials; ddmin's worst case,
   every element needed, costs about 3(c-1)). Otherwise, or if leaving one out still flips, delta
   debugging (ddmin.py) minimises the set;
5. verification in a FRESH engine process: alone, then target + minimal set; it must flip again.

Each trial submits one batch (one `generate` call: its requests share the engine's batches) after
resetting vLLM's prefix cache, so no trial reuses state from the previous one. A flip is a difference
from A on `tokens` (token ids) or `bits` (ids and every logprob bit); `auto` picks tokens if the recorded
variance changed a token id. Trials are recorded in `bisect_trials` by the engine process itself as each
is decided (an interrupted bisect can be read with `evalgate bisect show`); the parent owns the session
(its status, result and clean-up on failure) and prints progress lines the child sends.

Why the search runs inside the engine process: the engine must stay up across trials, and the worker
protocol (evalgate/execution/worker.py) is one job per child; running the whole deterministic search there keeps a
single, crash-supervised process with no request/response protocol to get wrong.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..codec import to_json
from ..configuration.adapters import BASE_MODEL
from ..configuration.prompts import Prompt
from ..configuration.schedule import passes_of
from ..errors import ConfigError
from ..judgement.compare import Divergence, first_divergence, within_run
from ..judgement.factors import is_batch_factor, remedies, words
from ..probes.adapter_mix import CONTROL as MIX_CONTROL
from ..probes.adapter_mix import AdapterMix, mix_neighbours
from ..records import Completion
from ..store import Store
from .ddmin import BudgetExhausted, ddmin, naive_trials
from .repro import ReproBatch, check_request, criterion_of, prompt_of, wave_of, write_repro
from .search import SearchSetup, TrialEngine, Verification, follow_trials
from .session import Bisection, Bounds, TrialCallback, TrialOutcome
from .trials import RunConfig, same, suite_of

ADAPTER_MIX = AdapterMix.name


@dataclass
class BatchResult:
    session_id: int
    run_id: int
    key: str
    on: str
    status: str = "inconclusive"  # found | inconclusive
    reason: str = ""
    source: str = ""  # "pass 1 (concurrency 16), wave 0"
    neighbours: list[str] = field(default_factory=list)  # recorded neighbours, submission order
    alone: Completion | None = None
    flipped: Completion | None = None
    concurrency: int | None = None  # smallest flipping concurrency found along the recorded order
    minimal: list[str] = field(default_factory=list)
    proven_minimal: bool = False
    reproduced: bool = False  # the minimal batch flips again in a fresh engine
    divergence: Divergence | None = None
    evidence: list[str] = field(default_factory=list)
    trials: int = 0
    trials_concurrency: int = 0
    trials_ddmin: int = 0
    seconds: float = 0.0
    repro_dir: str | None = None
    repro_lines: list[str] = field(default_factory=list)
    exhausted: bool = False  # the bounds ran out during the search

    @property
    def naive_concurrency(self) -> int:
        """A linear scan c = 2, 3, ... up to the flipping concurrency."""
        return max(0, (self.concurrency or len(self.neighbours) + 1) - 1)

    @property
    def naive_subsets(self) -> int:
        if not self.minimal:
            return 0
        return naive_trials((self.concurrency or len(self.neighbours) + 1) - 1, len(self.minimal))

    @property
    def naive(self) -> int:
        # alone, recorded batch, the scan, every subset of the prefix up to the size found, the verification (2)
        return 2 + self.naive_concurrency + self.naive_subsets + 2

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "found" and self.reproduced else 1

    def to_dict(self) -> dict:
        return {"bisect": self.session_id, "kind": "batch", "run": self.run_id, "key": self.key, "on": self.on,
                "status": self.status, "reason": self.reason, "source": self.source, "neighbours": self.neighbours,
                "alone": _out(self.alone), "flipped": _out(self.flipped), "concurrency": self.concurrency,
                "minimal": self.minimal, "proven_minimal": self.proven_minimal, "reproduced": self.reproduced,
                "divergence": to_json(self.divergence), "evidence": self.evidence,
                "engine_runs": self.trials, "naive_engine_runs": self.naive,
                "trials": {"total": self.trials, "concurrency_search": self.trials_concurrency,
                           "ddmin": self.trials_ddmin, "naive_concurrency_scan": self.naive_concurrency,
                           "naive_subsets": self.naive_subsets},
                "seconds": round(self.seconds, 2), "repro": self.repro_dir}

    def lines(self) -> list[str]:
        out = [f"bisect {self.session_id}: request {self.key!r} of run {self.run_id}, {len(self.neighbours)} recorded "
               f"neighbour(s) in {self.source}; a flip is a change in {self.on}"]
        if self.alone is not None:
            out.append(f"alone -> {_tokens(self.alone)}")
        if self.flipped is not None and self.minimal:
            out.append(f"with {{{', '.join(self.minimal)}}} -> {_tokens(self.flipped)}")
        d = self.divergence
        if d is not None:
            out.append(f"first divergent token: position {d.position} ({d.kind}): alone {d.reference_id} "
                       f"{d.reference_text!r} vs {d.other_id} {d.other_text!r}"
                       + (f"; alone's top-1 minus top-2 logprob there: {d.margin:.4g}" if d.margin is not None else ""))
        if self.concurrency is not None:
            out.append(f"smallest flipping concurrency: {self.concurrency} (target + the first {self.concurrency - 1} "
                       f"recorded neighbour(s) flips, {self.concurrency - 1} does not)")
        if self.status == "found":
            out.append("minimal neighbour set: " + ("1-minimal (removing any one of them stops the flip)"
                                                     if self.proven_minimal else "not proven minimal (bounds reached)"))
        else:
            out.append(f"inconclusive: {self.reason}")
        out += [f"evidence: {line}" for line in self.evidence]
        out.append(f"engine runs: {self.trials} trials in one engine + a fresh one, {self.seconds:.1f} s "
                   f"(concurrency search {self.trials_concurrency} vs a linear scan's {self.naive_concurrency}; "
                   f"neighbour-set search {self.trials_ddmin} vs {self.naive_subsets} subsets; a naive search would need "
                   f"{self.naive})")
        out += self.repro_lines
        out.append(f"trials: evalgate bisect show {self.session_id}")
        return out


def _out(c: Completion | None) -> dict | None:
    return None if c is None else {"token_ids": c.output_ids.tolist(), "text": c.text}


def _tokens(c: Completion, limit: int = 12) -> str:
    ids = " ".join(str(t) for t in c.output_ids[:limit].tolist()) + (" ..." if len(c.output_ids) > limit else "")
    return f"[{ids}] {c.text[:80]!r}"


def flipping_wave(record, run_id: int, key: str, prompts: dict[str, Prompt],
                  adapters: list[str]) -> tuple[Completion, Completion, list[str], list[str], list[str], dict[str, Prompt]]:
    """What the batch bisector takes apart: the request's reference output (its first pass, alone), the
    crowded output that differs from it, that wave's order (the request and its rebuildable neighbours),
    the neighbours, the lm-eval scoring neighbours left out, and the neighbours rebuilt rather than stored (the
    adapter_mix probe's, from `prompts`, the run's requests, and the suite's `adapters`). A ConfigError, naming
    the fix, where the request's variance is not about who shared its batch."""
    check_request(record, key)
    completions = record.outputs[key]
    passes = passes_of(record.run.schedule)
    disagreement = within_run(completions, passes)
    if disagreement is None:
        raise ConfigError(f"request {key!r} shows no batch variance in run {run_id}: its {len(completions)} pass(es) agree",
                          fix="pick a request whose verdict is batch_variance (`evalgate runs show "
                              f"{run_id}`), or use `evalgate repro` for a change against the baseline")
    # A probe's neighbours (needle fillers) are not stored, so only the schedule's own passes can be bisected,
    # and the adapter_mix probe's, whose neighbours are the run's own requests under other adapters (rebuilt).
    batch_differences = [d for d in disagreement.differences if (is_batch_factor(d.factor) or d.factor is None)
                         and d.other.probe in (None, ADAPTER_MIX)]
    if not batch_differences and any(d.other.probe for d in disagreement.differences):
        probes = ", ".join(sorted({d.other.probe for d in disagreement.differences if d.other.probe}))
        raise ConfigError(f"request {key!r} of run {run_id} varies only in probe passes ({probes}), whose companion "
                          "requests are not stored: the batch bisector cannot rebuild those batches",
                          fix=remedies(disagreement.factors))
    if not batch_differences:
        factors = ", ".join(words(f) for f in disagreement.factors)
        raise ConfigError(f"request {key!r} of run {run_id} varies under {factors}, not with who shares its batch: "
                          "the batch bisector cannot take that apart",
                          fix=remedies(disagreement.factors))
    by_pass = {c.pass_index: c for c in completions}
    reference = completions[0]  # the first pass: alone at the first concurrency level, cold
    flipping = [by_pass[d.other.index] for d in batch_differences if not d.other.probe
                and len(wave_of(record, key, d.other.index)) > 1 and first_divergence(reference, by_pass[d.other.index])]
    mixed = [d.other for d in batch_differences if d.other.probe == ADAPTER_MIX
             and first_divergence(reference, by_pass[d.other.index]) is not None]
    if not flipping and mixed:
        return (reference, by_pass[mixed[0].index], *_mixed_wave(key, prompts, mixed[0], adapters))
    if not flipping:
        raise ConfigError(f"request {key!r} of run {run_id} differs only between passes in which it ran alone: that is "
                          "not batch composition", fix="use `evalgate repro` to reproduce it")
    other = flipping[0]
    wave = wave_of(record, key, other.pass_index)
    skipped = [c.key for c in wave if c.key != key and record.requests[c.key].request_type not in ("generate", "generate_until")]
    neighbours = [c.key for c in wave if c.key != key and c.key not in skipped]
    if not neighbours:
        raise ConfigError(f"request {key!r} of run {run_id}: its crowded wave holds only lm-eval scoring requests, "
                          "which cannot be rebuilt from the store", fix="bisect a run of generation requests")
    order = [c.key for c in wave if c.key not in skipped]  # target + neighbours, recorded submission order
    return reference, other, order, neighbours, skipped, {}


def _mixed_wave(key: str, prompts: dict[str, Prompt], pass_, adapters: list[str]):
    """The adapter_mix probe's wave of `key` in `pass_`, rebuilt as the probe built it: its neighbours the
    run's next requests under other adapters, each named `neighbour i: <request> [adapter <name>]`."""
    found = mix_neighbours(prompts[key], list(prompts), prompts, pass_.concurrency - 1, adapters,
                           mixed=pass_.variant != MIX_CONTROL)
    named = [replace(p, key=f"neighbour {i + 1}: {p.key} [adapter {p.adapter or BASE_MODEL}]") for i, p in enumerate(found)]
    rebuilt = {p.key: p for p in named}
    return [key, *rebuilt], list(rebuilt), [], rebuilt


def bisect_batch(store: Store, run_id: int, key: str, *, on: str = "auto", repro_dir: Path | None = None,
                 bounds: Bounds | None = None, on_trial: TrialCallback | None = None) -> BatchResult:
    from ..execution.worker import call_in_worker, engine_log_path

    if on not in ("auto", "tokens", "bits"):
        raise ConfigError(f"--on {on!r}: expected tokens, bits or auto", fix="use --on tokens, --on bits or --on auto")
    if repro_dir is not None and Path(repro_dir).exists() and (not Path(repro_dir).is_dir() or any(Path(repro_dir).iterdir())):
        raise ConfigError(f"{repro_dir} exists and is not an empty directory",
                          fix="name a new directory for --repro (or remove the old one)")
    record = store.load(run_id)
    check_request(record, key)
    config = RunConfig.of(record)
    suite = suite_of(record, config)
    under = record.fingerprint.request_adapters  # each request under its own adapter, as it ran
    stored = {k: replace(prompt_of(record.requests[k]), adapter=under.get(k)) for k in record.requests}
    reference, other, order, neighbours, skipped, rebuilt = flipping_wave(record, run_id, key, stored,
                                                                         sorted(suite.adapters))
    divergence = first_divergence(reference, other)
    criterion = criterion_of(divergence) if on == "auto" else on
    source = f"pass {other.pass_index} (concurrency {other.concurrency}), wave {other.wave}" + (
        " (the adapter_mix probe's, its neighbours rebuilt)" if rebuilt else "")
    prompts = {k: rebuilt.get(k) or stored[k] for k in order}
    subject = {"run": run_id, "key": key, "on": criterion, "source": source, "neighbours": neighbours}
    bisection = Bisection(store, "batch", record.run.suite_name, subject, bounds=bounds, on_trial=on_trial)
    bounds = bisection.bounds
    result = BatchResult(bisection.session_id, run_id, key, criterion, source=source, neighbours=neighbours)
    if skipped:
        result.evidence.append(f"left out {len(skipped)} lm-eval scoring neighbour(s) (not rebuildable): {', '.join(skipped[:5])}")
    n = len(neighbours)
    # alone, recorded, binary search, ddmin (about 2 log2 n per culprit; assume 2), fresh alone + fresh minimal
    bisection.estimate = 2 + max(0, math.ceil(math.log2(n))) + 4 * max(1, math.ceil(math.log2(max(n, 2)))) + 2
    started = time.monotonic()
    forward = follow_trials(bisection, on_trial)
    search = BatchSearch(prompts, order, key, criterion)
    setup = SearchSetup(suite, store.url, "batch", bisection.session_id, subject, bounds, estimate=bisection.estimate)
    # the trial engines' own output (vLLM's lines) goes to a log beside the suite, as a run's does
    engine_log = engine_log_path(suite, "bisect-batch")
    with bisection.guard():
        result = call_in_worker(_search_job, {"setup": setup, "search": search, "result": result}, url=store.url,
                                progress=forward, env=config.worker_env(), engine_log=engine_log)
        bisection.steps = result.trials
        if result.alone is not None and reference.concurrency == 1:
            exact = same(reference, result.alone, "bits")
            result.evidence.append(f"alone in this engine {'equals' if exact else 'differs from'} run {run_id}'s "
                                   f"recorded alone output (pass {reference.pass_index}) "
                                   + ("bit for bit" if exact else "(another engine state or environment?)"))
        if result.minimal and result.flipped is not None:
            result.status = "found"
            result.divergence = first_divergence(result.alone, result.flipped)
            if not result.exhausted:
                again = replace(setup, steps_done=bisection.steps, elapsed=time.monotonic() - started,
                                estimate=bisection.steps + 2)
                verify = call_in_worker(_verify_job, {"setup": again, "search": search, "found": result},
                                        url=store.url, progress=forward, env=config.worker_env(), engine_log=engine_log)
                bisection.steps = verify.steps
                result.reproduced = verify.reproduced
                result.evidence += verify.evidence
                if not result.reproduced and not result.reason:
                    result.reason = verify.reason
        result.trials = bisection.steps
        result.seconds = time.monotonic() - started
        if repro_dir is not None and rebuilt:
            result.repro_lines = [f"no repro pack written to {repro_dir}: a pack replays stored requests, and the "
                                  "adapter_mix probe's neighbours are rebuilt (the minimal set above names them)"]
        elif repro_dir is not None and result.status == "found":
            batch = [k for k in order if k == key or k in result.minimal]
            pack = write_repro(store, run_id, key, Path(repro_dir), criterion=criterion, kind="bisect", batches=[
                ReproBatch("alone", [key], result.alone, f"bisect {bisection.session_id}: alone"),
                ReproBatch(f"with {{{', '.join(result.minimal)}}}", batch, result.flipped,
                           f"bisect {bisection.session_id}: minimal batch"),
            ])
            result.repro_dir = str(pack.path)
            result.repro_lines = [f"repro pack: {pack.path} (run: python {pack.path / 'repro.py'})"]
        elif repro_dir is not None:
            result.repro_lines = [f"no repro pack written to {repro_dir}: no flipping batch was found"]
        status = "complete" if result.exit_code == 0 and result.proven_minimal else "inconclusive"
        bisection.finish(status, result.to_dict())
    return result


# --- in the engine process ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchSearch:
    """What the batch search tries: the target among some of its recorded neighbours, in recorded order."""

    prompts: dict[str, Prompt]
    order: list[str]  # target + neighbours, recorded submission order
    target: str
    on: str  # tokens | bits


class _Trials(TrialEngine):
    """The batch search's trials: one engine, the target's output alone as the reference, and each batch
    tried at most once."""

    def __init__(self, setup: SearchSetup, search: BatchSearch, progress):
        super().__init__(setup, progress)
        self.prompts, self.order, self.target, self.on = search.prompts, search.order, search.target, search.on
        self.reference: Completion | None = None
        self.cache: dict[frozenset, tuple[bool, Completion]] = {}

    def run(self, keys: list[str]) -> Completion:
        self.engine.reset_cache()  # the offline engine forgets; a server you run keeps its own cache
        completions = self.engine.generate([self.prompts[k] for k in keys])
        return completions[keys.index(self.target)]

    def batch(self, neighbours, label: str, *, cached: bool = True) -> tuple[bool, Completion]:
        """Whether the target flips (differs from the reference) in a batch with `neighbours`."""
        chosen = set(neighbours)
        signature = frozenset(chosen)
        if cached and signature in self.cache:
            return self.cache[signature]
        keys = [k for k in self.order if k == self.target or k in chosen]
        got: list[Completion] = []

        def trial() -> TrialOutcome:
            c = self.run(keys)
            got.append(c)
            detail: dict[str, Any] = {"output_ids": c.output_ids.tolist()}
            if self.reference is None:
                return TrialOutcome("reference", detail=detail)
            div = first_divergence(self.reference, c)
            detail["divergence"] = to_json(div)
            return TrialOutcome("good" if same(self.reference, c, self.on) else "bad", detail=detail)

        outcome = self.bisection.trial(label, {"batch": keys, "size": len(keys)}, trial)
        answer = (outcome.outcome == "bad", got[0])
        if cached:
            self.cache[signature] = answer
        return answer


def _search_job(*, setup: SearchSetup, search: BatchSearch, result: BatchResult, progress, on_run) -> BatchResult:
    """The search, filling in `result`: alone, the recorded batch, the smallest flipping concurrency, then
    the minimal set of neighbours."""
    trials = _Trials(setup, search, progress)
    order, target = search.order, search.target
    neighbours = [k for k in order if k != target]
    try:
        _, alone = trials.batch([], "alone")
        trials.reference = result.alone = alone
        flips, crowded = trials.batch(neighbours, f"recorded batch ({len(order)} requests)")
        if not flips:
            result.reason = ("the flip does not reproduce in a fresh engine: the target gives the same output alone "
                             f"and in its recorded batch of {len(order)} (another engine state, prefix-cache hits, or "
                             "timing-dependent scheduling in the recorded run?)")
            return _finish_job(result, trials)
        # Smallest flipping concurrency along the recorded order: invariant lo does not flip, hi flips.
        lo, hi = 1, len(order)
        before = trials.bisection.steps
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if trials.batch(neighbours[: mid - 1], f"concurrency {mid}: target + first {mid - 1} neighbour(s)")[0]:
                hi = mid
            else:
                lo = mid
        result.trials_concurrency = trials.bisection.steps - before
        result.concurrency = hi
        prefix = neighbours[: hi - 1]
        result.flipped = trials.batch(prefix, "")[1]  # cached: the trial that decided hi
        trials.bisection.estimate = trials.bisection.steps + 4 * max(1, math.ceil(math.log2(max(len(prefix), 2)))) + 3

        def fails(subset: list[str]) -> bool:
            return trials.batch(subset, "with {" + ", ".join(subset) + "}")[0]

        before = trials.bisection.steps
        # Size or company? A batch of the same size with OTHER neighbours (as many as there are; the rest from
        # the prefix). If it flips too, the batch size drives the flip and the whole prefix is likely
        # 1-minimal: prove that directly (one trial per neighbour left out; leaving out the last one is the
        # c-1 trial already run), which costs c-2 trials where ddmin's worst case costs about 3(c-1).
        others = [k for k in neighbours if k not in prefix][: len(prefix)]
        shared = prefix[: len(prefix) - len(others)]
        size_driven = False
        if len(prefix) >= 2 and others:
            swap = [k for k in neighbours if k in others or k in shared]
            size_driven = trials.batch(swap, "control: same size, other neighbours {" + ", ".join(swap) + "}")[0]
            result.evidence.append(
                f"control: a batch of the same size ({hi}) with other neighbours ({', '.join(swap)}"
                + (f"; {len(shared)} shared with the flipping prefix" if shared else "") + ") "
                + ("flips it too: the batch size matters, not only which neighbours" if size_driven else
                   "does not flip it: which neighbours share the batch matters, not only its size"))
        start = prefix
        if size_driven:
            trials.bisection.estimate = trials.bisection.steps + len(prefix) + 2
            for i in reversed(range(len(prefix))):
                complement = prefix[:i] + prefix[i + 1:]
                if fails(complement):
                    start = complement  # a smaller flipping set: minimise from there
                    break
            else:
                start = None
        if start is None:
            minimal, proven = prefix, True  # no neighbour can be left out
        else:
            minimal, proven = ddmin(start, fails)
        result.trials_ddmin = trials.bisection.steps - before
        result.minimal, result.proven_minimal = minimal, proven
        result.flipped = trials.batch(minimal, "")[1]
        if not proven:
            result.reason, result.exhausted = "bounds reached during delta debugging: the set is not proven minimal", True
    except BudgetExhausted as exc:
        result.reason, result.exhausted = str(exc), True
        if result.concurrency is not None and not result.minimal:
            result.minimal = neighbours[: result.concurrency - 1]
    return _finish_job(result, trials)


def _finish_job(result: BatchResult, trials: _Trials) -> BatchResult:
    result.trials = trials.bisection.steps
    return result


def _verify_job(*, setup: SearchSetup, search: BatchSearch, found: BatchResult, progress, on_run) -> Verification:
    """The minimal batch in a fresh engine: the target alone, then among the minimal neighbours."""
    trials = _Trials(setup, search, progress)
    out = Verification()
    try:
        _, fresh_alone = trials.batch([], "verify in a fresh engine: alone")
        trials.reference = fresh_alone
        flips, fresh = trials.batch(found.minimal, "verify in a fresh engine: with {" + ", ".join(found.minimal) + "}")
    except BudgetExhausted as exc:
        out.reason = f"{exc} before the minimal batch was verified in a fresh engine"
        out.steps = trials.bisection.steps
        return out
    out.reproduced = flips
    out.evidence.append(
        f"fresh engine: alone {'==' if same(found.alone, fresh_alone, 'bits') else '!='} the search's alone, minimal "
        f"batch {'==' if same(found.flipped, fresh, 'bits') else '!='} the search's flipped output (bit for bit); the "
        "flip " + ("reproduces" if flips else "does NOT reproduce") + f" (on {search.on})")
    if not flips:
        out.reason = "the minimal batch does not flip the target again in a fresh engine"
    out.steps = trials.bisection.steps
    return out
