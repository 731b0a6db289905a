"""An OpenAI-compatible vLLM server as the engine (`[engine] kind = "openai"`), at real client concurrency.

One HTTP request per suite request (`/v1/completions`, never batched into one call), sent concurrently: a
wave of N requests is N requests in flight, so the server's scheduler shapes the batches exactly as it does
for production traffic. Token-level records come through the API: `return_token_ids` (output and prompt
ids), `logprobs: k` with `return_tokens_as_token_ids` (top-k keyed by token id, never by text, which can
collide), and `prompt_logprobs: k` for lm-eval's scoring requests (the token ids are sent as the prompt).
The server serializes vLLM's float32 logprobs as the shortest float64 repr, so `json.loads` gives the same
float64 bits the in-process engine records (tests/e2e/test_e2e_server.py compares them token for token).

Transport failures (connection refused or reset, timeouts, HTTP 429/5xx) are retried with exponential
backoff up to `engine.retries`, then the run fails (exit 3) naming the requests; a retried request is
recorded once. The API key is read from the environment variable the suite names and lives only in the
request header: never in the database, reports or logs. docs/server.md.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..configuration import config
from ..configuration.config import check_keys, fail, typed
from ..configuration.lock import HubResolver, resolve_hub_repo
from ..configuration.prompts import SCORING_TYPES, Prompt
from ..errors import ConfigError, EngineError
from ..fingerprint import component
from ..hashing import digest
from ..records import Completion, Positions
from .base import COMMON_KEYS, Engine, EngineConfig, request_salt

if TYPE_CHECKING:
    from ..configuration.suite import Suite

# [engine] keys evalgate reads for the server kinds; for `vllm-server` every other key becomes a CLI flag.
SERVER_KEYS = COMMON_KEYS | {"api_key_env", "timeout", "retries"}
OPENAI_KEYS = SERVER_KEYS | {"base_url", "served_model", "model_hash"}
VLLM_SERVER_OWN_KEYS = SERVER_KEYS | {"startup_timeout"}
# Flags evalgate sets itself when it starts the server (key -> fix).
VLLM_SERVER_RESERVED = {
    "host": "evalgate serves on 127.0.0.1 only; remove `{sec}host`",
    "port": "evalgate picks a free port itself; remove `{sec}port`",
    "api_key": "never write a key in the suite: name an environment variable with `{sec}api_key_env`",
    "base_url": "`base_url` is for kind = \"openai\" (a server you run); remove it for kind = \"vllm-server\"",
    "served_model": "use `{sec}served_model_name` (a vLLM flag) to name the served model",
    "model_hash": "evalgate hashes `{sec}model` itself when it starts the server; remove `{sec}model_hash`",
    "lora_modules": "name the adapters in [adapters] (evalgate serves each under its name); remove `{sec}lora_modules`",
}
# What a request leaves out, a vLLM server takes from the model's generation_config.json (its default
# `--generation-config auto`: Qwen's repetition_penalty, say), where vLLM in process takes these neutral values.
# Sent with every request, so both routes run exactly the suite's [sampling] (and the same filler and trace).
NEUTRAL_SAMPLING = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_p": 1.0,
                    "top_k": 0, "min_p": 0.0}
RETRY_STATUSES = {408, 425, 429}  # and every 5xx
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# /metrics cache_config_info labels that describe capacity (memory left over), not numerics: kept out of identity.
CAPACITY_LABELS = {"engine", "num_gpu_blocks", "num_cpu_blocks", "num_gpu_blocks_override", "kv_cache_size_tokens",
                   "kv_cache_max_concurrency", "kv_cache_memory_bytes", "gpu_memory_utilization", "_block_size_resolved"}
# A fixed text tokenized by a server without a local tokenizer directory: the `tokenizer` identity.
TOKENIZER_PROBE = ("The quick brown fox jumps over the lazy dog. 0123456789 +-*/=<>()[]{} \t\n naïve café "
                   "Straße 東京 😀 ```def f(x): return x**2``` <s></s> [INST] <|endoftext|>")


@dataclass(frozen=True)
class ServerConfig:
    """The evalgate-owned [engine] keys of the server kinds (the rest of [engine] is `Suite.engine_args`)."""

    base_url: str | None = None  # openai: the server (without /v1); vllm-server: chosen at start
    served_model: str | None = None  # the `model` of every request
    api_key_env: str | None = None  # the environment variable holding the API key (never the key itself)
    model_hash: str | None = None  # openai without a model directory: a declared content hash
    timeout: float = 120.0  # seconds per HTTP request
    retries: int = 3  # retries per request after the first attempt
    startup_timeout: float = 600.0  # vllm-server: seconds to wait for /health


def parse_server_config(kind: str, table: dict, root, where: str, sec: str,
                        hub: HubResolver = resolve_hub_repo) -> EngineConfig:
    """Validate [engine] for a server kind (evalgate/configuration/config.py's strict style)."""
    if kind == "openai":
        check_keys(table, OPENAI_KEYS, where, sec)
    for key, fix in VLLM_SERVER_RESERVED.items():
        if kind == "vllm-server" and key in table:
            raise fail(where, f"`{sec}{key}` is set by evalgate for kind = \"vllm-server\"", fix.format(sec=sec))

    model = config.model_dir(table, root, where, sec, required=kind == "vllm-server", hub=hub)
    tokenizer = config.tokenizer_dir(table, root, where, sec, hub=hub)

    api_key_env = typed(table, "api_key_env", str, where, sec)
    if api_key_env is not None and not ENV_NAME.match(api_key_env):
        raise fail(where, f"`{sec}api_key_env` = {api_key_env!r} is not an environment variable name",
                    "name the variable that holds the key, e.g. api_key_env = \"VLLM_API_KEY\" (never the key itself)")
    timeout = typed(table, "timeout", (int, float), where, sec, default=ServerConfig.timeout)
    if not (0 < timeout < float("inf")):
        raise fail(where, f"`{sec}timeout` must be a positive number of seconds, got {timeout}", "e.g. timeout = 120")
    retries = typed(table, "retries", int, where, sec, default=ServerConfig.retries)
    if not (0 <= retries <= 20):
        raise fail(where, f"`{sec}retries` must be between 0 and 20, got {retries}", "e.g. retries = 3")
    startup = ServerConfig.startup_timeout
    base_url = served = model_hash = None
    if kind == "openai":
        base_url = typed(table, "base_url", str, where, sec)
        if not base_url:
            raise fail(where, f"`{sec}base_url` is missing", 'set it to the server, e.g. base_url = "http://127.0.0.1:8000"')
        if not re.match(r"^https?://[^/\s]+", base_url):
            raise fail(where, f"`{sec}base_url` = {base_url!r} is not an http(s) URL", 'e.g. base_url = "http://127.0.0.1:8000"')
        base_url = re.sub(r"/v1$", "", base_url.rstrip("/"))
        served = typed(table, "served_model", str, where, sec)
        if not served:
            raise fail(where, f"`{sec}served_model` is missing",
                        "set it to the model name the server serves (GET /v1/models lists it)")
        model_hash = typed(table, "model_hash", str, where, sec)
        if model_hash is not None and (not model_hash.strip() or model is not None):
            raise fail(where, f"`{sec}model_hash` must be a non-empty string, and only without `{sec}model`",
                       f"declare the weights' content hash when evalgate cannot read them; with `{sec}model` "
                       "evalgate hashes the directory")
        engine_args: dict[str, Any] = {}
    else:
        startup = typed(table, "startup_timeout", (int, float), where, sec, default=startup)
        if not (0 < startup < float("inf")):
            raise fail(where, f"`{sec}startup_timeout` must be a positive number of seconds", "e.g. startup_timeout = 600")
        engine_args = config.json_values({k: v for k, v in table.items() if k not in VLLM_SERVER_OWN_KEYS}, where, sec)
        served_name = engine_args.get("served_model_name")
        if isinstance(served_name, list):
            served_name = served_name[0] if served_name else None
        served = str(served_name) if served_name else str(model)  # vLLM serves the --model path by default
    return EngineConfig(
        model=model, tokenizer=tokenizer,
        batch_invariant=typed(table, "batch_invariant", bool, where, sec, default=True),
        engine_args=engine_args,
        server=ServerConfig(base_url=base_url, served_model=served, api_key_env=api_key_env, model_hash=model_hash,
                            timeout=float(timeout), retries=retries, startup_timeout=float(startup)),
    )


# --- the HTTP client ------------------------------------------------------------------------------------


class RequestFailed(Exception):
    """A request that failed after every retry (or was refused outright, `retryable` False)."""

    def __init__(self, reason: str, attempts: int, status: int | None = None, retryable: bool = True):
        super().__init__(reason)
        self.reason, self.attempts, self.status, self.retryable = reason, attempts, status, retryable


@dataclass
class ClientStats:
    requests: int = 0
    retries: int = 0
    client_seconds: float = 0.0  # time in evalgate's own code around requests (build, parse), not network wait


class ApiClient:
    """Async JSON-over-HTTP with retries. Retried: connection errors, timeouts, a connection cut mid-response,
    HTTP 408/425/429 and 5xx; backoff `backoff * 2**attempt` seconds, capped at `max_backoff`."""

    def __init__(self, base_url: str, *, api_key: str | None, timeout: float, retries: int,
                 backoff: float = 0.5, max_backoff: float = 8.0):
        try:
            import httpx
        except ImportError:
            from ..errors import MissingDependency

            raise MissingDependency("httpx (server mode)", extra="server") from None

        self.base_url, self.timeout, self.retries = base_url.rstrip("/"), timeout, retries
        self.backoff, self.max_backoff = backoff, max_backoff
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(timeout), headers=self._headers,
            # never let the pool cap real concurrency: every request in flight has its own connection
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=512),
        )
        self.stats = ClientStats()

    def delay(self, attempt: int) -> float:
        return min(self.backoff * (2 ** attempt), self.max_backoff)

    async def call(self, method: str, path: str, body: dict | None = None, *, retries: int | None = None) -> Any:
        import httpx

        retries = self.retries if retries is None else retries
        attempt = 0
        while True:
            self.stats.requests += 1
            try:
                response = await self.http.request(method, self.base_url + path, json=body)
            except httpx.TransportError as exc:  # refused, reset, timed out, cut mid-response
                status, reason = None, _describe(exc)
            else:
                status = response.status_code
                if status < 400:
                    t0 = time.perf_counter()
                    try:
                        return response.json() if path != "/metrics" else response.text
                    except ValueError:
                        raise RequestFailed(f"HTTP {status} with a body that is not JSON: {response.text[:200]!r}",
                                            attempt + 1, status, retryable=False) from None
                    finally:
                        self.stats.client_seconds += time.perf_counter() - t0
                reason = f"HTTP {status}: {_error_text(response)}"
                if status < 500 and status not in RETRY_STATUSES:
                    raise RequestFailed(reason, attempt + 1, status, retryable=False)
            if attempt >= retries:
                raise RequestFailed(reason, attempt + 1, status)
            self.stats.retries += 1
            await asyncio.sleep(self.delay(attempt))
            attempt += 1

    async def aclose(self) -> None:
        await self.http.aclose()


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _error_text(response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300].strip() or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    return str(body)[:300]


