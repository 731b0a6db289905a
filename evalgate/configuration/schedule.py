"""Passes: how a run exercises the engine, one factor at a time. Runtime knobs only, never identity.

Every pass has a recorded **condition** (batch size, order, prefix-cache state, neighbours) and, except the
first, a **reference**: the earlier pass it differs from in exactly one factor (evalgate/judgement/factors.py). So a
difference between a pass and its reference names its cause. The default plan:

- pass 0, the reference: the first concurrency level, prompts-file order, cache cold;
- one `hot` pass: pass 0's condition again with the prefix cache warm from pass 0 (factor `prefix_cache`);
  left out where the engine has prefix caching off;
- one pass per further concurrency level, cold, against pass 0 (factor `batch_size`);
- repeats: every cold pass again, against its first occurrence (factor `repeat`);
- `shuffles` passes at the highest concurrency in a seeded order, against the given order (factor `order`).

The `rotating` preset (`[schedule] preset = "rotating"`) costs little more than one crowded pass: pass 0
runs every request at the highest concurrency; then only this turn's rotation slot (`rotation_slot`: a
stable hash of the request key, modulo `rotation`) runs alone, cold (factor `batch_size`), and alone again
with the cache warm (factor `prefix_cache`). The turn is the number of earlier complete runs of the suite,
so every request runs alone once in every `rotation` consecutive runs.

Cold means nothing of the request is cached: each request of a cold pass carries its own cache salt
(`cache_salt`), which vLLM mixes into its block hashes; a hot pass reuses its reference's salts. A pass is
split into waves of `concurrency` requests submitted together, which is what really changes batches.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:
    from .load import Load

COLD, HOT, UNKNOWN = "cold", "hot", "unknown"
# Factor names of runs recorded before the probe registry, read as today's names.
RENAMED_FACTORS = {"chunking": "chunked_prefill"}
FULL, ROTATING = "full", "rotating"
PRESETS = (FULL, ROTATING)


@dataclass(frozen=True)
class Schedule:
    """Runtime knobs: never part of identity (that exclusion is what makes a silent regression provable)."""

    concurrency: tuple[int, ...] = (1, 8)
    shuffles: int = 1
    repeats: int = 1
    seed: int = 0
    load: Load | None = None  # [load]: filler traffic for server engines (evalgate/configuration/load.py)
    hot_pass: bool = True  # one pass repeating pass 0 with the prefix cache warm
    probes: tuple[str, ...] = ()  # targeted passes (evalgate/probes/)
    # the probes' own settings, [probes.<name>] (each parsed by its probe: evalgate/probes/base.py `options`):
    # ((name, {key: value}), ...), sorted by name
    probe_options: tuple[tuple[str, dict], ...] = ()
    preset: str = FULL  # full | rotating (the module docstring)
    rotation: int = 16  # rotating: every request runs alone once in this many runs
    turn: int = 0  # rotating: this run's turn (the runner sets it: earlier complete runs of the suite)


@dataclass(frozen=True)
class Pass:
    index: int
    concurrency: int
    repeat: int
    order_seed: int | None  # None: the prompts file's order
    cache: str = COLD  # cold | hot | unknown (runs recorded before conditions)
    reference: int | None = None  # the pass this one differs from in `factor` only
    factor: str | None = None  # None with a reference: unattributed (a run recorded before conditions)
    salt_of: int | None = None  # whose cache salts the requests carry (a hot pass: its reference's)
    probe: str | None = None  # the probe that added this pass (evalgate/probes/)
    engine_args: str | None = None  # a probe's own engine: its settings over the suite's, as canonical JSON
    sample: str | None = None  # "slot/rotation": only the requests of that rotation slot (rotating preset)
    traffic: str | None = None  # the trace a loaded pass ran inside ([load] trace): its content digest
    # a probe's second pass of one condition: its control (same neighbours, same steps, one thing less)
    variant: str | None = None

    # A check compares a loaded pass with the baseline's only when both ran inside the same trace: outputs
    # under traffic depend on the traffic wherever the engine is not batch invariant.

    @property
    def condition(self) -> tuple:
        """What the pass ran under; equal conditions are comparable across runs (baseline vs check)."""
        return (self.concurrency, self.order_seed, self.cache, self.probe, self.engine_args, self.traffic, self.variant)

    @property
    def condition_label(self) -> str:
        order = "given order" if self.order_seed is None else f"shuffled (seed {self.order_seed})"
        probe = f", probe {self.probe}" + (f" ({self.variant})" if self.variant else "") if self.probe else ""
        sample = f", rotation slot {self.sample}" if self.sample else ""
        traffic = f", inside trace {self.traffic[:12]}" if self.traffic else ""
        return f"concurrency {self.concurrency}, {order}, cache {self.cache}{probe}{sample}{traffic}"

    @property
    def label(self) -> str:
        return f"pass {self.index}: {self.condition_label}, repeat {self.repeat}"

    def to_dict(self) -> dict:
        return asdict(self)


def rotation_slot(key: str, rotation: int) -> int:
    """The rotation slot of a request: stable across runs, machines and suite edits (a key's slot never
    moves), so every request runs alone once in every `rotation` consecutive turns."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % rotation


def in_sample(key: str, sample: str | None) -> bool:
    if sample is None:
        return True
    slot, rotation = (int(n) for n in sample.split("/"))
    return rotation_slot(key, rotation) == slot


def plan_passes(schedule: Schedule, *, prefix_caching: bool | None = True) -> list[Pass]:
    """The passes of a run. `prefix_caching`: whether the engine caches prefixes (False: no hot pass).
    A pass that runs inside a trace ([load] trace) carries the trace's digest in its condition."""
    load = schedule.load
    if load is None or load.trace is None:
        return plan_schedule(schedule, prefix_caching=prefix_caching)
    return [replace(p, traffic=load.trace_digest) if load.applies(p.concurrency) else p
            for p in plan_schedule(schedule, prefix_caching=prefix_caching)]


