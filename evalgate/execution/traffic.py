"""How a pass's waves meet the engine: alone (`Plain`), beside filler traffic that keeps a server's batch
full (`Filler`, a server engine's `[load]`), or each at its place in one replay of a trace (`Replay`).

Each is `run(engine, wave, salts) -> (completions, stats)` for one wave, inside `during(engine, pass_)`
for the whole pass; `pass_stats()` is what the traffic did in the pass, recorded with it
(`timings.passes[].load`). A wave that carries its own trace (a probe's: `Wave.trace`) is replayed in it
whatever the pass's traffic. `traffic_for` chooses; the runner never branches on it.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ..configuration.trace import DEFAULT_STEP_SECONDS, Trace
from .replay import Salts, replay, total_stats

if TYPE_CHECKING:
    from ..configuration.load import Load
    from ..configuration.schedule import Pass, Schedule
    from ..engines import Engine
    from ..probes import Wave
    from ..records import Completion


class Traffic:
    """What every traffic shares: the pass runs inside `during`, each wave through `run` (a wave that carries
    its own trace, a probe's, is replayed in it), and `pass_stats` is what the traffic did."""

    def __init__(self, seed: int = 0, step_seconds: float = DEFAULT_STEP_SECONDS):
        self.seed, self.step_seconds = seed, step_seconds
        self.replays: list[dict[str, Any]] = []

    def during(self, engine: Engine, pass_: Pass) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def run(self, engine: Engine, wave: Wave, salts: Salts) -> tuple[list[Completion], dict[str, Any] | None]:
        if wave.trace is not None:
            return self._replayed(engine, wave.trace, wave, salts)
        if salts.requests is None:
            return engine.generate(wave.prompts), None
        return engine.generate(wave.prompts, cache_salt=salts.requests), None

    def pass_stats(self) -> dict[str, Any] | None:
        return total_stats(self.replays) if self.replays else None

    def _replayed(self, engine: Engine, trace: Trace, wave: Wave, salts: Salts):
        # the traffic runs cold in each replay, so every replay is the same schedule
        completions, stats = replay(engine, trace, wave.prompts, salts, seed=self.seed, step_seconds=self.step_seconds)
        self.replays.append(stats)
        return completions, stats


class Plain(Traffic):
    """The wave submitted together, nothing else in the engine."""


class Replay(Traffic):
    """Each wave at its places in one replay of the suite's `[load] trace` (execution/replay.py)."""

    def __init__(self, trace: Trace, seed: int = 0, step_seconds: float = DEFAULT_STEP_SECONDS):
        super().__init__(seed, step_seconds)
        self.trace = trace

    def run(self, engine: Engine, wave: Wave, salts: Salts) -> tuple[list[Completion], dict[str, Any] | None]:
        return self._replayed(engine, wave.trace or self.trace, wave, salts)


class Filler(Traffic):
    """The pass runs while filler requests keep the server's batch full (`[load]` without a trace): the
    engine's `under_load` sends them on its event loop (`FillerTraffic`)."""

    def __init__(self, load: Load):
        super().__init__(load.seed, load.step_seconds)
        self.load = load
        self.stats: dict[str, Any] = {}

    @contextlib.contextmanager
    def during(self, engine: Engine, pass_: Pass):
        with engine.under_load(self.load, pass_) as stats:
            try:
                yield
            finally:
                self.stats = stats

    def pass_stats(self) -> dict[str, Any] | None:
        return super().pass_stats() or self.stats


def traffic_for(pass_: Pass, schedule: Schedule, trace: Trace | None) -> Traffic:
    """A pass's traffic: the suite's `[load]` for the schedule passes it applies to (`trace`: its trace, read
    once per run), else plain. A probe's passes are never loaded: their one factor is the probe's."""
    load = schedule.load
    if load is None:
        return Plain(schedule.seed)
    if not load.applies(pass_.concurrency) or pass_.probe:
        return Plain(load.seed, load.step_seconds)
    return Replay(trace, load.seed, load.step_seconds) if trace is not None else Filler(load)
