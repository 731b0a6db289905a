"""How a pass's waves meet the engine: alone (`Plain`), beside filler traffic that keeps a server's batch
full (`Filler`, a server engine's `[load]`), or each at its place in one replay of a trace (`Replay`).

Each is `run(engine, wave, salts) -> (completions, stats)` for one wave, inside `during(engine, pass_)`
for the whole pass; `pass_stats()` is what the traffic did in the pass, recorded with it
(`timings.passes[].load`). A wave that carries its own trace (a probe's: `Wave.trace`) is replayed in it
whatever the pass's traffic. `traffic_for` chooses; the runner never branches on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import string
import time
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


def filler_prompt(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(words))


class FillerTraffic:
    """Filler traffic on a server engine's event loop. `send(prompt, max_tokens)` is the engine's coroutine that
    sends one un-retried, un-recorded completion request; `running()` returns the server's count of running
    requests (from /metrics) or None when it cannot tell."""

    def __init__(self, load: Load, pass_index: int, send, running):
        self.load = load
        self.rng = random.Random(load.seed * 1_000_003 + pass_index)
        self.send, self.running = send, running
        self.stats: dict[str, Any] = {"filler": load.filler, "rate": load.rate, "sent": 0, "completed": 0,
                                      "failed": 0, "running_at_start": None, "warmup_seconds": 0.0}
        self.last_error: str | None = None
        self._tasks: set[asyncio.Task] = set()
        self._main: asyncio.Task | None = None

    async def start(self) -> None:
        """Start the filler and wait (up to `warmup` s) until the server reports it running."""
        self._main = asyncio.ensure_future(self._closed_loop() if self.load.rate == 0 else self._open_loop())
        t0 = time.perf_counter()
        target = self.load.filler if self.load.rate == 0 else 1
        while time.perf_counter() - t0 < self.load.warmup:
            await asyncio.sleep(0.1)
            running = await self.running()
            if running is None:  # no /metrics: give the requests a moment to reach the scheduler
                await asyncio.sleep(0.5)
                break
            self.stats["running_at_start"] = running
            if running >= target or self.stats["failed"]:
                break
        self.stats["warmup_seconds"] = round(time.perf_counter() - t0, 3)

    async def stop(self) -> dict[str, Any]:
        tasks = [t for t in (self._main, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.last_error:
            self.stats["last_error"] = self.last_error
        return dict(self.stats)

    async def _one(self) -> None:
        prompt = filler_prompt(self.rng, self.load.filler_prompt_words)
        self.stats["sent"] += 1
        try:
            await self.send(prompt, self.load.filler_max_tokens)
            self.stats["completed"] += 1
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a filler failure is counted; the suite's own requests decide the run
            self.stats["failed"] += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(0.2)  # a failing server is not hammered

    async def _closed_loop(self) -> None:
        async def worker():
            while True:
                await self._one()

        await asyncio.gather(*(worker() for _ in range(self.load.filler)))

    async def _open_loop(self) -> None:
        while True:
            await asyncio.sleep(self.rng.expovariate(self.load.rate))
            if len(self._tasks) < self.load.filler:
                task = asyncio.ensure_future(self._one())
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
