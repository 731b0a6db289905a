"""Busy-batch load: filler traffic that keeps a server's batch full while a pass runs (server engines only).

In production a request shares its batch with other people's traffic. A `[load]` table in the suite makes
some passes run while evalgate itself sends random filler prompts to the same server, so the suite's
requests are batched with strangers. Filler outputs are never recorded. The settings are runtime knobs,
like the schedule: never identity, but recorded in the run's schedule JSON (`schedule.load`) and, per
loaded pass, what the filler really did (`timings.passes[].load`). docs/server.md.

`trace = "traffic.jsonl"` replays a recorded trace as the load instead (evalgate/configuration/trace.py,
evalgate/execution/replay.py): each wave of a loaded pass runs inside one replay of it, on every engine kind
that places events (`vllm` and `fake` at engine steps, the server kinds at wall-clock offsets).
"""

from __future__ import annotations

import asyncio
import random
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .config import check_keys, fail, resolve_path, typed
from .trace import DEFAULT_STEP_SECONDS, Trace, load_trace

LOAD_KEYS = {"filler", "filler_max_tokens", "filler_prompt_words", "rate", "seed", "concurrency", "warmup", "trace",
             "step_seconds"}
FILLER_KEYS = ("filler", "filler_max_tokens", "filler_prompt_words", "rate", "warmup")


@dataclass(frozen=True)
class Load:
    filler: int = 16  # filler requests kept in flight (closed loop), or the cap on in-flight ones (rate > 0)
    filler_max_tokens: int = 64  # each filler request generates exactly this many tokens (ignore_eos)
    filler_prompt_words: int = 32  # random words per filler prompt
    rate: float = 0.0  # 0: closed loop (each finished filler is replaced at once); > 0: Poisson arrivals per second
    seed: int = 0  # filler prompts and arrivals are seeded (per pass: seed + pass index)
    concurrency: tuple[int, ...] | None = None  # passes at these levels run under load; None: every level > 1
    warmup: float = 10.0  # seconds to wait for the server to report the filler running before the pass starts
    trace: str | None = None  # a trace file replayed as the load instead of the filler (absolute path)
    trace_digest: str | None = None  # its content's SHA-256: part of a loaded pass's condition (schedule.Pass)
    step_seconds: float = DEFAULT_STEP_SECONDS  # a trace's `at` seconds per engine step, and back

    def applies(self, concurrency: int) -> bool:
        return concurrency in self.concurrency if self.concurrency is not None else concurrency > 1

    def load_trace(self) -> Trace:
        return load_trace(Path(self.trace))


def parse_load(table: dict, where: str, sec: str, levels: tuple[int, ...], root: Path | None = None) -> Load:
    """The suite's [load] table, validated in suite.py's strict style (every error names the field). A
    trace is read and checked here, so a bad one stops the run before anything is stored."""
    check_keys(table, LOAD_KEYS, where, sec)
    trace = typed(table, "trace", str, where, sec)
    trace_digest = None
    step_seconds = typed(table, "step_seconds", (int, float), where, sec, default=DEFAULT_STEP_SECONDS)
    if not (0 < step_seconds <= 60):
        raise fail(where, f"`{sec}step_seconds` must be between 0 and 60, got {step_seconds}", "e.g. step_seconds = 0.02")
    if trace is not None:
        both = [k for k in FILLER_KEYS if k in table]
        if both:
            raise fail(where, f"`{sec}{both[0]}` is a filler setting, and `{sec}trace` replaces the filler",
                       f"remove `{both[0]}` (the trace says what is sent), or remove `trace`")
        path = resolve_path(root or Path.cwd(), trace, where, f"{sec}trace")
        trace_digest = load_trace(path).digest  # every mistake named by line and field, before any engine starts
        trace = str(path)

    def positive(key: str, default: int) -> int:
        value = typed(table, key, int, where, sec, default=default)
        if value < 1:
            raise fail(where, f"`{sec}{key}` must be >= 1, got {value}", f"set `{key}` to a positive integer")
        return value

    filler = positive("filler", Load.filler)
    max_tokens = positive("filler_max_tokens", Load.filler_max_tokens)
    words = positive("filler_prompt_words", Load.filler_prompt_words)
    rate = typed(table, "rate", (int, float), where, sec, default=0.0)
    if not (0 <= rate < float("inf")):
        raise fail(where, f"`{sec}rate` must be a finite number >= 0, got {rate}",
                    "use 0 to keep `filler` requests in flight, or new filler requests per second")
    warmup = typed(table, "warmup", (int, float), where, sec, default=Load.warmup)
    if not (0 <= warmup <= 600):
        raise fail(where, f"`{sec}warmup` must be between 0 and 600 seconds, got {warmup}", "e.g. warmup = 10")
    concurrency = typed(table, "concurrency", list, where, sec)
    if concurrency is not None:
        if not concurrency or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in concurrency):
            raise fail(where, f"`{sec}concurrency` must be a non-empty list of positive integers",
                        "list the [schedule] concurrency levels whose passes run under load, e.g. concurrency = [16]")
        missing = [c for c in concurrency if c not in levels]
        if missing:
            raise fail(where, f"`{sec}concurrency` names {missing}, which [schedule] concurrency {list(levels)} does not run",
                        "list levels from [schedule] concurrency, or leave it out (every level > 1)")
        concurrency = tuple(concurrency)
    elif not any(c > 1 for c in levels):
        raise fail(where, f"[load] applies to passes with concurrency > 1, and [schedule] concurrency is {list(levels)}",
                    "add a level > 1 to [schedule] concurrency, or name levels in `load.concurrency`")
    return Load(filler=filler, filler_max_tokens=max_tokens, filler_prompt_words=words, rate=float(rate),
                seed=typed(table, "seed", int, where, sec, default=0), concurrency=concurrency, warmup=float(warmup),
                trace=trace, trace_digest=trace_digest, step_seconds=float(step_seconds))


def filler_prompt(rng: random.Random, words: int) -> str:
    return " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 8))) for _ in range(words))


class Filler:
    """Filler traffic on the engine's event loop. `send(prompt, max_tokens)` is the engine's coroutine that
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
