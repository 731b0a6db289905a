"""`evalgate fuzz SUITE --budget 10m`: search traffic for a schedule that changes a gated output, then
shrink it to a repro.

1. In ONE engine process: every gated request alone, cold (its reference); then trials. Trial 0 replays
   the seed trace (`--trace`, else `[load] trace`, else a synthetic one); trial n replays the seed with
   1 + n // 10 random mutations (mutate.py). Each trial is step-placed (replay.py: the same schedule
   every time), every gated request is compared bit for bit with its reference, and the trial is stored
   at once (`bisect_trials`: an interrupted fuzz can be read with `evalgate bisect show`). The search
   stops at the first trial that changes an output, or when --budget / --max-trials is spent.
2. Shrink, in the same engine: the request that changed is kept gated, the other gated requests become
   plain events, every event carries its token ids, and delta debugging (ddmin.py) finds a 1-minimal set
   of events that still changes it.
3. Verify in a FRESH engine process: alone, then the shrunk trace; it must change again.
4. A repro pack: the trace, the request, the outputs, and a plain vLLM script replaying the same steps.

Exit codes, as `check`'s (a fuzz tests the engine; a find is its failure): 0 nothing found within the budget,
1 found (the report says whether a fresh engine reproduced it), 2 bad input, 3 engine/infrastructure.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..codec import to_json
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.suite import Suite, load_suite, with_fail_on
from ..configuration.trace import (
    DEFAULT_STEP_SECONDS,
    Event,
    Trace,
    TraceRequest,
    arrival_order,
    load_trace,
    materialize,
    parse_trace,
)
from ..errors import ConfigError
from ..judgement.compare import first_divergence, max_logprob_delta
from ..records import Completion
from .ddmin import BudgetExhausted, ddmin
from .mutate import Shape, in_steps, mutate, synthetic_trace
from .repro import template
from .search import SearchSetup, TrialEngine, Verification, follow_trials
from .session import Bisection, Bounds, TrialCallback, TrialOutcome
from .trials import same

KIND = "fuzz"
SHRINK_TRIALS = 200  # ddmin's own bound (--shrink-trials), over the search's


@dataclass
class FuzzResult:
    session_id: int
    suite_name: str
    on: str = "bits"  # what counts as a change: bits (ids or any logprob bit) | tokens (ids: [gate] fail_on)
    status: str = "not_found"  # found | not_found
    key: str | None = None
    trials: int = 0
    search_trials: int = 0
    seconds: float = 0.0
    engine_seconds: float = 0.0  # in engine processes: starts, references and trials
    engine_start_seconds: float = 0.0  # of which starting them
    seed_events: int = 0
    mutations: list[str] = field(default_factory=list)
    trace: str | None = None  # the trial that changed an output (JSONL)
    shrunk: str | None = None  # its 1-minimal events (JSONL)
    shrunk_events: int | None = None
    proven_minimal: bool = False
    reproduced: bool | None = None
    divergence: dict | None = None
    reference_ids: list[int] | None = None
    observed_ids: list[int] | None = None
    best: dict | None = None  # the best candidate: the smallest trace found that changes the output
    repro_dir: str | None = None
    reason: str = ""
    # a shrunk trace that cancels: whether the abort path is needed ("cancel") or the same neighbours finishing
    # on the same steps change it too ("neighbours": batch sharing); None: no cancel left to tell
    cause: str | None = None
    # at the tokens level: trials where a gated request drifted in logprob bits alone (passed over), and the requests
    drift_trials: int = 0
    drift_keys: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        """As `check`: 0 nothing found, 1 a find (reproduced or not: the report says which). Not the bisectors'
        convention (0 = the culprit found): a fuzz is a test of the engine, and a find is its failure."""
        return 1 if self.status == "found" else 0

    @property
    def trials_per_engine_minute(self) -> float:
        return self.trials / (self.engine_seconds / 60) if self.engine_seconds else 0.0

    def to_dict(self) -> dict:
        return {"fuzz": self.session_id, **{k: v for k, v in vars(self).items() if k != "session_id"},
                "trials_per_engine_minute": round(self.trials_per_engine_minute, 2)}

    def lines(self) -> list[str]:
        head = f"fuzz {self.session_id} — suite {self.suite_name!r}: "
        rate = f"{self.trials} trials in {self.seconds:.0f} s ({self.trials_per_engine_minute:.1f} per engine-minute)"
        what = "a token" if self.on == "tokens" else "an output"
        drift = ([f"  passed over: {self.drift_trials} trial(s) drifted in logprob bits alone "
                  f"({', '.join(self.drift_keys[:5])}): fail_on = \"tokens\" lets that pass"] if self.drift_trials else [])
        if self.status != "found":
            return [head + f"NOT FOUND: no trial changed {what} ({self.search_trials} search trials, {rate})",
                    f"  {self.reason}" if self.reason else "  raise --budget or --max-trials, or seed it with --trace",
                    *drift]
        div = self.divergence or {}
        lines = [head + f"FOUND: request {self.key!r} changes {'its tokens ' if self.on == 'tokens' else ''}under trial "
                        f"{self.search_trials} "
                        f"({' + '.join(self.mutations)}), at token {div.get('position')} ({div.get('kind')})",
                 f"  shrunk to {self.shrunk_events} event(s)" + (" (1-minimal)" if self.proven_minimal else
                                                                 " (not proven minimal: the budget ran out)"),
                 "  reproduced in a fresh engine" if self.reproduced else
                 f"  did NOT reproduce in a fresh engine: {self.reason or 'the output equalled its alone reference'}",
                 f"  {rate}", *drift]
        if self.cause == "cancel":
            lines.insert(2, "  the cancel is needed: the same neighbours finishing on the same steps leave it unchanged "
                            "(vLLM's abort path: report it with the repro pack)")
        elif self.cause == "neighbours":
            lines.insert(2, "  the cancel is not needed: the same neighbours finishing on the same steps change it too "
                            "(sharing the batch, not the abort path)")
        if self.repro_dir:
            lines.append(f"repro pack: {self.repro_dir} (run: python {Path(self.repro_dir) / 'repro.py'})")
        return lines


def parse_budget(text: str) -> float:
    """'90s', '10m', '1h', or plain seconds."""
    value = text.strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(value[-1:], None)
    try:
        seconds = float(value[:-1] if scale else value) * (scale or 1)
    except ValueError:
        seconds = -1
    if not seconds > 0:
        raise ConfigError(f"--budget {text!r}: not a duration", fix="write e.g. --budget 10m, 90s or 1h")
    return seconds


def gated_prompts(suite: Suite, keys: list[str] | None) -> list[Prompt]:
    prompts = [p for p in suite.prompts if p.request_type not in SCORING_TYPES]
    if keys:
        known = {p.key for p in prompts}
        missing = [k for k in keys if k not in known]
        if missing:
            raise ConfigError(f"{suite.path}: no generation request {missing[0]!r}",
                              fix="pass --key with a request id of the prompts file")
        prompts = [p for p in prompts if p.key in keys]
    if not prompts:
        raise ConfigError(f"{suite.path}: no generation requests to gate", fix="fuzz a suite with prompts")
    return prompts


def fuzz(suite_path: Path | str, *, budget: float, max_trials: int = 1000, keys: list[str] | None = None,
         trace_path: Path | str | None = None, events: int = 8, seed: int = 0, repro_dir: Path | str | None = None,
         database: str | None = None, shrink_trials: int = SHRINK_TRIALS, fail_on: str | None = None,
         on_trial: TrialCallback | None = None) -> FuzzResult:
    """Search the traffic around the gated requests for one that changes an output, at the level the gate
    fails on (`fail_on`, default the suite's `[gate] fail_on`: "bits", or "tokens", which passes over
    bits-only drift), shrink it, verify it in a fresh engine and write the repro pack."""
    from ..engines import engine_class
    from ..execution.worker import call_in_worker, engine_log_path
    from ..store import open_store

    suite = load_suite(suite_path, database=database)
    if fail_on is not None:
        suite = with_fail_on(suite, fail_on)
    on = suite.gate.fail_on
    trace_path = Path(trace_path) if trace_path is not None else None
    repro_dir = Path(repro_dir) if repro_dir is not None else None
    placement = engine_class(suite.engine_kind).placement
    if placement != "step":
        raise ConfigError(f"{suite.path}: fuzz needs exact placement, and the {suite.engine_kind} engine places "
                          f"events {'by wall clock' if placement else 'not at all'}",
                          fix='fuzz with `engine.kind = "vllm"` (events land between engine steps, so a shrunk trace '
                              "replays the same schedule); replay a trace against a server with [load] trace")
    if min(max_trials, events, shrink_trials) < 1:
        raise ConfigError("--max-trials, --shrink-trials and --events must be >= 1", fix="e.g. --max-trials 200 --events 8")
    gated_prompts(suite, keys)
    load = suite.schedule.load
    seed_trace = load_trace(trace_path) if trace_path else (load.load_trace() if load and load.trace else None)
    step_seconds = load.step_seconds if load else DEFAULT_STEP_SECONDS
    if repro_dir is not None and repro_dir.exists() and (not repro_dir.is_dir() or any(repro_dir.iterdir())):
        raise ConfigError(f"{repro_dir} exists and is not an empty directory", fix="name a new directory for --repro")
    store = open_store(suite.database)
    subject = {"suite": str(suite.path), "budget_seconds": budget, "max_trials": max_trials, "keys": keys,
               "seed_trace": seed_trace.source if seed_trace else f"synthetic ({events} events)", "seed": seed, "on": on}
    bisection = Bisection(store, KIND, suite.name, subject, on_trial=on_trial,
                          bounds=Bounds(max_steps=max_trials + shrink_trials + 2, max_seconds=2 * budget + 600))
    result = FuzzResult(bisection.session_id, suite.name, on)
    started = time.monotonic()

    forward = follow_trials(bisection, on_trial)
    setup = SearchSetup(suite, store.url, KIND, bisection.session_id, subject)
    search = FuzzSearch(keys, seed, step_seconds, seed_trace.to_jsonl() if seed_trace else None, events, budget,
                        max_trials, shrink_trials, on)
    engine_log = engine_log_path(suite, "fuzz")
    with bisection.guard():
        result = call_in_worker(_search_job, {"setup": setup, "search": search, "result": result}, url=store.url,
                                progress=forward, engine_log=engine_log)
        if result.status == "found" and result.shrunk:
            again = replace(setup, steps_done=result.trials, estimate=result.trials)
            verify = call_in_worker(_verify_job, {"setup": again, "search": search, "found": result}, url=store.url,
                                    progress=forward, engine_log=engine_log)
            result.reproduced, result.trials = verify.reproduced, verify.steps
            result.engine_seconds += verify.engine_seconds
            result.engine_start_seconds += verify.engine_start_seconds
            if not result.reproduced:
                result.reason = "the shrunk trace left the output equal to its alone reference in a fresh engine"
            if repro_dir is None:
                repro_dir = suite.root / ".evalgate" / "fuzz" / str(bisection.session_id)
            result.repro_dir = str(write_pack(repro_dir, suite, result))
        result.seconds = time.monotonic() - started
        bisection.finish("complete" if result.status == "found" and result.reproduced else "inconclusive",
                         result.to_dict())
    return result


# --- in the engine process ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FuzzSearch:
    """What the fuzz search replays: the gated requests (`keys`; None: every generation request), how traces
    are seeded and placed, where it starts (`seed_trace`, JSONL; None: `events` synthetic ones) and its bounds."""

    keys: list[str] | None
    seed: int
    step_seconds: float
    seed_trace: str | None = None
    events: int = 8
    budget: float = 0.0
    max_trials: int = 0
    shrink_trials: int = SHRINK_TRIALS
    on: str = "bits"  # what counts as a change: bits | tokens


class _Trials(TrialEngine):
    """The fuzz search's trials: one engine, the gated requests' alone references, every replay stored."""

    def __init__(self, setup: SearchSetup, search: FuzzSearch, progress, keys: list[str] | None = None):
        from ..execution.runner import tokenize_prompts

        super().__init__(setup, progress)
        tokenize_prompts(setup.suite, self.engine)  # a prompt that does not fit: exit 2, before any trial
        self.prompts = gated_prompts(setup.suite, keys if keys is not None else search.keys)
        self.seed, self.step_seconds, self.on = search.seed, search.step_seconds, search.on
        self.drift_trials, self.drift_keys = 0, []
        self.engine_started = time.monotonic() - self.started
        self.best: dict | None = None
        self.reference = {p.key: self.engine.generate([p], cache_salt=uuid.uuid4().hex)[0] for p in self.prompts}

    def replay(self, trace: Trace, prompts: list[Prompt]) -> dict[str, Completion]:
        from ..execution.replay import Salts, replay_steps

        fresh = uuid.uuid4().hex  # cold: no trial reuses another's cache, so a trial replays one schedule
        return replay_steps(self.engine, trace, prompts, Salts(fresh, fresh + "-t"), seed=self.seed,
                            step_seconds=self.step_seconds).outputs

    def trial(self, label: str, trace: Trace, prompts: list[Prompt], *,
              progress_line: bool = True) -> tuple[list[str], dict[str, Completion]]:
        """Replay and store one trial; returns the gated keys whose output changed, and the outputs."""
        got: dict[str, Completion] = {}

        def run() -> TrialOutcome:
            got.update(self.replay(trace, prompts))
            changed = [p.key for p in prompts if not same(self.reference[p.key], got[p.key], self.on)]
            detail: dict[str, Any] = {"changed": changed, "events": len(trace.traffic)}
            drifted = [p.key for p in prompts if p.key not in changed and not same(self.reference[p.key], got[p.key])]
            if drifted:  # passed over at the tokens level: counted, never a finding
                detail["drift"] = drifted
                self.drift_trials += 1
                self.drift_keys += [k for k in drifted if k not in self.drift_keys]
            if changed:
                div = first_divergence(self.reference[changed[0]], got[changed[0]])
                detail["divergence"] = to_json(div)
                detail["max_logprob_delta"] = max_logprob_delta(self.reference[changed[0]], got[changed[0]])
                if self.best is None or len(trace.traffic) < self.best["events"]:
                    self.best = {"trial": self.bisection.steps + 1, "events": len(trace.traffic), "key": changed[0]}
            return TrialOutcome("bad" if changed else "good", detail=detail)

        if progress_line:  # the search's and the shrink's: elapsed time and the best candidate so far
            best = f"{self.best['events']} events (trial {self.best['trial']})" if self.best else "none yet"
            label = f"{label} | {time.monotonic() - self.started:.0f} s | best: {best}"
        outcome = self.bisection.trial(label,
                                       {"trace": trace.to_jsonl().splitlines()}, run)
        return outcome.detail["changed"], got


def _search_job(*, setup: SearchSetup, search: FuzzSearch, result: FuzzResult, progress, on_run) -> FuzzResult:
    """Mutate the seed trace until a gated request's output changes, shrink that trace to a 1-minimal set
    of events, and tell a cancel's abort path from the neighbours finishing; fills in `result`."""
    trials = _Trials(setup, search, progress)
    engine = trials.engine
    t0 = time.monotonic()
    budget, max_trials = search.budget, search.max_trials
    max_tokens = max(int(trials.engine.suite.sampling_for(p)["max_tokens"]) for p in trials.prompts)
    shape = Shape(engine.max_model_len, engine.kv_block_size, engine.capture_sizes, max_tokens)
    rng = random.Random(search.seed)
    seed = in_steps(parse_trace(search.seed_trace.splitlines(), "seed trace"), search.step_seconds) \
        if search.seed_trace else synthetic_trace(search.events, rng, shape)
    result.seed_events = len(seed.traffic)
    found: tuple[Trace, list[str], dict[str, Completion]] | None = None
    n = 0
    while n < max_trials and time.monotonic() - t0 < budget:
        trace, names = (seed, ["seed"]) if n == 0 else mutate(seed, rng, shape, 1 + n // 10)
        n += 1
        changed, got = trials.trial(f"trial {n}: {' + '.join(names)} ({len(trace.traffic)} events)", trace, trials.prompts)
        if changed:
            found = (trace, names, got)
            break
    result.search_trials = n
    if found is None:
        result.reason = (f"--max-trials {max_trials} reached" if n >= max_trials else f"--budget {budget:g} s spent")
    else:
        trace, names, got = found
        key = next(p.key for p in trials.prompts if not same(trials.reference[p.key], got[p.key], trials.on))
        result.status, result.key, result.mutations, result.trace = "found", key, names, trace.to_jsonl()
        shrunk, proven = shrink(trials, trace, key, search.shrink_trials)
        target = trials.reference[key]
        result.shrunk = shrunk.to_jsonl() if shrunk else None
        result.shrunk_events = len(shrunk.traffic) if shrunk else None
        result.proven_minimal, result.reference_ids = proven, target.output_ids.tolist()
        result.cause = cancel_or_neighbours(trials, shrunk, key) if shrunk else None
        observed = trials.replay(shrunk, [_prompt(trials, key)])[key] if shrunk else got[key]
        div = first_divergence(target, observed)
        result.observed_ids, result.divergence = observed.output_ids.tolist(), to_json(div)
        if shrunk is None:
            result.reason = "the change needs the other gated requests where they were: it was not shrunk"
    result.trials = trials.bisection.steps
    result.best = trials.best
    result.drift_trials, result.drift_keys = trials.drift_trials, trials.drift_keys
    result.engine_seconds = trials.engine_started + (time.monotonic() - t0)
    result.engine_start_seconds = trials.engine_started
    return result


def _prompt(trials: _Trials, key: str) -> Prompt:
    return next(p for p in trials.prompts if p.key == key)


def isolate(trials: _Trials, trace: Trace, key: str) -> Trace:
    """The trial's trace with only `key` gated: every other gated request becomes a plain event where the replay
    added it (`arrival_order`: its step, and its place among that step's events), and every event carries its
    token ids (a shrunk subset never loses a shared prefix)."""
    engine = trials.engine
    requests = materialize(trace, engine.encode, trials.seed, trials.step_seconds)
    by_id = {e.id: e for e in trace.traffic}
    taken = {e.id for e in trace.events}
    events: list[Event] = []
    for step, item in arrival_order(trace, requests, trials.prompts, trials.step_seconds):
        if isinstance(item, TraceRequest):
            prompt_ids = item.prompt_ids if item.prompt_ids is not None else tuple(engine.encode(item.text))
            events.append(replace(by_id[item.id], offset=float(step), prompt=None, tokens=None, prefix_of=None,
                                  prefix_tokens=0, prompt_ids=prompt_ids))
        elif item.key == key:
            events.append(Event(0, next(i for i in ("gated", "gated-marker", f"gated-{key}-marker") if i not in taken),
                                float(step), gated=True))
        else:
            events.append(Event(0, f"gated-{item.key}", float(step), prompt_ids=tuple(engine.tokenize(item)),
                                max_tokens=int(engine.suite.sampling_for(item)["max_tokens"])))
    return Trace(tuple(events), "step", trace.source)


def shrink(trials: _Trials, trace: Trace, key: str, budget: int = SHRINK_TRIALS) -> tuple[Trace | None, bool]:
    """A 1-minimal set of the trial's events under which `key` still changes (ddmin), or (None, False)
    when it does not change with only itself gated."""
    whole = isolate(trials, trace, key)
    prompt = [_prompt(trials, key)]
    start = trials.bisection.steps

    def fails(events: list[Event]) -> bool:
        if trials.bisection.steps - start >= budget:
            raise BudgetExhausted(f"--shrink-trials {budget} reached")
        changed, _ = trials.trial(f"shrink: {len(events)} of {len(whole.traffic)} events", whole.keeping(events), prompt)
        return bool(changed)

    if not fails(list(whole.traffic)):
        return None, False
    events, proven = ddmin(whole.traffic, fails)
    return whole.keeping(events), proven


def cancel_or_neighbours(trials: _Trials, shrunk: Trace, key: str) -> str | None:
    """A shrunk trace that still cancels is tried once more with every cancel replaced by the neighbour
    finishing on the same step (its `max_tokens`): the batch has the same shape, only the abort path is gone.
    "cancel" if that leaves the output unchanged, "neighbours" if it changes it too; None without a cancel."""
    cancelling = [e for e in shrunk.traffic if e.cancels]
    if not cancelling:
        return None
    finished = [replace(e, cancel=None, max_tokens=min(e.cancel.tokens_received(trials.step_seconds), e.max_tokens))
                if e.cancels else e for e in shrunk.traffic]
    changed, _ = trials.trial(f"control: {len(cancelling)} cancel(s) as neighbours finishing on the same steps",
                              shrunk.keeping(finished), [_prompt(trials, key)])
    return "neighbours" if changed else "cancel"


def _verify_job(*, setup: SearchSetup, search: FuzzSearch, found: FuzzResult, progress, on_run) -> Verification:
    """The shrunk trace replayed in a fresh engine around its one gated request."""
    trials = _Trials(setup, search, progress, keys=[found.key])
    trace = parse_trace(found.shrunk.splitlines(), "shrunk trace")
    changed, _ = trials.trial(f"verify in a fresh engine: {len(trace.traffic)} events", trace, trials.prompts,
                              progress_line=False)
    return Verification(reproduced=bool(changed), steps=trials.bisection.steps, engine_seconds=trials.engine_seconds(),
                        engine_start_seconds=trials.engine_started)


# --- the repro pack -------------------------------------------------------------------------------------------

def write_pack(directory: Path, suite: Suite, result: FuzzResult) -> Path:
    """trace.jsonl (the shrunk events, in steps), request.json, outputs.json, engine.json, repro.py (plain
    vLLM, no evalgate) and README.md."""
    from ..atomic import atomic_path
    from ..fingerprint import env_snapshot

    prompt = next(p for p in suite.prompts if p.key == result.key)
    directory.mkdir(parents=True, exist_ok=True)
    files = {
        "trace.jsonl": result.shrunk,
        "request.json": json.dumps({"key": prompt.key, "prompt": prompt.text, "messages": prompt.messages,
                                    "prompt_ids": list(prompt.prompt_ids) if prompt.prompt_ids else None,
                                    "sampling": suite.sampling_for(prompt)}, indent=2),
        "outputs.json": json.dumps({"alone": result.reference_ids, "in_trace": result.observed_ids,
                                    "divergence": result.divergence, "reproduced": result.reproduced,
                                    "on": result.on}, indent=2),
        "engine.json": json.dumps({"model": str(suite.model), "tokenizer": str(suite.tokenizer or suite.model),
                                   "engine_args": suite.engine_args, "env": env_snapshot(), "seed": 0}, indent=2,
                                  default=str),
        "repro.py": template("repro_trace.py"),
        "README.md": template("fuzz_README.md").format(key=result.key, session=result.session_id, events=result.shrunk_events,
                                   mutations=" + ".join(result.mutations), suite=suite.path, on=result.on,
                                   reproduced="reproduced" if result.reproduced else "did NOT reproduce"),
    }
    for name, text in files.items():
        with atomic_path(directory / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return directory
