"""`[engine] kind = "fake"`: a test engine. Deterministic outputs without a model runtime.

It exists so that evalgate's own plumbing (the CLI, the supervised worker, the store, verdicts, reports,
shards, faults after engine start) can be tested end to end in a fraction of a second per run, the way
inspect_ai's `mockllm` and llm's `MockModel` are used. It proves nothing about a real engine: everything
only vLLM can show (batch variance, prefix-cache effects, server = offline) is tested on vLLM. It is never
a default; a suite must name it.

Outputs are a pure function of the model directory's weights hash, the request's prompt token ids and,
for the keys listed in `fake_vary_with_batch`, the size of the wave the request ran in:

- prompt ids: the model directory's `tokenizer.json` (the `tokenizers` library), else UTF-8 bytes;
- output token i: SHA-256(weights hash, prompt ids, i) modulo the vocabulary, always `max_tokens` tokens;
  a scored continuation token gets the logprob it would have had when generated after its window's
  context (prefill and decode agree);
- top-k: the chosen token first, then k-1 other ids, with logprobs -0.05, -1.05, -2.05, ... plus a
  hash-derived fraction (so bits differ between tokens); the chosen token is top-1;
- a key in `fake_vary_with_batch` that shares its wave with other requests gets different tokens from the
  middle of its output on (a batch-size effect, seen as batch variance); `max_num_seqs = 1` removes it, as
  it does in vLLM (one sequence at a time);
- a prefix cache at request granularity, as vLLM's behaves under cache salts: a request is served from
  the cache (`cached_tokens` = its prompt length) when the same request already ran under the same salt
  (or unsalted) since the last reset; a key in `fake_vary_with_cache` served from the cache gets different
  tokens from the middle of its output on (a prefix-cache effect);
- a request under a LoRA adapter ([adapters]) gets outputs of the weights hash combined with the adapter's
  files hash (an edited adapter changes its own requests only); a key in `fake_vary_with_adapter_mix` that
  shares its wave with a request under another adapter (or the base model) gets different tokens from the
  middle of its output on (a planted adapter-mix effect); `max_num_seqs = 1` removes it (nobody shares
  the batch);
- `fake_seconds_per_wave` sleeps that long per wave, so a test can interrupt a run mid-pass;
- replays (evalgate/execution/replay.py) are step-placed, as on the `vllm` kind: every running request
  gets one token per step (its first at the step after it arrives); a gated request that shares a step
  with another counts as crowded (a key in `fake_drift_with_batch` then gets every logprob 1e-6 lower: bits-only
  drift, the same tokens); a key in `fake_vary_with_cancel` gets different tokens from the middle
  of its output on when a neighbour is aborted while it decodes (a planted cancel-path fault, for fuzz);
- on another hardware class (a kernel dispatch setting such as ONEDNN_MAX_CPU_ISA caps this machine:
  fingerprint.kernel_dispatch), a key in `fake_hardware_drift` gets every logprob 1e-6 lower (drift); one in
  `fake_hardware_near_tie` other tokens from the middle on, while a rescoring still ranks the original token
  first (a near tie); one in `fake_hardware_confident` the same flip, and a rescoring ranks the original
  token 3 nats below the top (a confident flip). Planted cross-hardware cases (judgement/hardware.py).

Every other `[engine]` key is recorded in the engine identity (so changing it is an explained `engine`
change) and otherwise ignored: a suite switches between `fake` and `vllm` by its `kind` alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from ..configuration import config
from ..configuration.lock import HubResolver, resolve_hub_repo
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..fingerprint import env_snapshot, hardware_component, model_component
from ..records import Completion
from .base import COMMON_KEYS, Engine, EngineConfig

if TYPE_CHECKING:
    from ..configuration.suite import Suite

VARY_KEYS = ("fake_vary_with_batch", "fake_drift_with_batch", "fake_vary_with_cache", "fake_vary_with_cancel", "fake_hardware_drift",
             "fake_hardware_near_tie", "fake_hardware_confident", "fake_vary_with_adapter_mix")
FAKE_KEYS = frozenset({*VARY_KEYS, "fake_seconds_per_wave"})
HARDWARE_DRIFT = 1e-6  # nats: how far a `fake_hardware_drift` key's logprobs move on another hardware class
DEFAULT_MAX_MODEL_LEN = 512


class FakeEngine(Engine):
    kind = "fake"
    own_keys: ClassVar[frozenset[str]] = COMMON_KEYS | FAKE_KEYS
    can_reset_cache = True
    salts_cache = True
    placement = "step"
    serves_adapters = "started"

    @classmethod
    def parse_config(cls, table: dict, root: Path, where: str, section: str, *,
                     hub: HubResolver = resolve_hub_repo) -> EngineConfig:
        lists = {}
        for name in VARY_KEYS:
            keys = config.typed(table, name, list, where, section, default=[])
            if not all(isinstance(key, str) for key in keys):
                raise config.fail(where, f"`{section}{name}` must list request ids (strings)", f'e.g. {name} = ["p001"]')
            lists[name] = sorted(keys)
        delay = config.typed(table, "fake_seconds_per_wave", (int, float), where, section, default=0.0)
        if not 0 <= delay <= 60:
            raise config.fail(where, f"`{section}fake_seconds_per_wave` must be between 0 and 60, got {delay}",
                              "e.g. fake_seconds_per_wave = 0.2")
        parsed = super().parse_config(table, root, where, section, hub=hub)
        # the fake keys are identity too: a fake suite that varies differently is another engine
        args = {**parsed.engine_args, **lists, "fake_seconds_per_wave": float(delay)}
        return dataclasses.replace(parsed, engine_args=args)

    def __init__(self, suite: Suite):
        self.suite = suite
        self.launch_env = env_snapshot()
        self.weights = model_component(suite.model)["hash"]
        self.vary = set(suite.engine_args["fake_vary_with_batch"])
        self.vary_cached = set(suite.engine_args.get("fake_vary_with_cache", []))
        self.vary_cancelled = set(suite.engine_args.get("fake_vary_with_cancel", []))
        self.drift_crowded = set(suite.engine_args.get("fake_drift_with_batch", []))
        self.vary_mixed = set(suite.engine_args.get("fake_vary_with_adapter_mix", []))
        # another hardware class: a kernel dispatch setting caps this machine (fingerprint.kernel_dispatch)
        other_class = bool(hardware_component()["data"].get("dispatch"))
        self.hardware = {name: set(suite.engine_args.get(f"fake_hardware_{name}", [])) if other_class else set()
                         for name in ("drift", "near_tie", "confident")}
        # salt -> the request keys served under it since the last reset (the suite's own key strings: a
        # leaderboard-sized run serves every request under several salts)
        self._cache: dict[str | None, set[str]] = {}
        self.delay = suite.engine_args["fake_seconds_per_wave"]
        self._limit = int(suite.engine_args.get("max_model_len", DEFAULT_MAX_MODEL_LEN))
        tokenizer_dir = suite.tokenizer or suite.model
        self._tokenizer_file = tokenizer_dir / "tokenizer.json"
        self._fast = None
        if self._tokenizer_file.is_file():
            from tokenizers import Tokenizer

            self._fast = Tokenizer.from_file(str(self._tokenizer_file))
        self.vocab = _vocab_size(suite.model, self._fast)
        self._hf_tokenizer = None

    @property
    def tokenizer(self):
        """The model directory's Hugging Face tokenizer (lm-eval builds its requests with it)."""
        if self._hf_tokenizer is None:
            from transformers import AutoTokenizer

            self._hf_tokenizer = AutoTokenizer.from_pretrained(str(self.suite.tokenizer or self.suite.model))
        return self._hf_tokenizer

    def identity(self) -> dict[str, Any]:
        return {"kind": self.kind, "args": dict(sorted(self.suite.engine_args.items())),
                "max_model_len": self._limit, "batch_invariance": {
                    "requested": self.suite.batch_invariant, "in_force": False,
                    "reason": "the fake test engine has no batch-invariant kernels"}}

    @property
    def max_model_len(self) -> int:
        return self._limit

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            return list(self._fast.encode(text).ids)
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        if self._fast is not None:
            return self._fast.decode(ids)
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")

    @property
    def prefix_caching(self) -> bool:
        return True

    def reset_cache(self) -> bool:
        self._cache.clear()
        return True

    def generate(self, prompts: list[Prompt], cache_salt: str | None = None) -> list[Completion]:
        if self.delay:
            time.sleep(self.delay)
        hits = [self.cache_hit(p.key, cache_salt) for p in prompts]
        # max_num_seqs = 1: one sequence at a time, as vLLM schedules it, so no request has company
        crowded = len(prompts) > 1 and self.suite.engine_args.get("max_num_seqs") != 1
        adapters = {p.adapter for p in prompts} if crowded else set()
        return [self._complete(p, crowded=crowded, cached=hit, mixed=bool(adapters - {p.adapter}))
                for p, hit in zip(prompts, hits)]

    def cache_hit(self, key: str, cache_salt: str | None) -> bool:
        """Whether the request is served from the cache (it ran under this salt since the last reset)."""
        served = self._cache.setdefault(cache_salt, set())
        hit = key in served
        served.add(key)
        return hit

    def step_session(self) -> FakeSteps:
        return FakeSteps(self)

    def _complete(self, prompt: Prompt, *, crowded: bool, cached: bool, cancelled: bool = False,
                  mixed: bool = False) -> Completion:
        prompt_ids = self.tokenize(prompt)
        # under an adapter: other weights, those of the base and the adapter's files together
        weights = self.weights + (self.suite.adapters[prompt.adapter].digest if prompt.adapter else "")
        k = self.suite.sampling["logprobs"]
        flipped = prompt.key in self.hardware["near_tie"] | self.hardware["confident"]
        if prompt.request_type in SCORING_TYPES:
            # scored: the continuation tokens themselves, with the logprobs they get when generated after the
            # window's context (prefill and decode agree, as on a batch-invariant engine)
            ids, rows = [], []
            demoted = prompt.key in self.hardware["confident"]
            for context, continuation in prompt.segments:
                ids += continuation
                rows += [self._row(weights, list(context), i, k, chosen=t,
                                   rank=min(3, k - 1) if demoted and i >= len(continuation) // 2 else 0)
                         for i, t in enumerate(continuation)]
            finish = "scored"
        else:
            n = int(self.suite.sampling_for(prompt)["max_tokens"])
            salt = "crowded" if crowded and prompt.key in self.vary else ""
            salt += "cached" if cached and prompt.key in self.vary_cached else ""
            salt += "cancelled" if cancelled and prompt.key in self.vary_cancelled else ""
            salt += "hardware" if flipped else ""
            salt += "mixed" if mixed and prompt.key in self.vary_mixed else ""
            rows = [self._row(weights, prompt_ids, i, k, salt=salt if i >= n // 2 else "") for i in range(n)]
            ids = [row[0][0] for row in rows]
            finish = "length"
        if prompt.key in self.hardware["drift"] or crowded and prompt.key in self.drift_crowded:
            rows = [(row_ids, [lp - HARDWARE_DRIFT for lp in lps]) for row_ids, lps in rows]
        import numpy as np

        texts = [self.decode([t]) for t in ids]
        width = len(rows[0][0]) if rows else 0  # every row's: (positions, k) arrays, as vLLM's are handed over
        return Completion(key=prompt.key, prompt_ids=prompt_ids, output_ids=np.array(ids, dtype=np.int64),
                          logprobs=np.array([row[1][row[0].index(t)] for row, t in zip(rows, ids)]),
                          top_ids=np.array([row[0] for row in rows], dtype=np.int64).reshape(len(rows), width),
                          top_logprobs=np.array([row[1] for row in rows]).reshape(len(rows), width),
                          token_texts=texts, text="".join(texts), finish_reason=finish,
                          cached_tokens=len(prompt_ids) if cached else 0)

    def _row(self, weights: str, prompt_ids: list[int], position: int, k: int, *, salt: str = "",
             chosen: int | None = None, rank: int = 0) -> tuple[list[int], list[float]]:
        """Top-k ids and logprobs at one position: a pure function of weights, prompt, position (and salt).
        `chosen` at `rank` (a scored token; rank 0: the top one)."""
        seed = json.dumps([weights, prompt_ids, position, salt]).encode()
        words = list(struct.unpack("<8I", hashlib.sha256(seed).digest()))
        ids = [chosen if chosen is not None and rank == 0 else words[0] % self.vocab]
        if chosen is not None and rank and ids[0] == chosen:
            ids[0] = (chosen + 1) % self.vocab
        fraction = words[-1] / 2**32 / 100
        round_ = 0
        while len(ids) < min(k, self.vocab):
            if not words:
                round_ += 1
                words = list(struct.unpack("<8I", hashlib.sha256(seed + b"%d" % round_).digest()))
            candidate = words.pop() % self.vocab
            if candidate not in ids and candidate != chosen:
                ids.append(candidate)
        if chosen is not None and rank:
            ids = (ids[:rank] + [chosen] + ids[rank:])[:k]  # rank < k: the chosen token is in its row
        return ids, [-0.05 - place - fraction for place in range(len(ids))]


class FakeSteps:
    """The fake engine's replay loop (replay.StepSession): one token per running request per step."""

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.running_: dict[str, list[int]] = {}  # id -> [tokens so far, max tokens]
        self.gated: dict[str, dict] = {}  # key -> prompt and what happened to it

    def add_traffic(self, request_id: str, request, cache_salt: str | None) -> None:
        self.running_[request_id] = [0, request.max_tokens]

    def add_gated(self, prompt: Prompt, cache_salt: str | None) -> None:
        n = int(self.engine.suite.sampling_for(prompt)["max_tokens"])
        self.gated[prompt.key] = {"prompt": prompt, "cached": self.engine.cache_hit(prompt.key, cache_salt),
                                  "crowded": False, "cancelled": False}
        self.running_[prompt.key] = [0, n]

    def abort(self, request_id: str) -> None:
        self.running_.pop(request_id, None)
        for key, state in self.gated.items():  # a neighbour left while this request decodes
            if key in self.running_ and 0 < self.running_[key][0] < self.running_[key][1]:
                state["cancelled"] = True

    def step(self) -> list[tuple[str, int, bool]]:
        crowded = len(self.running_) > 1 and self.engine.suite.engine_args.get("max_num_seqs") != 1
        moved = []
        for request_id, counts in list(self.running_.items()):
            counts[0] += 1
            if crowded and request_id in self.gated:
                self.gated[request_id]["crowded"] = True
            done = counts[0] >= counts[1]
            moved.append((request_id, counts[0], done))
            if done:
                del self.running_[request_id]
        return moved

    def running(self) -> int:
        return len(self.running_)

    def busy(self) -> bool:
        return bool(self.running_)

    def completion(self, key: str) -> Completion:
        state = self.gated[key]
        return self.engine._complete(state["prompt"], crowded=state["crowded"], cached=state["cached"],
                                     cancelled=state["cancelled"])


def _vocab_size(model: Path, fast) -> int:
    try:
        size = json.loads((model / "config.json").read_text())["vocab_size"]
        if isinstance(size, int) and size > 1:
            return size
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return fast.get_vocab_size() if fast is not None else 256
