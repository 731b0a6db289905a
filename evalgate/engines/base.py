"""What every engine kind shares: the `[engine]` table it parses, the interface the runner drives, and
batch-invariance bookkeeping.

An engine kind is a subclass of `Engine` registered by name (evalgate/engines/__init__.py). It declares
the `[engine]` keys it reads itself (`own_keys`) and parses them in `parse_config`, cheaply and without
heavy imports, when the suite file is loaded; the engine itself (vLLM, an HTTP client) is only built by
`__init__`, inside the supervised engine process (evalgate/execution/worker.py).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, MutableMapping

from .. import kernels
from ..configuration import config
from ..configuration.config import COMMON_KEYS
from ..configuration.lock import HubResolver, resolve_hub_repo
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..configuration.template_date import TemplateClock
from ..errors import ConfigError
from ..kernels.status import KERNELS, STATUS_PATH_ENV, judge_status, read_status
from ..records import Completion

if TYPE_CHECKING:
    from ..configuration.suite import Suite

# Platforms whose vLLM build ships the batch-invariant kernels; elsewhere VLLM_BATCH_INVARIANT=1 is never set.
INVARIANCE_PLATFORMS = ("cuda", "rocm", "xpu")


@dataclass(frozen=True)
class EngineConfig:
    """The parsed `[engine]` table: the Suite fields an engine kind fills in."""

    model: Path | None
    tokenizer: Path | None
    batch_invariant: bool
    engine_args: dict[str, Any] = field(default_factory=dict)  # passed through to the engine as is
    server: Any = None  # the server kinds' own settings (evalgate/engines/openai_api.py ServerConfig)


class Engine:
    """One engine instance, loaded once per run and reused by every pass."""

    kind: ClassVar[str]
    own_keys: ClassVar[frozenset[str]] = COMMON_KEYS
    model_required: ClassVar[bool] = True
    # Whether `reset_cache` really forgets cached prompt prefixes (a server you run keeps its own cache).
    can_reset_cache: ClassVar[bool] = False
    # Whether `[load]` filler traffic can run beside a pass (`under_load`): the server kinds.
    accepts_load: ClassVar[bool] = False
    # Whether the runner may start this kind again with other settings for a probe (probes.OWN_ENGINE).
    starts_probe_engines: ClassVar[bool] = False
    # Whether `generate` honours `cache_salt` (vLLM's per-request prefix-cache namespace): what makes a pass
    # cold (schedule.py). An engine without it records every pass's cache state as `unknown`.
    salts_cache: ClassVar[bool] = False
    # How a trace's events are placed (evalgate/execution/replay.py): "step" (between engine steps, exact:
    # `step_session`), "timed" (sent at wall-clock offsets: `under_load` with a trace), None (no replay).
    placement: ClassVar[str | None] = None
    # How the kind runs a suite's LoRA adapters ([adapters]): "started" (evalgate starts the engine with LoRA on,
    # configuration/adapters.py `lora_settings`), "by_name" (a server you run serves each under its name), None.
    serves_adapters: ClassVar[str | None] = None

    suite: Suite  # the suite the engine was started for (its sampling settings: the probes, the bisectors)
    launch_env: dict[str, str]  # allow-listed environment the engine started with (fingerprint `env`)
    tokenizer: Any  # the Hugging Face tokenizer the engine uses (lm-eval requests are tokenized with it)

    @classmethod
    def parse_config(cls, table: dict, root: Path, where: str, section: str, *,
                     hub: HubResolver = resolve_hub_repo) -> EngineConfig:
        """The default: evalgate's common keys, every other key passed through to the engine. `hub` turns a
        Hub repo id into its directory (configuration/lock.py)."""
        return EngineConfig(
            model=config.model_dir(table, root, where, section, required=cls.model_required, hub=hub),
            tokenizer=config.tokenizer_dir(table, root, where, section, hub=hub),
            batch_invariant=config.typed(table, "batch_invariant", bool, where, section, default=True),
            engine_args=config.json_values({k: v for k, v in table.items() if k not in cls.own_keys}, where, section),
        )

    @classmethod
    def logprobs_cap(cls, engine_args: dict) -> int | None:
        """The most logprobs a request may ask for, as the kind's settings say (None: it does not say)."""
        return None

    def identity(self) -> dict[str, Any]:
        """The `engine` fingerprint component: everything about the engine that may change outputs."""
        raise NotImplementedError

    # what evalgate's CPU kernels measured in the engine (`confirm_cpu_invariance`); empty where they did not run
    kernels_measured: str = ""

    def identity_info(self) -> dict[str, Any]:
        """What the engine measured about itself that explains but does not identify it (the `engine`
        component's info): what evalgate's CPU kernels chose on this CPU."""
        return {"cpu_kernels": self.kernels_measured} if self.kernels_measured else {}

    def identity_components(self) -> dict[str, dict]:
        """Components the engine knows better than the files (a remote server's model): none by default."""
        return {}

    @property
    def max_model_len(self) -> int:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain prompt, as the engine will see them."""
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        """The text of token ids, special tokens included: what a chat request's prompt was, rendered."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @cached_property
    def template_clock(self) -> TemplateClock:
        """The pinned `strftime_now` every chat render of this engine gets (configuration/template_date.py)."""
        return TemplateClock(self.suite.template_date)

    def render_chat(self, prompt: Prompt) -> str:
        """A chat request as text, as vLLM's chat API renders it: the tokenizer's chat template with the
        generation prompt, the request's `chat_template_kwargs`, and the pinned clock."""
        where = f"prompt {prompt.key!r}"
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"{where}: a `messages` prompt, but the model's tokenizer has no chat template",
                              fix="add the template to the model directory (chat_template.jinja or tokenizer_config.json), "
                                  "or write the prompt as text (`prompt`)")
        variables = {**(prompt.chat_template_kwargs or {}), **self.template_clock.render_variables(prompt.key)}
        try:
            return self.tokenizer.apply_chat_template(prompt.chat(), tokenize=False, add_generation_prompt=True,
                                                      **variables)
        except Exception as exc:  # the template refused the conversation (e.g. a role it does not know)
            raise ConfigError(f"{where}: the chat template refused the messages: {type(exc).__name__}: {exc}",
                              fix="change the messages to what the model's chat template accepts") from None

    def encode_chat(self, prompt: Prompt) -> list[int]:
        """Token ids of a chat request: `render_chat`, tokenized adding no special tokens (the template
        writes them), as vLLM's chat API does."""
        return list(self.tokenizer.encode(self.render_chat(prompt), add_special_tokens=False))

    def tokenize(self, prompt: Prompt) -> list[int]:
        """A request's prompt ids: a scoring request's are the context of its first window and then every
        scored token; an lm-eval generation request comes pre-tokenized; a chat request's come from the
        chat template."""
        if prompt.request_type in SCORING_TYPES:
            first_context = list(prompt.segments[0][0]) if prompt.segments else []
            return first_context + [t for _, continuation in prompt.segments for t in continuation]
        if prompt.prompt_ids is not None:
            return list(prompt.prompt_ids)
        if prompt.messages is not None:
            return self.encode_chat(prompt)
        return self.encode(prompt.text)

    @property
    def capture_sizes(self) -> tuple[int, ...] | None:
        """The batch sizes the engine captured CUDA graphs for (None: none, or it does not say)."""
        return None

    @property
    def kv_block_size(self) -> int | None:
        """Tokens per KV-cache block (None: unknown)."""
        return None

    def preemptions(self) -> int | None:
        """How many times the engine preempted a request so far (None: it does not say)."""
        return None

    @property
    def prefix_caching(self) -> bool | None:
        """Whether the engine caches prompt prefixes (None: it does not say). False: no hot pass."""
        return None

    def generate(self, prompts: list[Prompt], cache_salt: str | None = None) -> list[Completion]:
        """Submit these requests together (one wave: they share the engine's batches). `cache_salt`: each
        request gets its own prefix-cache namespace, `request_salt(cache_salt, key)` (engines that `salts_cache`),
        so it reuses only blocks that the same request computed under the same salt."""
        raise NotImplementedError

    def step_session(self):
        """A replay's engine loop (evalgate/execution/replay.py StepSession): kinds whose placement is "step"."""
        raise NotImplementedError

    def replay_timed(self, trace, prompts: list[Prompt], *, seed: int, cache_salt: str | None,
                     step_seconds: float) -> tuple[list[Completion], dict]:
        """A wave at its markers' offsets in a wall-clock replay of `trace`, and what the replay did
        (evalgate/execution/replay.py): kinds whose placement is "timed"."""
        raise NotImplementedError

    def under_load(self, load, pass_):
        """A context manager for one pass under `[load]` filler traffic, yielding the dict the filler's figures
        are written into when the pass ends (evalgate/execution/traffic.py): kinds that `accepts_load`."""
        raise NotImplementedError

    def reset_cache(self) -> bool:
        """Forget cached prompt prefixes, so the next submission computes from scratch. Returns whether
        it could (see `can_reset_cache`)."""
        return False

    def close(self) -> None:
        pass


