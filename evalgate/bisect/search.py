"""One trial search in an engine's process: what `bisect batch` and `fuzz` share.

Both start one engine in a supervised child (execution/worker.py), try many inputs on it (batches of the
recorded neighbours; traces of traffic) against the gated requests' outputs alone, and store every trial as
it is decided. The parent passes a `SearchSetup` whole; the child's `TrialEngine` holds the engine and a
Bisection that stores each trial and reports it back as a `TrialMessage` (the worker protocol's progress
message), which `follow_trials` hands to the parent's Bisection and callback. A fresh engine then checks
what the search found: a `Verification` comes back. Job results are typed values, never dicts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from .session import Bisection, Bounds, TrialCallback, TrialOutcome

if TYPE_CHECKING:
    from ..configuration.suite import Suite


@dataclass(frozen=True)
class TrialMessage:
    """One decided trial, as the engine's process reports it to the parent."""

    label: str
    outcome: TrialOutcome
    seconds: float


@dataclass(frozen=True)
class SearchSetup:
    """What a search's engine process needs, passed whole: the suite its engine starts from, the session its
    trials are stored in, the bounds, and (for a second process) how far the search already got."""

    suite: Suite
    url: str
    kind: str  # the bisect session's kind: "batch" | "fuzz"
    session_id: int
    subject: dict[str, Any]
    bounds: Bounds = field(default_factory=lambda: Bounds(max_steps=10**9, max_seconds=float("inf")))
    steps_done: int = 0
    estimate: int = 0
    elapsed: float = 0.0  # seconds the search had spent before this process (the bounds count from its start)


@dataclass
class Verification:
    """A fresh engine's answer to what the search found: whether it reproduced, and why not."""

    reproduced: bool = False
    reason: str = ""
    evidence: list[str] = field(default_factory=list)
    steps: int = 0
    engine_seconds: float = 0.0
    engine_start_seconds: float = 0.0


class TrialEngine:
    """One engine and a Bisection that stores every trial and relays it to the parent (in the child)."""

    def __init__(self, setup: SearchSetup, progress: Callable[[int, int, Any], None]):
        from ..engines import start_engine
        from ..store import open_store

        def relay(step: int, estimate: int, label: str, outcome: TrialOutcome, seconds: float) -> None:
            progress(step, estimate, TrialMessage(label, outcome, seconds))

        self.started = time.monotonic()
        self.bisection = Bisection(open_store(setup.url), setup.kind, setup.suite.name, setup.subject,
                                   bounds=setup.bounds, on_trial=relay, session_id=setup.session_id)
        self.bisection.steps, self.bisection.estimate = setup.steps_done, setup.estimate
        self.bisection.started -= setup.elapsed
        self.suite = setup.suite
        self.engine = start_engine(setup.suite)
        self.engine_started = time.monotonic() - self.started

    def engine_seconds(self) -> float:
        return time.monotonic() - self.started


def follow_trials(bisection: Bisection, on_trial: TrialCallback | None) -> Callable[[int, int, TrialMessage], None]:
    """The parent's end of the relay: each trial the child decided advances the parent's Bisection (its
    steps and estimate) and reaches the callback (the CLI's progress line)."""
    def forward(step: int, estimate: int, message: TrialMessage) -> None:
        bisection.steps, bisection.estimate = step, estimate
        if on_trial:
            on_trial(step, estimate, message.label, message.outcome, message.seconds)

    return forward