def plan_schedule(schedule: Schedule, *, prefix_caching: bool | None = True) -> list[Pass]:
    if schedule.preset == ROTATING:
        return plan_rotating(schedule, prefix_caching=prefix_caching)
    passes: list[Pass] = []

    def add(concurrency: int, repeat: int, order_seed: int | None = None, **condition) -> Pass:
        p = Pass(len(passes), concurrency, repeat, order_seed, **condition)
        if p.salt_of is None:
            p = replace(p, salt_of=p.index)
        passes.append(p)
        return p

    first, *others = schedule.concurrency
    reference = add(first, 0)
    if schedule.hot_pass and prefix_caching is not False:
        add(first, 0, cache=HOT, reference=0, factor="prefix_cache", salt_of=0)
    cold = [reference] + [add(c, 0, reference=0, factor="batch_size") for c in others]
    for repeat in range(1, schedule.repeats):
        for p in cold:
            add(p.concurrency, repeat, reference=p.index, factor="repeat")
    top = max(schedule.concurrency)
    given = next(p for p in cold if p.concurrency == top)
    for i in range(schedule.shuffles):
        add(top, 0, schedule.seed + i, reference=given.index, factor="order")
    return passes


def plan_rotating(schedule: Schedule, *, prefix_caching: bool | None = True) -> list[Pass]:
    """Pass 0: every request at the highest concurrency, cold. Pass 1: this turn's slot alone (the lowest
    concurrency), cold, against pass 0 (`batch_size`). Pass 2: the same requests alone with pass 1's
    cache warm (`prefix_cache`), unless there is no hot pass."""
    sample = f"{schedule.turn % schedule.rotation}/{schedule.rotation}"
    crowded, alone = max(schedule.concurrency), min(schedule.concurrency)
    passes = [Pass(0, crowded, 0, None, salt_of=0),
              Pass(1, alone, 0, None, reference=0, factor="batch_size", salt_of=1, sample=sample)]
    if schedule.hot_pass and prefix_caching is not False:
        passes.append(Pass(2, alone, 0, None, cache=HOT, reference=1, factor="prefix_cache", salt_of=1, sample=sample))
    return passes


def rotating_problem(schedule: Schedule) -> tuple[str, str, str] | None:
    """What the rotating preset cannot take in this schedule, as (setting, why, fix); None when it can run.
    One rule for the suite file and the command-line overrides alike."""
    extra = [name for name, off in (("shuffles", 0), ("repeats", 1)) if getattr(schedule, name) != off]
    if schedule.probes:
        extra.append("probes")
    if extra:
        return (extra[0], "does not go with `preset = \"rotating\"`, which runs one crowded pass and a rotating sample "
                "alone", f"remove {', '.join(extra)}, or use preset = \"full\"")
    if schedule.rotation < 1:
        return "rotation", "must be >= 1", "e.g. rotation = 16: every request alone once in 16 runs"
    if len(set(schedule.concurrency)) < 2:
        return "concurrency", "needs two levels for the rotating preset (alone, crowded)", "e.g. concurrency = [1, 32]"
    return None


def passes_of(schedule_record: dict | None) -> list[Pass]:
    """The passes of a stored run. A run recorded before conditions (no `cache` field) is read as it ran:
    pass 0 cold, every later pass compared with pass 0, cache state unknown, factor unattributed."""
    names = {f.name for f in fields(Pass)}
    passes = []
    for raw in (schedule_record or {}).get("passes") or []:
        if "cache" in raw:
            known = {k: v for k, v in raw.items() if k in names}
            known["factor"] = RENAMED_FACTORS.get(known.get("factor"), known.get("factor"))
            passes.append(Pass(**known))
        else:
            index = raw["index"]
            passes.append(Pass(index, raw["concurrency"], raw.get("repeat", 0), raw.get("order_seed"),
                               cache=COLD if index == 0 else UNKNOWN, reference=None if index == 0 else 0))
    return passes


def waves(keys: list[str], pass_: Pass) -> list[list[str]]:
    """The request keys of a pass (its rotation sample, if it has one), ordered and split into waves of
    `concurrency`."""
    order = [k for k in keys if in_sample(k, pass_.sample)]
    if pass_.order_seed is not None:
        random.Random(pass_.order_seed).shuffle(order)
    size = pass_.concurrency
    return [order[i : i + size] for i in range(0, len(order), size)]


def concurrency_levels(text: str | None, flag: str = "--concurrency") -> list[int] | None:
    """A command line's comma-separated concurrency levels (`1,8,32`), None when not given."""
    if not text:
        return None
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise ConfigError(f"{flag} {text!r}: expected comma-separated positive integers", fix=f"e.g. {flag} 1,8,32")
    return levels


def with_overrides(schedule: Schedule, concurrency=None, shuffles=None, repeats=None, *,
                   where: str | None = None) -> Schedule:
    """The schedule with the command line's --concurrency, --shuffles and --repeats; with `where` (the suite
    file), an override the rotating preset cannot take is refused, naming the flag."""
    out = replace(
        schedule,
        concurrency=tuple(concurrency) if concurrency else schedule.concurrency,
        shuffles=schedule.shuffles if shuffles is None else shuffles,
        repeats=schedule.repeats if repeats is None else repeats,
    )
    problem = rotating_problem(out) if where is not None and out.preset == ROTATING else None
    if problem:
        setting, why, fix = problem
        raise ConfigError(f"--{setting} {why} (the rotating preset of {where})", fix=fix)
    return out
