"""Replaying a trace (evalgate/configuration/trace.py) with the gated requests at their places in it.

Two placements (docs/traffic.md):

- **exact** (`step`): the in-process kinds (`vllm`, `fake`) hand over a `StepSession`. Events are added
  between engine steps and aborted by request id, so a replay is the same schedule every time: a request
  arrives at step s, leaves after n tokens or n steps. What wall-clock timing cannot promise.
- **timed**: the server kinds send each event at its offset in seconds (`TimedTraffic`, engines/server_traffic.py, on the engine's
  event loop) and the gated requests at their markers' offsets; the achieved arrival skew is recorded.

Traffic outputs are never stored. What the replay did is: `sent`, `completed`, `cancelled`, the running
count when each gated request arrived, and (timed) the arrival skew.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..configuration.trace import (
    DEFAULT_STEP_SECONDS,
    EXACT,
    TIMED,
    Trace,
    TraceRequest,
    arrival_order,
    materialize,
    replay_stats,
)
from ..errors import EngineError
from ..probes.base import COMPANION_PREFIX

if TYPE_CHECKING:
    from ..configuration.prompts import Prompt
    from ..engines import Engine
    from ..records import Completion

TRAFFIC_PREFIX = f"{COMPANION_PREFIX}trace-"
MAX_STEPS = 1_000_000  # a replay that has not drained by then is an engine that stopped making progress


class StepSession(Protocol):
    """What an in-process engine offers a replay: requests added and aborted between steps."""

    def add_traffic(self, request_id: str, request: TraceRequest, cache_salt: str | None) -> None: ...

    def add_gated(self, prompt: Prompt, cache_salt: str | None) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[tuple[str, int, bool]]:
        """Run one engine step: (request id, tokens received so far, finished) for each request that moved."""

    def running(self) -> int: ...

    def busy(self) -> bool: ...

    def completion(self, key: str) -> Completion:
        """A finished gated request's output."""


@dataclass(frozen=True)
class Salts:
    """A wave's prefix-cache salts (None: the engine cannot salt its cache): the recorded requests' (each
    request its own namespace, `engines.base.request_salt`) and the traffic's (one namespace shared by the
    trace's events, so a `prefix` event really shares its blocks)."""

    requests: str | None = None
    traffic: str | None = None


@dataclass
class ReplayResult:
    outputs: dict[str, Completion]
    stats: dict[str, Any] = field(default_factory=dict)


def replay(engine: Engine, trace: Trace, prompts: list[Prompt], salts: Salts, *, seed: int = 0,
           step_seconds: float = DEFAULT_STEP_SECONDS) -> tuple[list[Completion], dict[str, Any]]:
    """One wave's requests at their places in one replay of `trace`, as the engine places events. Returns
    their outputs in the wave's order and what the replay did. lm-eval scoring requests are prefills with
    nothing to decode among the traffic: they run as a plain wave beside the replay."""
    from ..configuration.prompts import SCORING_TYPES

    scored = [p for p in prompts if p.request_type in SCORING_TYPES]
    gated = [p for p in prompts if p.request_type not in SCORING_TYPES]
    outputs = {c.key: c for c in engine.generate(scored, cache_salt=salts.requests)} if scored else {}
    if not gated:
        stats = replay_stats(trace, engine.placement or "none")
    elif engine.placement == EXACT:
        result = replay_steps(engine, trace, gated, salts, seed=seed, step_seconds=step_seconds)
        outputs.update(result.outputs)
        stats = result.stats
    elif engine.placement == TIMED:
        completions, stats = engine.replay_timed(trace, gated, seed=seed, cache_salt=salts.requests,
                                                step_seconds=step_seconds)
        outputs.update((c.key, c) for c in completions)
    else:
        raise EngineError(f"the {engine.kind} engine cannot replay a trace")
    return [outputs[p.key] for p in prompts], stats


def replay_steps(engine: Engine, trace: Trace, gated: list[Prompt], salts: Salts = Salts(), *, seed: int = 0,
                 step_seconds: float = DEFAULT_STEP_SECONDS) -> ReplayResult:
    """Replay `trace` on an in-process engine with the `gated` requests at their places, step by step,
    salted with `salts`. The replay ends when the last gated request
    finishes: nothing later can change its output, so traffic still running is aborted (`stopped`) and
    events not yet due are not sent (`unsent`)."""
    arrivals = arrival_order(trace, materialize(trace, engine.encode, seed, step_seconds), gated, step_seconds)
    session: StepSession = engine.step_session()
    stats = replay_stats(trace, EXACT)
    active: dict[str, tuple[TraceRequest, int]] = {}  # traffic id -> (request, step it arrived)
    tokens: dict[str, int] = {}
    gated_keys = {p.key for p in gated}
    finished: set[str] = set()
    step = 0
    while arrivals or session.busy():
        while arrivals and arrivals[0][0] <= step:
            _, item = arrivals.pop(0)
            if isinstance(item, TraceRequest):
                request_id = TRAFFIC_PREFIX + item.id  # never a suite key (the companions' reserved prefix)
                session.add_traffic(request_id, item, salts.traffic)
                active[request_id] = (item, step)
                stats["sent"] += 1
            else:
                stats["gated_arrivals"].append({"key": item.key, "step": step, "running": session.running()})
                session.add_gated(item, salts.requests)
        for request_id, (request, arrived) in list(active.items()):
            cancel = request.cancel
            if cancel is None:
                continue
            leave = cancel.leave_step(step_seconds)
            if (step - arrived >= leave) if leave is not None else tokens.get(request_id, 0) >= cancel.amount:
                session.abort(request_id)
                del active[request_id]
                stats["cancelled"] += 1
        if not session.busy():
            if arrivals:
                step = max(step + 1, arrivals[0][0])  # idle until the next arrival
            continue
        for request_id, count, done in session.step():
            tokens[request_id] = count
            if done:
                if request_id in gated_keys:
                    finished.add(request_id)
                elif active.pop(request_id, None) is not None:
                    stats["completed"] += 1
        step += 1
        if finished == gated_keys:
            break
        if step > MAX_STEPS:
            raise EngineError(f"the replay of {trace.source} did not drain in {MAX_STEPS} engine steps")
    for request_id in active:
        session.abort(request_id)
    stats.update(steps=step, stopped=len(active), unsent=len(arrivals))
    missing = gated_keys - finished
    if missing:
        raise EngineError(f"the replay ended without finishing gated requests {sorted(missing)[:5]}")
    return ReplayResult({p.key: session.completion(p.key) for p in gated}, stats)


def total_stats(waves: list[dict[str, Any]]) -> dict[str, Any]:
    """A pass's replay record: the totals over its waves' replays, and each wave's own."""
    totals = {name: sum(w.get(name, 0) for w in waves)
              for name in ("sent", "completed", "cancelled", "failed", "stopped", "unsent")}
    first = waves[0] if waves else {}
    skews = [w["max_skew_seconds"] for w in waves if "max_skew_seconds" in w]
    return {"placement": first.get("placement"), "trace": first.get("trace"), **totals,
            **({"max_skew_seconds": max(skews)} if skews else {}), "waves": waves}
