"""LoRA adapters: `[adapters]` in the suite, each a name for a PEFT adapter directory (or a Hub repo at a
revision, pinned by evalgate.lock like the model), and the adapter a request runs under (docs/suite.md).

An adapter is identity the way a model is: its files are hashed, and the hash is part of the hash of every
request that runs under it (configuration/suite.py `Suite.request_hash`), so an edited adapter explains the
changes of its own requests and of no other. The name is only how the suite and a server address it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fingerprint import adapter_files
from ..hashing import digest
from .config import fail, is_dir, local_or_hub, refuse_lfs_pointers, short, typed
from .lock import HubResolver, resolve_hub_repo

BASE_MODEL = "base"  # the base model, no adapter: a name `[prompts] adapters` may list, never an adapter's own
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
# An adapter's name is the model name a server serves it under: no spaces, slashes or `@` (request keys use it).
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ADAPTER_KEYS = {"path", "revision"}
# Modules whose LoRA delta vLLM leaves out of `prompt_logprobs` (vllm#51594, open on vLLM 0.32): the output head and
# the embeddings (`target_modules` or `modules_to_save`). A teacher-forced rescoring under such an adapter is the
# base model's, so nothing built on rescoring may judge its requests (lm-eval loglikelihoods, across hardware).
UNSCORED_MODULES = ("lm_head", "embed", "wte", "wpe")
# The LoRA ranks vLLM accepts for `max_lora_rank` (vllm/config/lora.py); evalgate picks the smallest that fits.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter of the suite: its name, its directory, its rank and the sha256 of its files; `unscored`:
    the modules it adapts whose delta vLLM's prompt_logprobs leaves out (UNSCORED_MODULES), if any."""

    name: str
    path: Path
    rank: int
    files: dict[str, str]
    unscored: tuple[str, ...] = ()
    fan_in_fan_out: bool = False  # PEFT's flag for a model whose weights are stored (in, out), as GPT-2's Conv1D

    @property
    def unscored_reason(self) -> str:
        """Why a rescoring under this adapter is not its own (for messages; "" when it is)."""
        if not self.unscored:
            return ""
        return (f"adapter {self.name!r} adapts {', '.join(self.unscored)}, whose LoRA delta vLLM leaves out of "
                "prompt_logprobs (vllm#51594): a rescoring under it is the base model's")

    @property
    def digest(self) -> str:
        """The adapter's identity: its files' content, not its name or path (a renamed copy is the same adapter)."""
        return digest({"files": self.files})


def parse_adapters(table: dict, root: Path, where: str, section: str, *,
                   hub: HubResolver = resolve_hub_repo) -> dict[str, Adapter]:
    """`[adapters]`: `name = "dir"` or `name = "org/name"` (a Hub repo at "main"), or a table
    `name = { path = "org/name", revision = "v2" }`. Every value is checked and every adapter hashed."""
    adapters = {}
    for name, value in table.items():
        field = f"{section}{name}"
        if name == BASE_MODEL or not ADAPTER_NAME.match(name):
            raise fail(where, f"`{field}`: {name!r} cannot name an adapter",
                       f"use letters, digits, `.`, `_` and `-` (at most 64), not {BASE_MODEL!r} (the base model's name)")
        path_value, revision = adapter_source(name, value, where, field)
        path = local_or_hub(path_value, revision, root, where, field, f"{field}.revision", hub)
        adapters[name] = read_adapter(name, path, where, field)
    return adapters


def adapter_source(name: str, value, where: str, field: str) -> tuple[str, str | None]:
    """An `[adapters]` entry as written: (the path or Hub id, the revision or None)."""
    if isinstance(value, str):
        return value, None
    if not isinstance(value, dict):
        raise fail(where, f"`{field}` must be a path or a table, got {short(value)}",
                   f'e.g. {name} = "adapters/{name}" (a PEFT directory) or {name} = "org/{name}-lora"')
    if set(value) - ADAPTER_KEYS or "path" not in value:
        raise fail(where, f"`{field}` must have `path` (and optionally `revision`), got {sorted(value)}",
                   f'e.g. {name} = {{ path = "org/{name}-lora", revision = "<commit, tag or branch>" }}')
    return typed(value, "path", str, where, f"{field}."), typed(value, "revision", str, where, f"{field}.")


def adapter_choices(names) -> str:
    """The names a suite's `adapter` fields may take, for messages."""
    known = ", ".join(map(repr, names)) if names else "none: the suite has no [adapters] table"
    return f"name one of the suite's [adapters] ({known}), or \"{BASE_MODEL}\" for the base model"


