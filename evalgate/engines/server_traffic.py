"""The traffic a server engine runs on its own event loop beside the requests it records: a trace sent at its
offsets (`TimedTraffic`, the timed placement of evalgate/execution/replay.py) and filler load (`FillerTraffic`,
docs/traffic.md). Their outputs are never stored; what they did is.
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from typing import TYPE_CHECKING, Any

from ..configuration.trace import DEFAULT_STEP_SECONDS, TIMED, Trace, TraceRequest, replay_stats

if TYPE_CHECKING:
    from ..configuration.load import Load


class TimedTraffic:
    """A trace sent at its offsets on a server engine's event loop (timed placement). `send(request)` is the
    engine's coroutine for one un-retried, un-recorded request; a cancel closes it after its seconds (a
    `tokens` or `steps` cancel is turned into seconds with `step_seconds`: HTTP cannot count tokens
    without streaming)."""

    def __init__(self, trace: Trace, requests: list[TraceRequest], send, step_seconds: float = DEFAULT_STEP_SECONDS):
        self.trace, self.requests, self.send, self.step_seconds = trace, requests, send, step_seconds
        self.stats = replay_stats(trace, TIMED)
        self.stats["skew_seconds"] = []
        self._tasks: list[asyncio.Task] = []
        self._main: asyncio.Task | None = None
        self.started = 0.0

    async def start(self) -> None:
        self.started = time.perf_counter()
        self._main = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        for request in self.requests:
            delay = request.seconds - (time.perf_counter() - self.started)
            if delay > 0:
                await asyncio.sleep(delay)
            self.stats["skew_seconds"].append(round(time.perf_counter() - self.started - request.seconds, 4))
            self._tasks.append(asyncio.ensure_future(self._one(request)))

    def _leave_after(self, request: TraceRequest) -> float | None:
        return request.cancel.leave_seconds(self.step_seconds) if request.cancel is not None else None

    async def _one(self, request: TraceRequest) -> None:
        self.stats["sent"] += 1
        leave = self._leave_after(request)
        try:
            await asyncio.wait_for(self.send(request), timeout=leave)
            self.stats["completed"] += 1
        except asyncio.TimeoutError:
            self.stats["cancelled"] += 1  # the client left: wait_for closed its connection
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a traffic failure is counted; the gated requests decide the run
            self.stats["failed"] += 1
            self.stats["last_error"] = f"{type(exc).__name__}: {exc}"

    async def wait_until(self, seconds: float) -> float:
        """Sleep until `seconds` into the replay; returns the achieved skew."""
        delay = seconds - (time.perf_counter() - self.started)
        if delay > 0:
            await asyncio.sleep(delay)
        return round(time.perf_counter() - self.started - seconds, 4)

    async def stop(self) -> dict[str, Any]:
        """The gated requests are done: send nothing more, close the traffic still running (`stopped`)."""
        if self._main is not None:
            self._main.cancel()
            await asyncio.gather(self._main, return_exceptions=True)
        running = [t for t in self._tasks if not t.done()]
        for task in running:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        skews = self.stats.pop("skew_seconds")
        self.stats["stopped"] = len(running)
        self.stats["unsent"] = len(self.requests) - self.stats["sent"]
        self.stats["max_skew_seconds"] = max(skews, default=0.0)
        return dict(self.stats)


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
