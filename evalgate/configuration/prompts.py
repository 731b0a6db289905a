"""The prompts file and the requests a suite runs.

A prompts file is JSONL: one `{"id", "prompt", optional "max_tokens", "metadata"}` object per line, or a
chat request: `messages` (OpenAI shape, role/content) instead of `prompt`, with optional
`chat_template_kwargs` (docs/suite.md). A line's `adapter` names the LoRA adapter it runs under (one of the
suite's `[adapters]`); `[prompts] adapters = [...]` runs every other line under each adapter listed, as the
request `id@adapter` (`id` itself under "base", the base model). The model's chat template turns messages into prompt ids
(engines/base.py `Engine.encode_chat`; a server applies its own, `/v1/chat/completions`). Every mistake
is a ConfigError naming the file and line. lm-eval tasks produce the same `Prompt` objects
(evalgate/lmeval/tasks.py), with the scoring fields set.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError
from .adapters import BASE_MODEL, adapter_choices
from .config import BOM, LFS_FIX, LFS_POINTER, not_utf8, read_capped

PROMPT_KEYS = {"id", "prompt", "messages", "chat_template_kwargs", "max_tokens", "metadata", "adapter"}
CHAT_ROLES = ("system", "developer", "user", "assistant")
# Request types: plain prompts are `generate`; lm-eval produces the other three (evalgate/lmeval/tasks.py).
SCORING_TYPES = ("loglikelihood", "loglikelihood_rolling")
# The prompts file is read into memory whole (docs/suite.md, "Limits").
DEFAULT_MAX_PROMPTS_BYTES = 256 << 20  # 256 MiB
MAX_PROMPTS_ENV = "EVALGATE_MAX_PROMPTS_BYTES"


@dataclass(frozen=True, slots=True)  # slots: a leaderboard-sized suite holds hundreds of thousands
class Prompt:
    """One request of the suite: a line of the prompts file, or a request lm-eval built from a task."""

    key: str
    text: str
    max_tokens: int | None
    line: int  # 1-based line in the prompts file, for error messages and CI annotations (0 for lm-eval)
    # The fields below are set for lm-eval requests only (evalgate/lmeval/tasks.py).
    request_type: str = "generate"  # generate | generate_until | loglikelihood | loglikelihood_rolling
    prompt_ids: Sequence[int] | None = None  # pre-tokenized the way lm-eval tokenizes (generate_until: int32)
    # Scoring requests: (context ids, continuation ids) windows whose continuation tokens are scored; lm-eval's
    # as int32 arrays (lmeval/harness.py), others as tuples: read them as sequences of ints
    segments: tuple[tuple[Sequence[int], Sequence[int]], ...] = ()
    continuation: str | None = None  # the scored text (loglikelihood)
    sampling: dict | None = None  # the task's generation settings, over the suite's [sampling]
    location: str | None = None  # "task.yaml doc 3", for reports
    # Chat requests (a `messages` line): the conversation, rendered by the model's chat template.
    messages: tuple[dict[str, str], ...] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    adapter: str | None = None  # the LoRA adapter it runs under (configuration/adapters.py); None: the base model

    def chat(self) -> list[dict[str, str]]:
        """The conversation as the chat APIs take it."""
        return [dict(m) for m in self.messages or ()]


def max_prompts_bytes(path: Path) -> int:
    """The prompts-file size limit: $EVALGATE_MAX_PROMPTS_BYTES, else 256 MiB."""
    value = os.environ.get(MAX_PROMPTS_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_PROMPTS_BYTES
    try:
        limit = int(value)
    except ValueError:
        limit = 0
    if limit < 1:
        raise ConfigError(f"{path}: {MAX_PROMPTS_ENV}={value!r} is not a positive number of bytes",
                          fix=f"set {MAX_PROMPTS_ENV} to a byte count, e.g. {DEFAULT_MAX_PROMPTS_BYTES}, or unset it")
    return limit


def adapter_key(key: str, adapter: str | None) -> str:
    """A prompt's request key under an adapter of `[prompts] adapters`: `id@adapter`, `id` under the base model."""
    return key if adapter in (None, BASE_MODEL) else f"{key}@{adapter}"


