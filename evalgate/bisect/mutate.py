"""Trace mutations for `evalgate fuzz`: the traffic shapes under which serving engines are known to change
outputs (vLLM's determinism issues, GRIEF's mutators), each a pure function of a trace and a seeded RNG.

Every mutation works in engine steps (fuzz replays are step-placed) and keeps the trace valid:

- `shift`: one event arrives up to 8 steps earlier or later;
- `burst`: several events arrive at the same step;
- `long_prefill`: a long prompt (half the context) arrives while the gated requests decode (vllm#51902);
- `cancel`: a neighbour's client leaves mid-decode (the cancel path, vllm#39146);
- `share_prefix`: a new request shares an earlier one's first tokens (prefix-cache hits in the batch);
- `block_edge`: a prompt's length moves to a KV-cache block edge, one under or one over (sglang#22819);
- `batch_edge`: neighbours are added so the running count at the gated arrival sits at a batch edge
  (a CUDA-graph capture size or a power of two: vllm#51187);
- `move_gated`: the gated requests arrive at another step.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Callable

from ..configuration.trace import Cancel, Event, Trace, gated_places
from ..engines import defaults

Mutation = Callable[[Trace, random.Random, "Shape"], Trace]


class Shape:
    """What the mutations size themselves by: the engine's context, block size and batch edges."""

    def __init__(self, max_model_len: int, block_size: int | None, capture_sizes: tuple[int, ...] | None,
                 max_tokens: int):
        self.max_model_len = max_model_len
        self.block_size = defaults.kv_block_size(block_size)
        self.edges = defaults.capture_sizes(capture_sizes)
        self.max_tokens = max(2, max_tokens)

    def longest(self, max_tokens: int) -> int:
        """The longest prompt that still leaves room for `max_tokens`."""
        return max(1, self.max_model_len - max_tokens - 1)


def gated_step(trace: Trace) -> int:
    """The step the (first) gated request arrives at: the replay's own rule (`gated_places`), so a mutation
    lands where a replay of the mutated trace will put the gated requests."""
    return gated_places(trace, 1)[0][0]


def _new_id(trace: Trace, stem: str) -> str:
    taken = {e.id for e in trace.events}
    n = 1
    while f"{stem}{n}" in taken:
        n += 1
    return f"{stem}{n}"


def _pick(trace: Trace, rng: random.Random) -> Event:
    return rng.choice(trace.traffic)


def _swap(trace: Trace, old: Event, new: Event) -> Trace:
    return trace.with_events([new if e is old else e for e in trace.events])


