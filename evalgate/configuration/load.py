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

from dataclasses import dataclass
from pathlib import Path

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
