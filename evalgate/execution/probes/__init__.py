"""Probes: targeted passes for the places where batch invariance is known to break (vLLM's own
determinism tests, tests/v1/determinism/). `[schedule] probes = [...]`; `probes = "vllm"` is all of them.

Each probe adds passes that differ from pass 0 (the reference: the first concurrency level, given order,
cold) in one factor, so they are judged like every other pass (verdict.py) and a difference is attributed
to the probe's factor. Some probes submit companion requests beside the suite's own (long fillers, a
prefix warmer): companions share the engine's batches but are never stored or judged.

- `batch_edges` (batch_size): batch sizes around a CUDA-graph capture size: s-1, s and s+1 for the largest
  capture size s the suite can fill (s-1 left out where it is pass 0's size); the first is compared with
  pass 0, each next one with the one below it. Capture sizes
  come from the engine's config; an engine without CUDA graphs (CPU, eager) uses vLLM's default list,
  DEFAULT_CAPTURE_SIZES.
- `needle` (neighbours): each request alone among `needle_batch` long fillers, at a seeded random
  position (vLLM's needle test: long prefills join the request's decode batch). Filler length:
  `needle_filler_tokens`, by default half the engine's max_model_len, at most 2048.
- `prefix_cache` (prefix_cache): each request after a warmer that is its own prompt cut to half its
  length, under the same cache salt, so the request is served partly from the cache and prefills only its
  tail (the case that varies on CPU). The recorded cached-token counts prove the hit.
- `prefill_decode` (prefill_decode): each request's pass-0 output ids re-scored by one prefill, prompt ids
  plus output ids as token ids (never re-encoded text), compared bit for bit with the decode's logprobs.
- `chunked_prefill` (chunking) and `preemption` (preemption) need an engine with other settings, so they
  run last, each in its own engine started after the run's engine is closed (one engine in memory at a
  time): chunked prefill with a token budget of a quarter of the longest prompt (at least 16), each
  request alone, against pass 0; preemption with a KV cache of just enough blocks for one request of
  max_model_len, at the highest concurrency, against the given-order pass at that concurrency. vLLM's
  own preemption counter proves preemption happened (a pass without any is reported as not run). Only
  the in-process `vllm` kind starts such engines; a probe whose engine does not start is reported as not
  run with vLLM's reason.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterator

from ...configuration.prompts import SCORING_TYPES, Prompt
from ...configuration.schedule import HOT, Pass, Schedule

if TYPE_CHECKING:
    from ...engines import Engine
    from ...records import Completion

PROBES = ("batch_edges", "needle", "prefix_cache", "prefill_decode", "chunked_prefill", "preemption")
PRESETS = {"vllm": PROBES}  # vLLM's determinism scenarios
FACTOR = {"batch_edges": "batch_size", "needle": "neighbours", "prefix_cache": "prefix_cache",
          "prefill_decode": "prefill_decode", "chunked_prefill": "chunking", "preemption": "preemption"}
OWN_ENGINE = ("chunked_prefill", "preemption")  # probes that need an engine with other settings
# vLLM's default CUDA-graph capture sizes (1, 2, 4, then every 8 up to 512): used where the engine has none.
DEFAULT_CAPTURE_SIZES = (1, 2, 4, *range(8, 513, 8))
MAX_FILLER_TOKENS = 2048
FILLER_TEXT = ("The committee reviewed every chapter of the annual report, compared the figures with last year's "
               "accounts, and wrote a long summary of what had changed and why. ")
COMPANION_PREFIX = "evalgate-companion:"  # fillers' keys (never stored; their cache salts are their own)


@dataclass(frozen=True)
class Wave:
    """Requests submitted together. `recorded[i]` False: a companion (filler, warmer), never stored."""

    prompts: list[Prompt]
    recorded: list[bool]


def plan_probes(schedule: Schedule, passes: list[Pass], requests: int, capture_sizes: tuple[int, ...] | None,
                generating: int, own_engine: dict[str, dict] | None) -> tuple[list[Pass], list[dict]]:
    """The probe passes (appended after `passes`; those with their own engine last) and the probes that
    cannot run, with the reason. `generating`: how many requests generate text (prefill_decode re-scores
    those only). `own_engine`: probe -> engine settings (own_engine_args), None where the engine kind
    cannot start another engine."""
    added: list[Pass] = []
    not_run: list[dict] = []

    def add(probe: str, concurrency: int, reference: int = 0, **condition) -> int:
        index = len(passes) + len(added)
        added.append(Pass(index, concurrency, 0, None, reference=reference, factor=FACTOR[probe], probe=probe,
                          salt_of=index, **condition))
        return index

    for probe in schedule.probes:
        if probe in OWN_ENGINE:
            continue  # last, below
        if probe == "batch_edges":
            sizes = [s for s in (capture_sizes or DEFAULT_CAPTURE_SIZES) if 2 <= s <= requests - 1]
            if not sizes:
                not_run.append({"pass": "probe batch_edges", "reason": f"the suite has {requests} request(s): a batch "
                                "edge s-1, s, s+1 needs at least 3"})
                continue
            edge = max(sizes)
            reference = 0  # the first edge against pass 0, then each size against the one below it
            for size in (edge - 1, edge, edge + 1):
                if size != passes[0].concurrency:
                    reference = add(probe, size, reference=reference)
        elif probe == "needle":
            add(probe, schedule.needle_batch + 1)
        elif probe == "prefix_cache":
            add(probe, 1, cache=HOT)
        elif probe == "prefill_decode":
            if not generating:
                not_run.append({"pass": "probe prefill_decode", "reason": "the suite has no generation requests "
                                "(lm-eval scoring requests are prefills already)"})
                continue
            add(probe, 1)
    for probe in (p for p in schedule.probes if p in OWN_ENGINE):
        if own_engine is None:
            not_run.append({"pass": f"probe {probe}", "reason": "needs an engine with other settings: only the "
                            "in-process `vllm` kind starts one (measure the setting with `evalgate cost`)"})
            continue
        args = json.dumps(own_engine[probe], sort_keys=True)
        if probe == "chunked_prefill":
            add(probe, 1, engine_args=args)
        else:
            top = max(schedule.concurrency)
            given = next(p for p in passes if p.concurrency == top and p.order_seed is None and p.cache != HOT)
            add(probe, top, reference=given.index, engine_args=args)
    return added, not_run


def own_engine_args(longest_prompt: int, max_model_len: int, block_size: int | None) -> dict[str, dict]:
    """The settings of the probes that need their own engine, over the suite's engine settings."""
    blocks = -(-max_model_len // (block_size or 16)) + 1  # one request of max_model_len (vLLM wants a block more)
    return {
        # vLLM wants max_num_seqs <= max_num_batched_tokens; each request runs alone in this probe anyway
        "chunked_prefill": {"enable_chunked_prefill": True, "max_num_batched_tokens": max(16, longest_prompt // 4),
                            "max_num_seqs": 16},
        "preemption": {"num_gpu_blocks_override": blocks, "disable_log_stats": False},  # stats: the preemption count
    }


def filler_tokens(schedule: Schedule, max_model_len: int, longest_request: int) -> int:
    """Filler length for the needle probe: as set, else half the context (at most 2048), always leaving
    room for the fillers' own generated tokens."""
    wanted = schedule.needle_filler_tokens or min(MAX_FILLER_TOKENS, max_model_len // 2)
    return max(1, min(wanted, max_model_len - longest_request - 1))


def probe_waves(pass_: Pass, keys: list[str], prompts: dict[str, Prompt], *, schedule: Schedule, engine: Engine,
                prompt_ids: dict[str, list[int]], reference: dict[str, Completion]) -> Iterator[Wave]:
    """The waves of one probe pass. `reference`: pass 0's outputs by key (prefill_decode re-scores them)."""
    if pass_.probe in ("batch_edges", *OWN_ENGINE):  # the suite's requests in waves, nothing beside them
        for i in range(0, len(keys), pass_.concurrency):
            wave = [prompts[k] for k in keys[i : i + pass_.concurrency]]
            yield Wave(wave, [True] * len(wave))
    elif pass_.probe == "needle":
        fillers = needle_fillers(schedule, engine, prompt_ids)
        rng = random.Random(schedule.seed)
        for n, key in enumerate(keys):
            wave = [replace(f, key=f"{f.key}-{n}") for f in fillers]  # own cache salts: the fillers run cold
            at = rng.randrange(len(wave) + 1)
            wave.insert(at, prompts[key])
            yield Wave(wave, [i == at for i in range(len(wave))])
    elif pass_.probe == "prefix_cache":
        for key in keys:
            ids = prompt_ids[key]
            # the warmer has the request's key, hence its cache salt: the request then hits its blocks
            warmer = Prompt(key, "", max_tokens=1, line=0, prompt_ids=tuple(ids[: max(1, len(ids) // 2)]))
            if prompts[key].request_type not in SCORING_TYPES:
                yield Wave([warmer], [False])
            yield Wave([prompts[key]], [True])
    elif pass_.probe == "prefill_decode":
        for key in keys:
            p, done = prompts[key], reference.get(key)
            if p.request_type in SCORING_TYPES or done is None or not done.output_ids:
                continue  # already a prefill, or nothing was generated
            yield Wave([rescoring(p, prompt_ids[key], done.output_ids)], [True])


def rescoring(prompt: Prompt, prompt_ids: list[int], output_ids: list[int]) -> Prompt:
    """A scoring request for `output_ids` after `prompt_ids`: one prefill of the ids, never re-encoded text."""
    return Prompt(prompt.key, prompt.text, max_tokens=None, line=prompt.line, request_type="loglikelihood",
                  segments=((tuple(prompt_ids), tuple(output_ids)),), continuation="", location=prompt.location)


def needle_fillers(schedule: Schedule, engine: Engine, prompt_ids: dict[str, list[int]]) -> list[Prompt]:
    """`needle_batch` long filler requests of token ids (deterministic), generating as long as the suite does."""
    longest = max((len(ids) for ids in prompt_ids.values()), default=0)
    length = filler_tokens(schedule, engine.max_model_len, longest)
    unit = engine.encode(FILLER_TEXT) or [1]
    fillers = []
    for i in range(schedule.needle_batch):
        ids = (unit * (length // len(unit) + 2))[i % len(unit):][:length]
        fillers.append(Prompt(f"{COMPANION_PREFIX}filler-{i}", "", max_tokens=8, line=0, prompt_ids=tuple(ids)))
    return fillers