def shift(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    event = _pick(trace, rng)
    return _swap(trace, event, replace(event, offset=float(max(0, int(event.offset) + rng.choice([-1, 1]) * rng.randint(1, 8)))))


def burst(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    chosen = {id(e) for e in rng.sample(trace.traffic, min(len(trace.traffic), rng.randint(2, 6)))}
    at = float(rng.choice([gated_step(trace), int(_pick(trace, rng).offset)]))
    return trace.with_events([replace(e, offset=at) if id(e) in chosen else e for e in trace.events])


def long_prefill(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    max_tokens = rng.randint(1, 8)
    tokens = max(1, min(shape.longest(max_tokens), shape.max_model_len // 2 + rng.randint(0, shape.block_size)))
    at = float(gated_step(trace) + rng.randint(1, shape.max_tokens - 1))  # while the gated requests decode
    event = Event(0, _new_id(trace, "long"), at, tokens=tokens, max_tokens=max_tokens)
    return trace.with_events([*trace.events, event])


def cancel(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    candidates = [e for e in trace.traffic if e.max_tokens > 1] or trace.traffic
    event = rng.choice(candidates)
    if event.max_tokens < 2:
        event2 = replace(event, max_tokens=shape.max_tokens)
        trace, event = _swap(trace, event, event2), event2
    leave = rng.randint(1, event.max_tokens - 1)
    return _swap(trace, event, replace(event, cancel=Cancel("steps", leave)))


def share_prefix(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    sources = [e for e in trace.traffic if e.prompt is None]
    if not sources:
        return shift(trace, rng, shape)
    source = rng.choice(sources)
    length = source.tokens if source.prompt_ids is None else len(source.prompt_ids)
    shared = rng.randint(1, length)
    tokens = min(shape.longest(8), shared + rng.randint(1, 64))
    event = Event(0, _new_id(trace, "shared"), float(int(source.offset) + rng.randint(0, 8)), tokens=tokens,
                  prefix_of=source.id, prefix_tokens=min(shared, tokens), max_tokens=rng.randint(1, 8))
    return trace.with_events([*trace.events, event])


def block_edge(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    candidates = [e for e in trace.traffic if e.tokens is not None and e.prefix_of is None]
    if not candidates:
        return long_prefill(trace, rng, shape)
    event = rng.choice(candidates)
    blocks = max(1, event.tokens // shape.block_size + rng.randint(0, 1))
    tokens = max(1, min(shape.longest(event.max_tokens), blocks * shape.block_size + rng.choice([-1, 0, 1])))
    return _swap(trace, event, replace(event, tokens=tokens))


def batch_edge(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    at = gated_step(trace)
    running = sum(1 for e in trace.traffic if e.offset <= at)
    edges = [edge for edge in shape.edges if edge > running] or [running + 1]
    wanted = rng.choice(edges[:3]) + rng.choice([-1, 0, 1])
    added = [Event(0, _new_id(trace, f"edge{i}-"), float(max(0, at - rng.randint(0, 2))), tokens=rng.randint(8, 64),
                   max_tokens=shape.max_tokens + rng.randint(0, 8)) for i in range(max(0, wanted - running))]
    return trace.with_events([*trace.events, *added])


def move_gated(trace: Trace, rng: random.Random, shape: Shape) -> Trace:
    markers = [e for e in trace.events if e.gated]
    last = int(max(e.offset for e in trace.events))
    at = float(rng.randint(0, last + 2))
    if not markers:
        return trace.with_events([*trace.events, Event(0, _new_id(trace, "gated"), at, gated=True)])
    return _swap(trace, markers[0], replace(markers[0], offset=at))


MUTATIONS: dict[str, Mutation] = {m.__name__: m for m in (shift, burst, long_prefill, cancel, share_prefix, block_edge,
                                                         batch_edge, move_gated)}


def mutate(seed_trace: Trace, rng: random.Random, shape: Shape, count: int) -> tuple[Trace, list[str]]:
    """`count` random mutations of the seed trace, and their names."""
    trace, names = seed_trace, []
    for _ in range(count):
        name = rng.choice(sorted(MUTATIONS))
        trace = MUTATIONS[name](trace, rng, shape)
        names.append(name)
    return trace, names


def synthetic_trace(events: int, rng: random.Random, shape: Shape) -> Trace:
    """A seed trace when the suite has none: `events` neighbours arriving over the first steps, prompts of
    16 tokens to a quarter of the context, the gated requests at the middle."""
    top = max(16, min(256, shape.max_model_len // 4))
    made = [Event(i + 1, f"e{i + 1}", float(2 * i), tokens=rng.randint(16, top), max_tokens=rng.randint(2, 2 * shape.max_tokens))
            for i in range(events)]
    made.append(Event(events + 1, "gated", float(events), gated=True))
    return Trace(tuple(sorted(made, key=lambda e: e.offset)), "step", "synthetic")


def in_steps(trace: Trace, step_seconds: float) -> Trace:
    """A trace in engine steps (fuzz replays are step-placed): `at` seconds become steps, seconds cancels too."""
    if trace.unit == "step":
        return trace
    events = []
    for e in trace.events:
        cancel = e.cancel
        if cancel is not None and cancel.unit == "seconds":
            steps = cancel.leave_step(step_seconds)
            cancel = None if e.gated or steps >= e.max_tokens else Cancel("steps", steps)  # leaves after its end: never
        events.append(replace(e, offset=float(trace.step_of(e, step_seconds)), cancel=cancel))
    return Trace(tuple(events), "step", trace.source)
