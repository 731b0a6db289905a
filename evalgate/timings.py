"""Seconds per phase of a run, on the ground floor: the runner fills them in the engine's process, the judgement
adds its own, and the run stores them (benchmarks/ read them back)."""

from __future__ import annotations

import contextlib
import time


class Timings(dict):
    """Seconds spent per phase (`engine_load`, `inference`, `evalgate`), plus `passes`: per-pass figures
    (concurrency, requests, output tokens, seconds, wave seconds). Stored with the run; read by benchmarks/."""

    def phases(self) -> dict[str, float]:
        return {k: v for k, v in self.items() if isinstance(v, float)}

    def add(self, phase: str, seconds: float) -> None:
        self[phase] = self.get(phase, 0.0) + seconds

    @contextlib.contextmanager
    def phase(self, phase: str):
        """Add the time spent in the `with` block to `phase`."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - t0)