def load_prompts(path: Path, adapters: tuple[str, ...] = (), run_under: tuple[str, ...] = ()) -> list[Prompt]:
    """Read a JSONL prompts file: one {"id", "prompt", optional "max_tokens", "metadata"} object per line.
    `adapters`: the suite's adapter names (a line's `adapter` must be one); `run_under`: `[prompts] adapters`,
    the adapters (or "base") every line that names none runs under."""
    limit = max_prompts_bytes(path)
    try:
        raw = read_capped(path, limit, "the prompts file",
                           fix=f"split the prompts over several suites, or raise the limit: {MAX_PROMPTS_ENV}=<bytes> "
                               "(the whole file is read into memory)")
    except FileNotFoundError:
        raise ConfigError(f"{path}: prompts file not found", fix="set [prompts].file to an existing JSONL file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read prompts file ({exc.strerror})", fix="check the path and its permissions") from None
    if raw.startswith(LFS_POINTER):
        raise ConfigError(f"{path}: a Git LFS pointer, not the prompts file it stands for", fix=LFS_FIX)
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    raw = raw.removeprefix(BOM.encode())  # an editor's byte-order mark: not part of line 1 (config.py without_bom)
    if raw.lstrip().startswith(b"["):  # a dataset exported as one JSON array (a .json file), not JSON Lines
        target = f"{path.stem}.jsonl" if path.suffix != ".jsonl" else f"{path.stem}-lines.jsonl"  # never the input
        raise ConfigError(f"{path}: a JSON array; a prompts file is JSON Lines, one object per line",
                          fix=f"convert it: jq -c '.[]' {path.name} > {target}, then name that file in [prompts].file")
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise not_utf8(f"{where}: not UTF-8 (byte {exc.start} of the line)", raw, "prompts file") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})", fix="write one JSON object per line") from None
        except ValueError as exc:  # e.g. an integer over Python's 4300-digit conversion limit
            raise ConfigError(f"{where}: invalid JSON: {exc}", fix="write one JSON object per line") from None
        except RecursionError:
            raise ConfigError(f"{where}: invalid JSON: nested too deeply", fix="write one flat JSON object per line") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{where}: expected a JSON object", fix='write {"id": ..., "prompt": ...}')
        unknown = set(obj) - PROMPT_KEYS
        if unknown:
            raise ConfigError(
                f"{where}: unknown field(s) {', '.join(sorted(unknown))}",
                fix="allowed: id, prompt or messages, chat_template_kwargs, max_tokens, adapter, metadata (put anything "
                    "else under `metadata`)",
            )
        key = obj.get("id")
        if isinstance(key, bool) or not isinstance(key, (str, int)) or str(key) == "":
            raise ConfigError(f"{where}: field `id` must be a non-empty string or integer", fix="give every prompt a unique id")
        key = str(key)
        if _has_surrogate(key):
            raise ConfigError(f"{where}: field `id` contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)",
                              fix="write the character itself, or a complete surrogate pair")
        own = _adapter(obj, where, adapters)
        chat = "messages" in obj
        if chat == ("prompt" in obj):
            raise ConfigError(f"{where}: give either `prompt` (text) or `messages` (a chat), not "
                              f"{'both' if chat else 'neither'}",
                              fix='{"id": "q1", "prompt": "Hello"} or {"id": "q1", "messages": [{"role": "user", "content": "Hello"}]}')
        messages = kwargs = None
        if chat:
            messages = _messages(obj["messages"], where)
            prompt = json.dumps(list(messages), ensure_ascii=False)  # the request's text: its conversation
            kwargs = obj.get("chat_template_kwargs")
            if kwargs is not None and not isinstance(kwargs, dict):
                raise ConfigError(f"{where}: field `chat_template_kwargs` must be a JSON object",
                                  fix='e.g. "chat_template_kwargs": {"enable_thinking": false}')
        else:
            if "chat_template_kwargs" in obj:
                raise ConfigError(f"{where}: field `chat_template_kwargs` is only for `messages` prompts",
                                  fix="remove it, or write the prompt as `messages`")
            prompt = _text(obj.get("prompt"), where, "prompt")
        max_tokens = obj.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise ConfigError(f"{where}: field `max_tokens` must be a positive integer", fix="fix or remove max_tokens")
        for adapter in (own,) if own or not run_under else run_under:
            request = key if own else adapter_key(key, adapter)  # a line's own adapter keeps its id
            if request in seen:
                raise ConfigError(f"{where}: duplicate id {request!r} (first on line {seen[request]})",
                                  fix="make every id unique (a prompt run under several adapters is `id@adapter`)")
            seen[request] = lineno
            prompts.append(Prompt(key=request, text=prompt, max_tokens=max_tokens, line=lineno, messages=messages,
                                  chat_template_kwargs=kwargs, adapter=None if adapter == BASE_MODEL else adapter))
    if not prompts:
        raise ConfigError(f"{path}: prompts file is empty", fix='add lines like {"id": "p1", "prompt": "Hello"}')
    return prompts


def _adapter(obj: dict, where: str, adapters: tuple[str, ...]) -> str | None:
    """A line's `adapter`: one of the suite's [adapters] (or "base"), None when the line names none."""
    if "adapter" not in obj:
        return None
    name = obj["adapter"]
    if name == BASE_MODEL:
        return BASE_MODEL
    if not isinstance(name, str) or name not in adapters:
        raise ConfigError(f"{where}: field `adapter` is {name!r}, not an adapter of the suite",
                          fix=adapter_choices(adapters))
    return name


def _text(value, where: str, field: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (value == "" and not empty):
        raise ConfigError(f"{where}: field `{field}` must be a {'' if empty else 'non-empty '}string", fix="write the text")
    if "\x00" in value:
        raise ConfigError(f"{where}: field `{field}` contains a NUL character", fix="remove NUL characters")
    if _has_surrogate(value):  # not encodable as UTF-8: the tokenizer and the database would fail mid-run
        raise ConfigError(f"{where}: field `{field}` contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)",
                          fix="write the character itself, or a complete surrogate pair")
    return value


def _messages(value, where: str) -> tuple[dict[str, str], ...]:
    """A chat in the OpenAI shape: a non-empty list of {"role", "content"} objects with text content."""
    example = '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]'
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: field `messages` must be a non-empty list of {{\"role\", \"content\"}} objects",
                          fix=f"e.g. \"messages\": {example}")
    messages = []
    for n, message in enumerate(value):
        at = f"`messages[{n}]`"
        if not isinstance(message, dict) or set(message) != {"role", "content"}:
            got = sorted(message) if isinstance(message, dict) else type(message).__name__
            raise ConfigError(f"{where}: {at} must be an object with exactly `role` and `content` (got {got})",
                              fix=f"e.g. \"messages\": {example}")
        if message["role"] not in CHAT_ROLES:
            raise ConfigError(f"{where}: {at}.role is {message['role']!r}", fix=f"use one of {', '.join(CHAT_ROLES)}")
        content = _text(message["content"], where, f"messages[{n}].content", empty=message["role"] == "assistant")
        messages.append({"role": message["role"], "content": content})
    return tuple(messages)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
