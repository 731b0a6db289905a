"""A bisect session: trials recorded as they are decided, progress, and bounds.

A trial is one engine run (a commit, a set of settings, a batch of requests). `Bisection.trial` times it,
stores it in `bisect_trials` at once (an interrupted bisect can be read afterwards with `evalgate bisect
show`), reports progress as "trial N of ~estimate", and raises BudgetExhausted before a trial that would
pass --max-steps or start after --max-seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..hashing import jsonable
from ..store import Store
from .ddmin import BudgetExhausted


@dataclass
class Bounds:
    max_steps: int = 64  # trials (engine runs) at most
    max_seconds: float = 3600.0  # no trial starts after this many seconds


@dataclass
class TrialOutcome:
    outcome: str  # good | bad | skip | error | reference
    run_id: int | None = None
    detail: dict = field(default_factory=dict)


# on_trial(step, estimate, label, outcome, seconds): called after each trial (the CLI prints a line).
TrialCallback = Callable[[int, int, str, TrialOutcome, float], None]


class Bisection:
    def __init__(self, store: Store, kind: str, suite_name: str | None, subject: dict, *,
                 bounds: Bounds | None = None, on_trial: TrialCallback | None = None, session_id: int | None = None):
        self.store = store
        self.bounds = bounds or Bounds()
        self.on_trial = on_trial
        self.session_id = session_id if session_id is not None else store.start_bisect(kind, suite_name, subject)
        self.steps = 0
        self.estimate = 0
        self.started = time.monotonic()

    def trial(self, label: str, config: dict, run: Callable[[], TrialOutcome]) -> TrialOutcome:
        if self.steps >= self.bounds.max_steps:
            raise BudgetExhausted(f"--max-steps {self.bounds.max_steps} reached")
        if time.monotonic() - self.started > self.bounds.max_seconds:
            raise BudgetExhausted(f"--max-seconds {self.bounds.max_seconds:g} reached")
        t0 = time.monotonic()
        result = run()
        seconds = time.monotonic() - t0
        self.steps += 1
        self.estimate = max(self.estimate, self.steps)
        self.store.add_trial(self.session_id, label=label, config=jsonable(config), outcome=result.outcome,
                             run_id=result.run_id, detail=jsonable(result.detail), seconds=seconds)
        if self.on_trial:
            self.on_trial(self.steps, self.estimate, label, result, seconds)
        return result

    def finish(self, status: str, result: dict | None = None, error: str | None = None) -> None:
        self.store.finish_bisect(self.session_id, status, jsonable(result) if result is not None else None, error)

    def guard(self):
        """Context manager: an error or interrupt marks the session failed / interrupted before it propagates."""
        return _Guard(self)


class _Guard:
    def __init__(self, bisection: Bisection):
        self.bisection = bisection

    def __enter__(self):
        return self.bisection

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            return False
        status = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed"
        try:
            self.bisection.finish(status, error=f"{exc_type.__name__}: {exc}")
        except Exception:
            pass  # never hide the bisect's own error behind a bookkeeping one
        return False
