"""What a run is asked to do, passed whole from the gate down to the engine's process, and what comes back.

A `RunRequest` is built once (by `gate.create_baseline`/`gate.check`, `evalgate cost`, a bisect trial) and
travels as one value: to the supervised child (pickled), to the runner, into the run's plan. Nothing on the
way relays its fields one by one. The child answers with a `RunResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

from ..timings import Timings

if TYPE_CHECKING:
    from ..configuration.schedule import Schedule
    from ..configuration.shard import Shard
    from ..configuration.suite import Suite
    from .rescore import Rescore

# progress(done, total, label, pass_done, pass_total): requests completed across all passes, and in the
# pass now running (its label). A step with no requests to count (an engine starting) has pass_total 0.
Progress = Callable[[int, int, str, int, int], None]

BISECT_KIND = "bisect"  # a bisector's trial run: never judged against a baseline


@dataclass(frozen=True)
class RunRequest:
    """One run to record: the suite and where to store it, what kind of run, which passes, which requests,
    and how the engine's process is set up.

    `labels`: stored on the run row (`shard_group`, `owner`, `engine_log`). `keys`: only these requests
    (bisect trials). `env`: variables set in the engine's process only (None unsets one), before the engine
    is imported. `show_engine_output`: the engine's log lines on this terminal instead of a log file.
    `rescore`: the rescorings the run records (execution/rescore.py). `resume`: the id of the unfinished run
    this one continues (execution/resume.py), its stored waves kept. `wave_timings`: each wave's seconds
    recorded with its pass (`evalgate cost` prices latency from them; a leaderboard-sized run has hundreds of
    thousands, which every read of its row would parse)."""

    suite: Suite
    url: str
    kind: str
    schedule: Schedule
    shard: Shard | None = None
    keys: tuple[str, ...] | None = None
    labels: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str | None] | None = None
    show_engine_output: bool = False
    rescore: Rescore | None = None
    resume: int | None = None
    wave_timings: bool = False

    @property
    def cold_waves(self) -> bool:
        """Each wave from an empty prefix cache: a bisect trial's outputs are compared with other trials', so
        they must never depend on which requests happened to run before them."""
        return self.kind == BISECT_KIND

    @property
    def whole_suite(self) -> bool:
        """Whether every request of the suite runs (lm-eval's metrics of part of a task would mislead)."""
        return self.shard is None and self.keys is None


@dataclass
class RunResult:
    """What the engine's process hands back: the run's id (status still `running`) and its timings."""

    run_id: int
    timings: Timings = field(default_factory=Timings)