class EventLoop:
    """A private asyncio loop on a daemon thread: the engine's synchronous calls (the runner's) run
    coroutines on it, and filler traffic keeps running on it between the runner's calls."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="evalgate-http", daemon=True)
        self.thread.start()

    def run(self, coro):
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:  # KeyboardInterrupt (SIGTERM in the worker) while waiting: stop the requests
            future.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_running():
            try:  # the resolver's worker threads (getaddrinfo) are not daemons: end them now
                asyncio.run_coroutine_threadsafe(self.loop.shutdown_default_executor(), self.loop).result(5)
            except Exception:
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


# --- the engine -----------------------------------------------------------------------------------------


@dataclass
class ServerInfo:
    version: str | None = None
    served_model: str = ""
    root: str | None = None
    max_model_len: int = 0
    system_fingerprint: str | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    tokenizer_probe: list[int] | None = None


class OpenAIEngine(Engine):
    kind = "openai"
    own_keys = OPENAI_KEYS
    accepts_load = True
    placement = "timed"
    salts_cache = True  # vLLM's OpenAI server takes `cache_salt` in the request body
    serves_adapters = "by_name"  # a request under an adapter names it as its `model` (vLLM's --lora-modules)

    @classmethod
    def parse_config(cls, table: dict, root, where: str, section: str, *,
                     hub: HubResolver = resolve_hub_repo) -> EngineConfig:
        return parse_server_config(cls.kind, table, root, where, section, hub)

    def __init__(self, suite: Suite, base_url: str | None = None):
        self.suite = suite
        self.config: ServerConfig = suite.server
        self.base_url = base_url or self.config.base_url
        self.served_model = self.config.served_model
        if suite.lm_eval is not None and not (suite.tokenizer or suite.model):
            raise ConfigError(f"{suite.path}: lm-eval tasks need the model's tokenizer on this machine",
                              fix="set `engine.model` (or `engine.tokenizer`) to a local copy of the served model's directory")
        self.launch_env: dict[str, str] = {}  # a remote server's environment is not visible to evalgate
        self._tokenizer = None
        self.pinned_chats: dict[str, list[int]] = {}  # chats whose template reads the calendar: the pinned ids
        self._texts: dict[int, str] = {}
        key = api_key(suite)
        self.loop = EventLoop()
        try:
            self.client: ApiClient = self.loop.run(self._make_client(key))
            self.info = self.loop.run(self._discover())
        except BaseException:
            self.close()  # no thread or connection outlives a failed start
            raise

    async def _make_client(self, api_key: str | None) -> ApiClient:
        return ApiClient(self.base_url, api_key=api_key, timeout=self.config.timeout, retries=self.config.retries)

    # -- discovery and identity --

    def _where(self, key: str) -> str:
        return f"{self.suite.path}: `engine.{key}`"

    async def _discover(self) -> ServerInfo:
        info = ServerInfo(served_model=self.served_model)
        try:
            models = await self.client.call("GET", "/v1/models")
        except RequestFailed as exc:
            if exc.status == 401:
                raise ConfigError(f"{self.base_url}: the server refused the API key (HTTP 401)",
                                  fix=_key_fix(self.config.api_key_env)) from None
            raise EngineError(f"cannot reach the server at {self.base_url}: {exc.reason} "
                              f"(after {exc.attempts} attempt{'s' if exc.attempts > 1 else ''})",
                              fix="start the server, or fix `engine.base_url`") from None
        served = [m for m in (models.get("data") or []) if isinstance(m, dict)]
        entry = next((m for m in served if m.get("id") == self.served_model), None)
        if entry is None:
            names = ", ".join(repr(m.get("id")) for m in served) or "none"
            raise ConfigError(f"{self._where(self._model_key())}: the server at {self.base_url} does not serve "
                              f"{self.served_model!r} (it serves {names})",
                              fix="name the served model exactly as GET /v1/models lists it, or point at the right server")
        names = {m.get("id") for m in served}
        missing = sorted(set(self.suite.adapters) - names)
        if missing:
            raise ConfigError(f"{self.suite.path}: [adapters]: the server at {self.base_url} does not serve the adapter(s) "
                              f"{', '.join(map(repr, missing))} (it serves {', '.join(map(repr, sorted(names)))})",
                              fix="serve each adapter under its name in the suite: vLLM's --enable-lora --lora-modules "
                                  "NAME=PATH (a LoRA adapter is a model the server lists in GET /v1/models)")
        info.root = entry.get("root")
        info.max_model_len = int(entry.get("max_model_len") or 0)
        version = await self._optional("GET", "/version")
        info.version = version.get("version") if isinstance(version, dict) else None
        metrics = await self._optional("GET", "/metrics")
        if isinstance(metrics, str):
            info.cache_config = _prometheus_labels(metrics, "vllm:cache_config_info")
        # One tiny request: the response's model and system_fingerprint, and proof that token ids come back.
        try:
            probe = await self._completion({"prompt": "evalgate", "max_tokens": 1, "temperature": 0.0}, "probe")
        except RequestFailed as exc:
            raise EngineError(f"the server at {self.base_url} failed a one-token probe request: {exc.reason}") from None
        info.system_fingerprint = probe.get("system_fingerprint")
        if not isinstance(probe["choices"][0].get("token_ids"), list):
            raise ConfigError(f"{self.base_url}: the server does not return token ids (`return_token_ids`)",
                              fix="evalgate needs a vLLM OpenAI-compatible server, vLLM 0.10.2 or later")
        if not info.max_model_len:
            raise ConfigError(f"{self.base_url}: GET /v1/models does not report max_model_len for {self.served_model!r}",
                              fix="evalgate needs a vLLM OpenAI-compatible server")
        if not (self.suite.tokenizer or self.suite.model):
            tokens = await self.client.call("POST", "/tokenize", {"model": self.served_model, "prompt": TOKENIZER_PROBE})
            info.tokenizer_probe = list(tokens.get("tokens") or [])
        return info

    async def _optional(self, method: str, path: str):
        try:
            return await self.client.call(method, path, retries=0)
        except RequestFailed:
            return None

    def _model_key(self) -> str:
        return "served_model"

    def identity(self) -> dict[str, Any]:
        """The `engine` component: what the server says about itself (never the URL, port or key)."""
        cache = {k: v for k, v in sorted(self.info.cache_config.items()) if k not in CAPACITY_LABELS}
        return {
            "kind": self.kind,
            "vllm": self.info.version,
            "max_model_len": self.info.max_model_len,
            "system_fingerprint": self.info.system_fingerprint,
            "cache_config": cache,
            "batch_invariance": self._invariance(),
            "sampling_sent": NEUTRAL_SAMPLING,  # what every request names beyond [sampling] (a baseline from before did not)
        }

    def _invariance(self) -> dict[str, Any]:
        requested = self.suite.batch_invariant
        return {"requested": requested, "in_force": False,
                "reason": ("a remote server's batch invariance cannot be observed: start it with VLLM_BATCH_INVARIANT=1 "
                           "(CUDA, ROCm or XPU)") if requested else "not requested"}

    def identity_components(self) -> dict[str, dict]:
        """`model` and `tokenizer` when there is no local model directory to hash (fingerprint.py)."""
        out: dict[str, dict] = {}
        if self.suite.model is None:
            declared = self.config.model_hash
            out["model"] = component(
                {"declared": declared} if declared else {"served_model": self.served_model},
                {"served_model": self.served_model, "root": self.info.root,
                 "note": "declared model_hash" if declared else
                 "no model_hash declared: weights replaced under the same name are not seen"})
        if self.suite.model is None and self.suite.tokenizer is None:
            out["tokenizer"] = component({"probe": digest(self.info.tokenizer_probe)},
                                         {"served_model": self.served_model, "source": "server /tokenize"})
        return out

    @property
    def max_model_len(self) -> int:
        return self.info.max_model_len

    @property
    def tokenizer(self):
        """The Hugging Face tokenizer of the local model directory (lm-eval builds its requests with it)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(str(self.suite.tokenizer or self.suite.model))
        return self._tokenizer

    # -- requests --

    def encode(self, text: str) -> list[int]:
        return self.loop.run(self._tokenize({"prompt": text}, config.short(text, 60)))

    def encode_chat(self, prompt: Prompt) -> list[int]:
        """The ids /v1/chat/completions will run: the server's own rendering of the chat (its template), unless
        the template is here and reads the calendar. Then the render pinned to the suite's date is what runs:
        its text tokenized by the server, sent as token ids (`pinned_chats`), since a server's template reads
        the server's clock and a request cannot pass it a function."""
        # the template is here, unless the server was given another (`chat_template`: it renders with that one)
        if (self.suite.tokenizer or self.suite.model) and "chat_template" not in self.suite.engine_args:
            text = self.render_chat(prompt)
            if self.template_clock.reads(prompt.key):
                ids = self.loop.run(self._tokenize({"prompt": text, "add_special_tokens": False},
                                                   f"the rendered messages of prompt {prompt.key!r}"))
                self.pinned_chats[prompt.key] = ids
                return ids
        body: dict[str, Any] = {"messages": prompt.chat(), "add_generation_prompt": True}
        if prompt.chat_template_kwargs:
            body["chat_template_kwargs"] = prompt.chat_template_kwargs
        return self.loop.run(self._tokenize(body, f"the messages of prompt {prompt.key!r}"))

    def decode(self, ids: list[int]) -> str:
        out = self.loop.run(self.client.call("POST", "/detokenize", {"model": self.served_model, "tokens": list(ids)}))
        return str(out.get("prompt") or "")

    async def _tokenize(self, body: dict, what: str) -> list[int]:
        try:
            out = await self.client.call("POST", "/tokenize", {"model": self.served_model, **body})
        except RequestFailed as exc:
            if exc.status == 400 and "messages" in body:  # the template refused them: the user's input
                raise ConfigError(f"the server's chat template refused {what}: {exc.reason}",
                                  fix="change the messages to what the model's chat template accepts") from None
            raise EngineError(f"tokenizing {what} on the server failed: {exc.reason}") from None
        return list(out["tokens"])

    @property
    def prefix_caching(self) -> bool | None:
        """From the server's `vllm:cache_config_info` metric, when it publishes one."""
        value = self.info.cache_config.get("enable_prefix_caching")
        return None if value is None else value.lower() == "true"

    def generate(self, prompts: list[Prompt], cache_salt: str | None = None) -> list[Completion]:
        """Send every request of the wave at once (one HTTP request each; a scoring request, one per
        window) and return when all are answered."""
        return self.loop.run(self._generate(prompts, cache_salt))

    async def _generate(self, prompts: list[Prompt], cache_salt: str | None) -> list[Completion]:
        results = await asyncio.gather(*(self._request(p, cache_salt) for p in prompts), return_exceptions=True)
        failed = [(p, r) for p, r in zip(prompts, results) if isinstance(r, BaseException)]
        if failed:
            for _, error in failed:
                if isinstance(error, (ConfigError, asyncio.CancelledError)) or not isinstance(error, Exception):
                    raise error
            keys = ", ".join(repr(p.key) for p, _ in failed[:10]) + (f" and {len(failed) - 10} more" if len(failed) > 10 else "")
            first = failed[0][1]
            reason = first.reason if isinstance(first, RequestFailed) else _describe(first)
            attempts = f" after {first.attempts} attempts" if isinstance(first, RequestFailed) and first.attempts > 1 else ""
            raise EngineError(f"{len(failed)} of {len(prompts)} requests to the server at {self.base_url} failed "
                              f"({keys}): {reason}{attempts}")
        await self._fill_texts([t for c in results for t in c.output_ids.tolist()])
        for completion in results:
            completion.token_texts = [self._texts.get(t, "") for t in completion.output_ids.tolist()]
        return results

    async def _completion(self, body: dict, key: str, route: str = "/v1/completions", adapter: str | None = None) -> dict:
        """One request to the server: the served model's, or with `adapter` the adapter's (served by its name)."""
        model = adapter or self.served_model
        body = {"model": model, **body, "return_token_ids": True}
        try:
            response = await self.client.call("POST", route, body)
        except RequestFailed as exc:
            if exc.status == 401:
                raise ConfigError(f"{self.base_url}: the server refused the API key (HTTP 401)",
                                  fix=_key_fix(self.config.api_key_env)) from None
            if exc.status == 404 and "model" in exc.reason.lower():
                raise ConfigError(f"{self._where(self._model_key())}: {exc.reason}",
                                  fix="name the served model exactly as GET /v1/models lists it") from None
            raise
        if response.get("model") != model:
            raise ConfigError(f"{self._where(self._model_key())}: the server answered request {key!r} with model "
                              f"{response.get('model')!r}, the suite names {model!r}",
                              fix="point the suite at the server that serves this model (a router or proxy may be "
                                  "sending requests elsewhere)")
        return response

    async def _request(self, prompt: Prompt, cache_salt: str | None = None) -> Completion:
        sampling = self.suite.sampling_for(prompt)
        k = self.suite.sampling["logprobs"]
        salt = {"cache_salt": request_salt(cache_salt, prompt.key)} if cache_salt else {}
        if prompt.request_type in SCORING_TYPES:
            windows = await asyncio.gather(*(
                self._completion({"prompt": list(context) + list(continuation), "max_tokens": 1, "temperature": 0.0,
                                  "prompt_logprobs": k, **salt}, prompt.key, adapter=prompt.adapter)
                for context, continuation in prompt.segments))
            t0 = time.perf_counter()
            try:
                return _scored(prompt, windows, k)
            finally:
                self.client.stats.client_seconds += time.perf_counter() - t0
        body = {**NEUTRAL_SAMPLING, **sampling, **salt, "return_tokens_as_token_ids": True}  # top-k by id: texts collide
        if prompt.messages is not None and prompt.prompt_ids is None and prompt.key not in self.pinned_chats:
            # the server renders the chat with its own template and returns the ids it ran
            body.update(messages=prompt.chat(), logprobs=True, top_logprobs=k)
            if prompt.chat_template_kwargs:
                body["chat_template_kwargs"] = prompt.chat_template_kwargs
            response = await self._completion(body, prompt.key, "/v1/chat/completions", prompt.adapter)
            parse = _chat_completion
        else:
            ids = prompt.prompt_ids if prompt.prompt_ids is not None else self.pinned_chats.get(prompt.key)
            body["prompt"] = list(ids) if ids is not None else prompt.text
            response = await self._completion(body, prompt.key, adapter=prompt.adapter)
            parse = _completion
        t0 = time.perf_counter()
        try:
            return parse(prompt, response, k)
        finally:
            self.client.stats.client_seconds += time.perf_counter() - t0

    async def send_filler(self, prompt: str, max_tokens: int) -> None:
        """One filler request (load.py): not retried, not recorded."""
        await self.client.call("POST", "/v1/completions", {
            **NEUTRAL_SAMPLING, "model": self.served_model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True}, retries=0)

    async def send_trace(self, request) -> None:
        """One trace request (replay.py): its token ids or text, not retried, not recorded."""
        prompt = list(request.prompt_ids) if request.prompt_ids is not None else request.text
        await self.client.call("POST", "/v1/completions", {
            **NEUTRAL_SAMPLING, "model": self.served_model, "prompt": prompt, "max_tokens": request.max_tokens,
            "temperature": 0.0, "ignore_eos": True}, retries=0)

    def replay_timed(self, trace, prompts: list[Prompt], *, seed: int, cache_salt: str | None,
                     step_seconds: float) -> tuple[list[Completion], dict]:
        """The wave's requests at their markers' offsets in a timed replay of `trace` (replay.py)."""
        from ..configuration.trace import materialize

        requests = materialize(trace, self.encode, seed, step_seconds)  # tokenized before the clock starts
        return self.loop.run(self._replay(trace, requests, prompts, cache_salt, step_seconds))

    async def _replay(self, trace, requests, prompts, cache_salt, step_seconds):
        from ..configuration.trace import gated_places
        from .server_traffic import TimedTraffic

        traffic = TimedTraffic(trace, requests, self.send_trace, step_seconds)
        groups: dict[float, list[Prompt]] = {}
        for prompt, place in zip(prompts, gated_places(trace, len(prompts), step_seconds)):
            groups.setdefault(place.seconds, []).append(prompt)
        arrivals: list[dict] = []

        async def group(seconds: float, members: list[Prompt]) -> list[Completion]:
            skew = await traffic.wait_until(seconds)
            running = await self.running_requests()
            arrivals.extend({"key": p.key, "seconds": seconds, "skew_seconds": skew, "running": running} for p in members)
            return await self._generate(members, cache_salt)

        await traffic.start()
        try:
            results = await asyncio.gather(*(group(t, members) for t, members in groups.items()))
        finally:
            stats = await traffic.stop()
        by_key = {c.key: c for outputs in results for c in outputs}
        stats["gated_arrivals"] = arrivals
        return [by_key[p.key] for p in prompts], stats

    async def running_requests(self) -> int | None:
        text = await self._optional("GET", "/metrics")
        if not isinstance(text, str):
            return None
        values = [float(m.group(1)) for m in re.finditer(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", text, re.M)]
        return int(sum(values)) if values else None

    async def _fill_texts(self, ids: list[int]) -> None:
        """Each output token's text (derived: ids are the truth), from the server's /detokenize, cached."""
        missing = sorted(set(ids) - set(self._texts))
        if not missing:
            return

        async def one(token_id: int) -> None:
            try:
                out = await self.client.call("POST", "/detokenize", {"model": self.served_model, "tokens": [token_id]})
                self._texts[token_id] = str(out.get("prompt", ""))
            except RequestFailed:
                self._texts[token_id] = ""

        await asyncio.gather(*(one(t) for t in missing))

    # -- load --

    def under_load(self, load, pass_):
        """Context manager for one pass under filler load (runner.py); yields the dict the filler's
        figures are written into when the pass ends."""
        from contextlib import contextmanager

        from .server_traffic import FillerTraffic

        @contextmanager
        def loaded():
            filler = FillerTraffic(load, pass_.index, self.send_filler, self.running_requests)
            stats: dict[str, Any] = {}
            self.loop.run(filler.start())
            try:
                yield stats
            finally:
                stats.update(self.loop.run(filler.stop()))
            if stats["completed"] == 0 and stats["failed"]:
                raise EngineError(f"filler load for {pass_.label} never succeeded: {stats.get('last_error')}",
                                  fix="check [load] (filler prompts must fit the server's max_model_len)")

        return loaded()

    def close(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None and getattr(self, "client", None) is not None and loop.loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(self.client.aclose(), loop.loop).result(5)
            except Exception:
                pass
        if loop is not None:
            loop.close()


def api_key(suite: Suite) -> str | None:
    name = suite.server.api_key_env
    if name is None:
        return None
    value = os.environ.get(name, "")
    if not value:
        raise ConfigError(f"{suite.path}: `engine.api_key_env` names {name}, which is not set in the environment",
                          fix=f"export {name}=<the server's API key> before running evalgate")
    return value


def _key_fix(name: str | None) -> str:
    if name:
        return f"check the key in ${name} (named by `engine.api_key_env`)"
    return "the server wants an API key: name the environment variable holding it in `engine.api_key_env`"


def _prometheus_labels(text: str, metric: str) -> dict[str, str]:
    for line in text.splitlines():
        if line.startswith(metric + "{"):
            body = line[len(metric) + 1: line.rindex("}")]
            return {m.group(1): m.group(2).encode().decode("unicode_escape")
                    for m in re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', body)}
    return {}


def _token_id(label: str) -> int:
    # with return_tokens_as_token_ids, tokens are "token_id:123"
    return int(label.rsplit(":", 1)[1])


def _completion(prompt: Prompt, response: dict, k: int) -> Completion:
    choice = response["choices"][0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    block = choice.get("logprobs") or {}
    positions = Positions(k)
    for token_id, lp, top in zip(ids, block.get("token_logprobs") or [], block.get("top_logprobs") or []):
        positions.add(token_id, lp, ((_token_id(label), value) for label, value in (top or {}).items()))
    if len(positions.ids) != len(ids):
        raise EngineError(f"request {prompt.key!r}: the server returned {len(ids)} tokens but "
                          f"{len(positions.ids)} logprobs")
    return positions.completion(prompt.key, [int(t) for t in choice.get("prompt_token_ids") or []],
                                text=choice.get("text") or "", finish_reason=str(choice.get("finish_reason")),
                                cached_tokens=cached_tokens([response]))


def _chat_completion(prompt: Prompt, response: dict, k: int) -> Completion:
    """A chat request's record: `/v1/chat/completions` with `return_token_ids` (the templated prompt ids
    and the output ids) and `logprobs` keyed by token id; the same fields as a completion's."""
    choice = response["choices"][0]
    ids = [int(t) for t in choice.get("token_ids") or []]
    content = (choice.get("logprobs") or {}).get("content") or []
    if len(content) != len(ids):
        raise EngineError(f"request {prompt.key!r}: the server returned {len(ids)} tokens but {len(content)} logprobs")
    positions = Positions(k)
    for token_id, position in zip(ids, content):
        positions.add(token_id, position["logprob"],
                      ((_token_id(e["token"]), e["logprob"]) for e in position.get("top_logprobs") or []))
    return positions.completion(prompt.key, [int(t) for t in response.get("prompt_token_ids") or []],
                                text=(choice.get("message") or {}).get("content") or "",
                                finish_reason=str(choice.get("finish_reason")), cached_tokens=cached_tokens([response]))


def cached_tokens(responses: list[dict]) -> int | None:
    """`usage.prompt_tokens_details.cached_tokens`, summed: a vLLM server reports it when started with
    --enable-prompt-tokens-details (the vllm-server kind starts it so); None when any response lacks it."""
    counts = [((r.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") for r in responses]
    return None if not counts or any(n is None for n in counts) else sum(int(n) for n in counts)


def _scored(prompt: Prompt, windows: list[dict], k: int) -> Completion:
    """A scoring request's record from each window's prompt_logprobs: the continuation tokens' logprobs
    and the top-k (by vLLM's rank) at each position, as the in-process engine records them."""
    positions = Positions(k)
    for (context, continuation), response in zip(prompt.segments, windows):
        prompt_logprobs = response["choices"][0].get("prompt_logprobs") or []
        for offset, token_id in enumerate(continuation):
            position = {int(t): v for t, v in (prompt_logprobs[len(context) + offset] or {}).items()}
            positions.add(token_id, position[token_id]["logprob"], ((t, v["logprob"]) for t, v in position.items()))
    first = windows[0]["choices"][0] if windows else {}
    return positions.completion(prompt.key, [int(t) for t in first.get("prompt_token_ids") or []],
                                text=prompt.continuation if prompt.continuation is not None else "",
                                finish_reason="scored", cached_tokens=cached_tokens(windows))