def request_salt(cache_salt: str, key: str) -> str:
    """One request's cache salt: vLLM mixes it into the hashes of the request's blocks. Hashed: a server
    takes at most 128 characters and none of `@ / \\` or NUL, and a request id may hold anything."""
    import hashlib

    return hashlib.sha256(f"{cache_salt}\0{key}".encode()).hexdigest()[:32]


def arrange_batch_invariance(requested: bool, platform: str, env: MutableMapping[str, str] = os.environ) -> dict:
    """Ask for batch invariance in `env` (the engine's environment) and say what was done. CUDA, ROCm and XPU:
    vLLM's own kernels (VLLM_BATCH_INVARIANT=1). CPU: evalgate's (evalgate/kernels), whose state is known only
    once the engine has loaded the model (`confirm_cpu_invariance`). Elsewhere nothing is set: vLLM's
    Triton overrides would crash the engine at start."""
    state: dict[str, Any] = {"requested": requested, "in_force": False, "reason": ""}
    env.pop("VLLM_BATCH_INVARIANT", None)
    env.pop(kernels.SWITCH, None)
    env.pop(STATUS_PATH_ENV, None)
    if not requested:
        state["reason"] = "not requested"
    elif platform in INVARIANCE_PLATFORMS:
        env["VLLM_BATCH_INVARIANT"] = "1"
    elif platform == "cpu":
        env[kernels.SWITCH] = "1"
        handle, path = tempfile.mkstemp(prefix="evalgate-cpu-kernels-", suffix=".json")
        os.close(handle)
        env[STATUS_PATH_ENV] = path
        state["kernels"] = KERNELS
        state["reason"] = "the engine has not reported yet"
    else:
        state["reason"] = (f"not available on this platform ({platform}): vLLM's batch-invariant kernels need "
                           "CUDA, ROCm or XPU, evalgate's a CPU")
    return state


def confirm_cpu_invariance(state: dict, env: MutableMapping[str, str] = os.environ) -> str:
    """Once the engine has loaded the model: whether evalgate's CPU kernels are in force (`state` updated), and
    what they measured here (the engine component's info; CPU-dependent, so never part of its identity)."""
    path = env.get(STATUS_PATH_ENV)
    if not state.get("requested") or "kernels" not in state or not path:
        return ""
    status = read_status(path)
    Path(path).unlink(missing_ok=True)
    state["in_force"], said = judge_status(status)
    state["reason"] = "" if state["in_force"] else said
    return said if state["in_force"] else ""
