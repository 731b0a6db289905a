"""What a probe is: one targeted scenario where batch invariance is known to break (vLLM's own
determinism tests, tests/v1/determinism/), as one class in one file.

A probe adds passes to a run. Each differs from an earlier pass (its reference, pass 0 unless the probe
says otherwise) in the probe's one factor, so the passes are judged like every other pass
(evalgate/judgement/verdict.py) and a difference is attributed to that factor. Everything about one probe
lives on its class:

- `name`, `factor`: the name a suite file uses and the factor its passes change. A probe that introduces
  a factor of its own also gives its `words` (how people read it), its `remedy` (what removes it: words and engine settings) and
  whether it is a `batch_factor` (who shared the batch: the batch bisector can take it apart);
- `plan(context, add)`: adds its passes (`add(concurrency, reference=..., **condition)`), or returns the
  reason it cannot run on this suite and engine. A pass must differ from its reference in one thing only:
  where the scenario changes two (the cancel probe: sharing the batch, and the neighbours being aborted),
  the probe adds a **control** first (`add(..., variant="control", factor=<the other thing's factor>)`,
  against pass 0) and its treatment against the control (`reference=control`), so each comparison names
  one factor; `waves` reads `pass_.variant`;
- `engine_args(context)`: settings over the suite's for a probe that needs an engine of its own (those
  run last, each in its own engine, one engine in memory at a time); None: the run's engine;
- `waves(pass_, keys, context)`: what is submitted together, with companion requests (fillers, warmers)
  that share the engine's batches but are never stored or judged, or a trace each wave is replayed in
  (`Wave.trace`: neighbours that arrive and leave at given engine steps);
- `label(reference, other)`: what changed, for people;
- `settings` / `options(table, where, section)`: the probe's own keys in the suite file (`[probes.<name>]`,
  e.g. `[probes.needle] batch = 16`), parsed by the probe as an engine kind parses its `[engine]` keys
  (`Engine.parse_config`); `option(schedule, key)` reads one back, its default where the suite set none;
- `before(engine)` / `proof(engine, before, outputs)`: how it proves it ran (vLLM's preemption counter, the
  outputs' cached-token counts): figures recorded with the pass, and the reason when it did not happen
  (the pass is then reported as not run).

Adding a probe: docs/design.md, "Adding a probe".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterator, Mapping, Sequence

from ..configuration.prompts import Prompt
from ..configuration.remedy import Remedy
from ..configuration.schedule import Pass, Schedule
from ..configuration.trace import Trace

if TYPE_CHECKING:
    from ..engines import Engine
    from ..records import Completion

COMPANION_PREFIX = "evalgate-companion:"  # fillers' keys (never stored; their cache salts are their own)

# add(concurrency, reference=0, **condition) -> the new pass's index
AddPass = Callable[..., int]


@dataclass(frozen=True)
class Wave:
    """Requests submitted together. `recorded[i]` False: a companion (filler, warmer), never stored.
    `trace`: the wave's requests run at their places in one replay of it (evalgate/execution/replay.py)."""

    prompts: list[Prompt]
    recorded: list[bool]
    trace: Trace | None = None

    @classmethod
    def of(cls, prompts: list[Prompt]) -> Wave:
        """A wave of the suite's own requests, every one recorded."""
        return cls(prompts, [True] * len(prompts))


@dataclass(frozen=True)
class PlanContext:
    """What a probe plans with: the schedule's passes and the facts of this suite and engine."""

    schedule: Schedule
    passes: list[Pass]  # the schedule's own passes; pass 0 is the reference
    requests: int
    generating: int  # requests that generate text (lm-eval scoring requests are prefills already)
    longest_prompt: int
    max_model_len: int
    capture_sizes: tuple[int, ...] | None  # the engine's CUDA-graph capture sizes (None: none)
    kv_block_size: int | None
    starts_engines: bool  # whether the engine kind can start another engine with other settings
    prefix_caching: bool | None
    placement: str | None = None  # how the engine places a trace's events (Engine.placement): "step" is exact
    adapters: tuple[str, ...] = ()  # the suite's LoRA adapters, by name ([adapters])


@dataclass(frozen=True)
class WaveContext:
    """What a probe's waves are built from."""

    schedule: Schedule
    engine: Engine
    prompts: dict[str, Prompt]  # by key
    prompt_ids: dict[str, Sequence[int]]  # by key, as int32 arrays (index, slice, len, tuple() them)
    reference: Mapping[str, Completion]  # pass 0's outputs by key, read from the store as they are wanted


class Probe:
    name: ClassVar[str]
    factor: ClassVar[str]
    words: ClassVar[str | None] = None  # a factor of the probe's own: how people read it
    remedy: ClassVar[Remedy | None] = None  # ... and what removes it (words, settings: configuration/remedy.py)
    batch_factor: ClassVar[bool] = False  # ... and whether it is about who shared the batch
    # [probes.<name>] keys: key -> (type, default, the smallest value allowed)
    settings: ClassVar[dict[str, tuple[type, Any, Any]]] = {}

    @classmethod
    def options(cls, table: dict, where: str, section: str) -> dict[str, Any]:
        """The probe's `[probes.<name>]` table, checked: its own keys only (a did-you-mean otherwise), each of
        its type and at least its minimum. Cheap and without heavy imports: it runs when the suite loads."""
        from ..configuration.config import check_keys, fail, typed

        if not cls.settings:
            raise fail(where, f"[{section.rstrip('.')}]: the {cls.name} probe has no settings", "remove the table")
        check_keys(table, set(cls.settings), where, section)
        parsed = {}
        for key, (kind, default, least) in cls.settings.items():
            value = typed(table, key, kind, where, section, default=default)
            if value < least:
                raise fail(where, f"`{section}{key}` is {value}, below {least}", f"set `{key}` to {least} or more")
            parsed[key] = value
        return parsed

    def option(self, schedule: Schedule, key: str) -> Any:
        """One of this probe's settings for a run of `schedule` (its default where the suite set none)."""
        return dict(schedule.probe_options).get(self.name, {}).get(key, self.settings[key][1])

    def plan(self, context: PlanContext, add: AddPass) -> str | None:
        """Add this probe's passes; return the reason it cannot run here instead (never reported as passed)."""
        raise NotImplementedError

    def engine_args(self, context: PlanContext) -> dict[str, Any] | None:
        """Settings over the suite's engine settings, for a probe that needs an engine of its own."""
        return None

    def waves(self, pass_: Pass, keys: list[str], context: WaveContext) -> Iterator[Wave]:
        """By default the suite's requests in waves of the pass's concurrency, nothing beside them."""
        for i in range(0, len(keys), pass_.concurrency):
            yield Wave.of([context.prompts[k] for k in keys[i : i + pass_.concurrency]])

    def label(self, reference: Pass, other: Pass) -> str:
        raise NotImplementedError

    def before(self, engine: Engine) -> Any:
        """State read before the pass runs, for `proof`."""
        return None

    def proof(self, engine: Engine, before: Any, outputs: list[Completion]) -> tuple[dict[str, Any], str | None]:
        """Figures recorded with the pass, and the reason the pass proved nothing (None: it did)."""
        return {}, None