def read_adapter(name: str, path: Path, where: str, field: str) -> Adapter:
    """The adapter in `path`, checked as vLLM will load it: a PEFT LoRA directory with its weights."""
    fix = ("point it at a PEFT LoRA directory: adapter_config.json (peft_type LORA, r) and adapter_model.safetensors "
           "(`evalgate build-adapter` makes one for a local model)")
    if not is_dir(path):
        raise fail(where, f"`{field}`: {path} is not a directory", fix)
    refuse_lfs_pointers(path, where, field)
    try:
        config = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise fail(where, f"`{field}`: {path} is not a LoRA adapter (no {ADAPTER_CONFIG})", fix) from None
    except (OSError, ValueError) as exc:
        raise fail(where, f"`{field}`: {path / ADAPTER_CONFIG} is unreadable ({exc})", fix) from None
    if not isinstance(config, dict) or str(config.get("peft_type", "LORA")).upper() != "LORA":
        got = config.get("peft_type") if isinstance(config, dict) else type(config).__name__
        raise fail(where, f"`{field}`: {path / ADAPTER_CONFIG} is not a LoRA adapter's (peft_type {got!r})", fix)
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise fail(where, f"`{field}`: {path / ADAPTER_CONFIG} has no positive integer rank `r` (got {rank!r})", fix)
    if not any((path / weights).is_file() for weights in ADAPTER_WEIGHTS):
        raise fail(where, f"`{field}`: {path} has no adapter weights ({' or '.join(ADAPTER_WEIGHTS)})", fix)
    return Adapter(name, path, rank, adapter_files(path), unscored_modules(config), config.get("fan_in_fan_out") is True)


def misfit(adapter: Adapter, weights: dict[str, list[int]]) -> str | None:
    """Where the adapter's LoRA matrices do not fit the model's weight they adapt (an adapter trained on another
    model): the first such module, or None. vLLM loads one silently into buffers of the model's size, and its
    requests run, answering nonsense. Read from the safetensors headers alone; a module the model's files do not
    name as the adapter does (another checkpoint layout), a `.bin` adapter or no `safetensors` is not judged.
    `weights`: the model's (`model_weight_shapes`), read once for all its adapters."""
    a_shapes = tensor_shapes([adapter.path / ADAPTER_WEIGHTS[0]])
    for key, shape in sorted(a_shapes.items()):
        found = re.match(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])\.weight$", key)
        weight = weights.get(f"{found[1]}.weight") if found else None
        if weight is None or len(weight) != 2 or len(shape) != 2:
            continue
        out_features, in_features = reversed(weight) if adapter.fan_in_fan_out else weight  # GPT-2's Conv1D: (in, out)
        if found[2] == "A" and shape[1] != in_features:
            return f"{found[1]}: its lora_A takes {shape[1]} inputs, the model's layer {in_features}"
        if found[2] == "B" and shape[0] != out_features:
            return f"{found[1]}: its lora_B gives {shape[0]} outputs, the model's layer {out_features}"
    return None


def model_weight_shapes(model: Path) -> dict[str, list[int]]:
    """name -> shape of every weight of a model directory's safetensors files (one, or the shards its index
    names); {} where they cannot be read."""
    index = model / "model.safetensors.index.json"
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())) if index.is_file() \
            else ["model.safetensors"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return tensor_shapes([model / name for name in shards])


def tensor_shapes(files: list[Path]) -> dict[str, list[int]]:
    """name -> shape of every tensor in these safetensors files (headers only); {} where one cannot be read."""
    try:
        from safetensors import safe_open
    except ImportError:
        return {}
    shapes: dict[str, list[int]] = {}
    for path in files:
        try:
            with safe_open(str(path), framework="np") as f:
                shapes.update({key: list(f.get_slice(key).get_shape()) for key in f.keys()})
        except Exception:  # missing, not safetensors, a pointer: other checks speak for those
            return {}
    return shapes


def unscored_modules(config: dict) -> tuple[str, ...]:
    """The modules of a PEFT config (`target_modules`: a list or a regex; `modules_to_save`) that UNSCORED_MODULES
    names."""
    named = []
    for key in ("target_modules", "modules_to_save"):
        value = config.get(key) or []
        named += [value] if isinstance(value, str) else [str(v) for v in value if isinstance(v, str)]
    return tuple(sorted({m for m in named if any(part in m for part in UNSCORED_MODULES)}))


def lora_rank_for(ranks: list[int]) -> int:
    """The smallest `max_lora_rank` vLLM accepts that fits every adapter."""
    wanted = max(ranks)
    return next((r for r in VLLM_LORA_RANKS if r >= wanted), wanted)


def lora_settings(adapters: dict[str, Adapter], engine_args: dict[str, Any], where: str, section: str) -> dict[str, Any]:
    """The engine settings that serve the suite's adapters, over what `[engine]` says: LoRA on, a
    `max_lora_rank` that fits the largest adapter, room for every adapter in one batch (`max_loras`). A
    `max_lora_rank` set below an adapter's rank is refused here, naming both."""
    if not adapters:
        return {}
    largest = max(adapters.values(), key=lambda a: a.rank)
    rank = engine_args.get("max_lora_rank")
    if rank is not None and (not isinstance(rank, int) or rank < largest.rank):
        raise fail(where, f"`{section}max_lora_rank` is {rank!r}, below the rank {largest.rank} of adapter "
                          f"{largest.name!r} ({largest.path})",
                   f"set `{section}max_lora_rank` to {lora_rank_for([largest.rank])} or more, or remove it (evalgate "
                   "then picks the smallest that fits)")
    if engine_args.get("enable_lora") is False:
        raise fail(where, f"`{section}enable_lora` is false, and the suite has [adapters]",
                   f"remove `{section}enable_lora` (evalgate turns LoRA on for a suite with adapters)")
    settings = {"enable_lora": True, "max_lora_rank": lora_rank_for([a.rank for a in adapters.values()]),
                "max_loras": len(adapters)}
    return {key: value for key, value in settings.items() if key not in engine_args}
