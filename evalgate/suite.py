"""Suite files: what to run (model, engine, sampling, prompts) and how (the schedule).

A suite is a TOML file, or the `[tool.evalgate]` table of a pyproject.toml. Relative paths resolve against
the directory of that file, never the working directory. Every mistake is reported as a ConfigError that
names the file, the field (or prompts-file line) and the fix. docs/suite.md documents the format.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError
from .hashing import digest

if TYPE_CHECKING:
    from .engines.openai_api import ServerConfig
    from .load import Load

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_DATABASE = "sqlite:///baselines/evalgate.sqlite"
ENGINE_KINDS = ("vllm", "openai", "vllm-server")  # the last two: evalgate/engines/openai_api.py
# Keys of [engine] that evalgate itself reads; every other key is passed to vLLM's engine as is.
ENGINE_OWN_KEYS = {"kind", "model", "tokenizer", "batch_invariant"}
SAMPLING_KEYS = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": int,
    "min_p": (int, float),
    "max_tokens": int,
    "seed": int,
    "logprobs": int,
    "stop": list,
    "repetition_penalty": (int, float),
    "presence_penalty": (int, float),
    "frequency_penalty": (int, float),
    "ignore_eos": bool,
}
PROMPT_KEYS = {"id", "prompt", "max_tokens", "metadata"}
LM_EVAL_KEYS = {"tasks", "include_path", "limit", "num_fewshot", "fewshot_seed", "bootstrap_iters", "add_bos_token"}
# Request types: plain prompts are `generate`; lm-eval produces the other three (evalgate/lmeval.py).
SCORING_TYPES = ("loglikelihood", "loglikelihood_rolling")

# Size limits, checked with stat() before anything is read (docs/suite.md, "Limits"): both files are read
# into memory whole. A suite file is configuration; prompts belong in the prompts file.
MAX_SUITE_BYTES = 1 << 20  # 1 MiB
DEFAULT_MAX_PROMPTS_BYTES = 256 << 20  # 256 MiB
MAX_PROMPTS_ENV = "EVALGATE_MAX_PROMPTS_BYTES"


@dataclass(frozen=True)
class Prompt:
    """One request of the suite: a line of the prompts file, or a request lm-eval built from a task."""

    key: str
    text: str
    max_tokens: int | None
    line: int  # 1-based line in the prompts file, for error messages and CI annotations (0 for lm-eval)
    # The fields below are set for lm-eval requests only (evalgate/lmeval.py).
    request_type: str = "generate"  # generate | generate_until | loglikelihood | loglikelihood_rolling
    prompt_ids: tuple[int, ...] | None = None  # pre-tokenized the way lm-eval tokenizes (generate_until)
    # Scoring requests: (context ids, continuation ids) windows whose continuation tokens are scored.
    segments: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    continuation: str | None = None  # the scored text (loglikelihood)
    sampling: dict | None = None  # the task's generation settings, over the suite's [sampling]
    location: str | None = None  # "task.yaml doc 3", for reports


@dataclass(frozen=True)
class LmEvalConfig:
    """The suite's [lm_eval] table: lm-eval tasks to run as evalgate requests (docs/suite.md)."""

    tasks: tuple[str, ...]
    include_path: tuple[Path, ...] = ()
    limit: int | float | None = None
    num_fewshot: int | None = None
    fewshot_seed: int = 1234
    bootstrap_iters: int = 100000
    add_bos_token: bool | None = None


@dataclass(frozen=True)
class Schedule:
    """Runtime knobs: never part of identity (that exclusion is what makes a silent regression provable)."""

    concurrency: tuple[int, ...] = (1, 8)
    shuffles: int = 1
    repeats: int = 1
    seed: int = 0
    load: Load | None = None  # [load]: filler traffic for server engines (evalgate/load.py)


@dataclass
class Suite:
    name: str
    path: Path  # the suite file
    model: Path | None  # None only for kind = "openai" without a local copy of the model
    tokenizer: Path | None
    engine_kind: str
    batch_invariant: bool
    engine_args: dict[str, Any]
    sampling: dict[str, Any]
    prompts_file: Path | None  # None: the suite has lm-eval tasks only
    prompts: list[Prompt]
    schedule: Schedule
    code_paths: list[Path]
    database: str
    lm_eval: LmEvalConfig | None = None
    # Identity of the lm-eval tasks (config and documents), filled in once they are built (evalgate/lmeval.py).
    task_identity: dict[str, Any] = field(default_factory=dict)
    server: ServerConfig | None = None  # kinds "openai" and "vllm-server" (evalgate/engines/openai_api.py)
    root: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.path.parent

    def sampling_for(self, prompt: Prompt) -> dict[str, Any]:
        """The effective vLLM sampling parameters of a request. Scoring requests generate nothing: they
        ask for the top-k logprobs of every prompt token."""
        if prompt.request_type in SCORING_TYPES:
            return {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": self.sampling["logprobs"]}
        params = dict(self.sampling)
        if prompt.max_tokens is not None:
            params["max_tokens"] = prompt.max_tokens
        params.update(prompt.sampling or {})
        return params

    def request_hash(self, prompt: Prompt) -> str:
        """Identity of one request: its text and effective sampling parameters (not its key)."""
        if prompt.request_type == "generate":
            return digest({"prompt": prompt.text, "sampling": self.sampling_for(prompt)})
        return digest({"type": prompt.request_type, "prompt": prompt.text, "continuation": prompt.continuation,
                       "sampling": self.sampling_for(prompt)})

    def identity(self) -> dict[str, Any]:
        """The `suite` fingerprint component: every request key with its request hash, plus the lm-eval
        tasks' configuration and document digests when the suite has tasks."""
        identity: dict[str, Any] = {"requests": {p.key: self.request_hash(p) for p in self.prompts}}
        if self.task_identity:
            identity["tasks"] = self.task_identity
        return identity

    @property
    def locations(self) -> dict[str, str]:
        """Request key -> 'file:line' (or the lm-eval task and document), for reports that point at the source."""
        return {p.key: p.location or f"{self.prompts_file}:{p.line}" for p in self.prompts}


def _fail(where: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{where}: {message}", fix=fix)


def _check_keys(table: dict, allowed: set[str], where: str, section: str) -> None:
    import difflib

    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(sorted(allowed))}"
            raise _fail(where, f"unknown key `{section}{key}`", hint)


def _typed(table: dict, key: str, types, where: str, section: str, default=None):
    if key not in table:
        return default
    value = table[key]
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise _fail(where, f"`{section}{key}` must be {_type_name(types)}, got a boolean", f"set `{key}` to a {_type_name(types)}")
    if not isinstance(value, types):
        raise _fail(
            where, f"`{section}{key}` must be {_type_name(types)}, got {type(value).__name__} {value!r}",
            f"set `{key}` to a {_type_name(types)}",
        )
    return value


def _type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a table"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _resolve(root: Path, value: str, where: str, field: str) -> Path:
    """`root / value`, resolved. A path the OS cannot look at (NUL byte, name too long, symlink loop, no
    permission) is a ConfigError naming the field; a path that does not exist is returned for the caller to judge."""
    try:
        path = (root / value).resolve()
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: symlink loop in resolve() (Python < 3.13)
        raise _fail(where, f"`{field}` = {_short(value)} is not a usable path ({_os_reason(exc)})",
                    f"set `{field}` to an existing path (relative to the suite file's directory)") from None
    return path


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def _not_json(value: Any) -> str | None:
    """Why `value` cannot be part of an identity hash (canonical JSON), or None if it can."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"a non-finite number ({value})"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return f"a TOML date/time ({value.isoformat()})"
    if isinstance(value, list):
        return next((r for r in map(_not_json, value) if r), None)
    if isinstance(value, dict):
        return next((r for r in map(_not_json, value.values()) if r), None)
    return None


def _read_capped(path: Path, limit: int, what: str, fix: str) -> bytes:
    """The file's bytes; refused before reading (stat) when larger than `limit`, and never more than
    `limit` bytes read even if the file grows or stat() reports no size (pipes, /proc)."""
    size = path.stat().st_size
    if size > limit:
        raise ConfigError(f"{path}: {what} is {size} bytes ({_mib(size)}), over the limit of {limit} bytes "
                          f"({_mib(limit)})", fix=fix)
    with path.open("rb") as f:
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise ConfigError(f"{path}: {what} is over the limit of {limit} bytes ({_mib(limit)})", fix=fix)
    return raw


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


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


def _read_toml(path: Path) -> dict:
    try:
        raw = _read_capped(path, MAX_SUITE_BYTES, "the suite file",
                           fix="a suite file is configuration only: keep prompts in the [prompts].file JSONL file "
                               "and remove anything else that makes it this large")
    except FileNotFoundError:
        raise ConfigError(f"{path}: suite file not found", fix="pass the path of an existing suite TOML file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read suite file ({exc.strerror})", fix="check the path and its permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 (byte {exc.start})", fix="save the suite file as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}", fix="fix the TOML syntax at the position shown") from None
    except RecursionError:
        raise ConfigError(f"{path}: malformed TOML: arrays or inline tables nested too deeply",
                          fix="flatten the nesting (a suite needs at most a few levels)") from None


def find_suite(path: str | Path | None = None) -> Path:
    """The suite file to use: the given path, else ./evalgate.toml, else ./pyproject.toml with [tool.evalgate]."""
    if path is not None:
        return Path(path)
    for candidate in (Path("evalgate.toml"), Path("pyproject.toml")):
        if candidate.is_file() and (candidate.name != "pyproject.toml" or "[tool.evalgate" in candidate.read_text(errors="replace")):
            return candidate
    raise ConfigError("no suite file given and none found (evalgate.toml or [tool.evalgate] in pyproject.toml)",
                      fix="pass the suite file: evalgate check path/to/suite.toml")


def load_suite(path: str | Path, *, database: str | None = None) -> Suite:
    """Load and validate a suite file; `database` (e.g. --db) overrides the file's database URL, relative to the cwd."""
    try:
        path = Path(path).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: symlink loop (Python < 3.13)
        raise ConfigError(f"{path}: cannot read suite file ({_os_reason(exc)})", fix="check the path") from None
    data = _read_toml(path)
    where = str(path)
    prefix = ""
    if path.name == "pyproject.toml":
        tool = data.get("tool", {})
        data = tool.get("evalgate") if isinstance(tool, dict) else None
        prefix = "tool.evalgate."
        if data is None:
            raise ConfigError(f"{where}: no [tool.evalgate] table", fix="add a [tool.evalgate] table (see docs/suite.md)")
        if not isinstance(data, dict):
            raise _fail(where, "`tool.evalgate` must be a table", "write it as [tool.evalgate] with tables below it")
    root = path.parent

    # [cost] belongs to `evalgate cost` (evalgate/cost.py validates it); it never changes a run.
    _check_keys(data, {"suite", "engine", "sampling", "prompts", "schedule", "lm_eval", "cost", "load"}, where, prefix)
    tables = {}
    for name in ("suite", "engine", "sampling", "prompts", "schedule", "lm_eval", "load"):
        value = data.get(name, {})
        if not isinstance(value, dict):
            raise _fail(where, f"`{prefix}{name}` must be a table", f"write it as [{prefix}{name}]")
        tables[name] = value

    suite_t = tables["suite"]
    _check_keys(suite_t, {"name", "database", "code_paths"}, where, f"{prefix}suite.")
    name = _typed(suite_t, "name", str, where, f"{prefix}suite.", default=path.parent.name if prefix else path.stem)
    db_url = _typed(suite_t, "database", str, where, f"{prefix}suite.", default=DEFAULT_DATABASE)
    code_paths = []
    for item in _typed(suite_t, "code_paths", list, where, f"{prefix}suite.", default=[]):
        if not isinstance(item, str):
            raise _fail(where, f"`{prefix}suite.code_paths` entries must be strings, got {item!r}", "list paths as strings")
        p = _resolve(root, item, where, f"{prefix}suite.code_paths")
        if not p.exists():
            raise _fail(where, f"`{prefix}suite.code_paths` entry {item!r} does not exist ({p})", "fix or remove the path")
        code_paths.append(p)

    engine_t = dict(tables["engine"])
    sec = f"{prefix}engine."
    kind = _typed(engine_t, "kind", str, where, sec, default="vllm")
    if kind not in ENGINE_KINDS:
        raise _fail(where, f"`{sec}kind` is {kind!r}", f"use one of: {', '.join(ENGINE_KINDS)}")
    server = None
    if kind != "vllm":  # server kinds: evalgate/engines/openai_api.py validates their keys
        from .engines.openai_api import parse_server_engine

        parsed = parse_server_engine(kind, engine_t, root, where, sec)
        model, tokenizer, server = parsed["model"], parsed["tokenizer"], parsed["server"]
        batch_invariant, engine_args = parsed["batch_invariant"], parsed["engine_args"]
    else:
        model_s = _typed(engine_t, "model", str, where, sec)
        if not model_s:
            raise _fail(where, f"`{sec}model` is missing", "set it to a local model directory (config.json + weights)")
        model = _resolve(root, model_s, where, f"{sec}model")
        if not _is_dir(model) or not _is_file(model / "config.json"):
            raise _fail(
                where, f"`{sec}model`: {model} is not a model directory (no config.json)",
                "point it at a local Hugging Face model directory; `evalgate build-model DIR` builds a tiny one",
            )
        tok_s = _typed(engine_t, "tokenizer", str, where, sec)
        tokenizer = _resolve(root, tok_s, where, f"{sec}tokenizer") if tok_s else None
        if tokenizer is not None and not _is_dir(tokenizer):
            raise _fail(where, f"`{sec}tokenizer`: {tokenizer} is not a directory", "point it at a tokenizer directory")
        batch_invariant = _typed(engine_t, "batch_invariant", bool, where, sec, default=True)
        engine_args = {k: v for k, v in engine_t.items() if k not in ENGINE_OWN_KEYS}
        for key, value in engine_args.items():
            reason = _not_json(value)
            if reason:  # the engine identity is hashed as canonical JSON; vLLM takes no such values anyway
                raise _fail(where, f"`{sec}{key}` holds {reason}", "use a string, a finite number, true/false, a list or a table")

    sampling_t = tables["sampling"]
    sec = f"{prefix}sampling."
    _check_keys(sampling_t, set(SAMPLING_KEYS), where, sec)
    sampling: dict[str, Any] = {"temperature": 0.0, "max_tokens": 32, "logprobs": 5}
    for key, types in SAMPLING_KEYS.items():
        value = _typed(sampling_t, key, types, where, sec)
        if value is not None:
            if key == "stop" and not all(isinstance(s, str) for s in value):
                raise _fail(where, f"`{sec}stop` entries must be strings, got {_short(value)}",
                            'list stop strings, e.g. stop = ["\\n\\n"]')
            reason = _not_json(value)
            if reason:  # request hashes are canonical JSON: nan/inf cannot be identity
                raise _fail(where, f"`{sec}{key}` is {reason}", f"set `{key}` to a finite number")
            # 1 and 1.0 must hash alike: numbers of float-valued parameters are stored as floats.
            sampling[key] = float(value) if isinstance(types, tuple) and float in types else value
    if sampling["max_tokens"] < 1:
        raise _fail(where, f"`{sec}max_tokens` must be >= 1", "set max_tokens to a positive integer")
    if sampling["logprobs"] < 2:
        raise _fail(where, f"`{sec}logprobs` must be >= 2", "evalgate needs the top-2 logprobs for margins; use 2 or more")
    if float(sampling["temperature"]) > 0 and "seed" not in sampling:
        raise _fail(where, f"`{sec}temperature` > 0 without `{sec}seed`", "set a sampling seed, or temperature = 0")

    lm_eval = _lm_eval_config(tables["lm_eval"], root, where, f"{prefix}lm_eval.") if "lm_eval" in data else None

    prompts_t = tables["prompts"]
    sec = f"{prefix}prompts."
    _check_keys(prompts_t, {"file"}, where, sec)
    file_s = _typed(prompts_t, "file", str, where, sec)
    prompts_file, prompts = None, []
    if file_s:
        prompts_file = _resolve(root, file_s, where, f"{sec}file")
        if not _is_file(prompts_file):
            state = "is a directory" if _is_dir(prompts_file) else "does not exist" if not prompts_file.exists() else "is not a regular file"
            raise _fail(where, f"`{sec}file`: {prompts_file} {state}", "set it to an existing JSONL file (relative to the suite file)")
        prompts = load_prompts(prompts_file)
    elif lm_eval is None:
        raise _fail(where, f"`{sec}file` is missing",
                    "set it to a JSONL file of {\"id\": ..., \"prompt\": ...} lines, or name lm-eval tasks in [lm_eval]")

    sched_t = tables["schedule"]
    sec = f"{prefix}schedule."
    _check_keys(sched_t, {"concurrency", "shuffles", "repeats", "seed"}, where, sec)
    concurrency = _typed(sched_t, "concurrency", list, where, sec, default=[1, 8])
    if not concurrency or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in concurrency):
        raise _fail(where, f"`{sec}concurrency` must be a non-empty list of positive integers", "e.g. concurrency = [1, 8, 32]")
    schedule = Schedule(
        concurrency=tuple(concurrency),
        shuffles=_typed(sched_t, "shuffles", int, where, sec, default=1),
        repeats=_typed(sched_t, "repeats", int, where, sec, default=1),
        seed=_typed(sched_t, "seed", int, where, sec, default=0),
    )
    if schedule.shuffles < 0 or schedule.repeats < 1:
        raise _fail(where, f"`{sec}shuffles` must be >= 0 and `{sec}repeats` >= 1", "fix the schedule counts")
    if "load" in data:
        if kind == "vllm":
            raise _fail(where, f"[{prefix}load] needs a server engine (filler traffic is sent over HTTP)",
                        'set `engine.kind` to "openai" or "vllm-server", or remove [load] (docs/server.md)')
        from .load import parse_load

        schedule = dataclasses.replace(schedule, load=parse_load(tables["load"], where, f"{prefix}load.", schedule.concurrency))

    # A database from the file is relative to the file; one given on the command line (--db), to the cwd.
    if database:
        db = resolve_database_url(database, Path.cwd(), where="--db")
    else:
        db = resolve_database_url(db_url, root, where=f"{where}: `{prefix}suite.database`")
    return Suite(
        name=name, path=path, model=model, tokenizer=tokenizer, engine_kind=kind, batch_invariant=batch_invariant,
        engine_args=engine_args, sampling=sampling, prompts_file=prompts_file, prompts=prompts, schedule=schedule,
        code_paths=code_paths, database=db, lm_eval=lm_eval, server=server,
    )


def _lm_eval_config(table: dict, root: Path, where: str, sec: str) -> LmEvalConfig:
    _check_keys(table, LM_EVAL_KEYS, where, sec)
    tasks = _typed(table, "tasks", list, where, sec, default=[])
    if not tasks or not all(isinstance(t, str) and t.strip() for t in tasks):
        raise _fail(where, f"`{sec}tasks` must be a non-empty list of task names",
                    'e.g. tasks = ["my_task"] with include_path = ["tasks"], or built-in names such as "arc_easy"')
    if len(set(tasks)) != len(tasks):
        raise _fail(where, f"`{sec}tasks` names a task twice", "list every task once")
    include = _typed(table, "include_path", (str, list), where, sec, default=[])
    include = [include] if isinstance(include, str) else include
    paths = []
    for item in include:
        if not isinstance(item, str):
            raise _fail(where, f"`{sec}include_path` entries must be strings, got {item!r}", "list directories as strings")
        p = _resolve(root, item, where, f"{sec}include_path")
        if not _is_dir(p):
            raise _fail(where, f"`{sec}include_path`: {p} is not a directory",
                        "point it at a directory of lm-eval task YAML files (relative to the suite file)")
        paths.append(p)
    limit = _typed(table, "limit", (int, float), where, sec)
    if limit is not None and (limit <= 0 or (isinstance(limit, float) and limit > 1.0)):
        raise _fail(where, f"`{sec}limit` is {limit}", "use a document count (integer >= 1) or a fraction in (0, 1]")
    num_fewshot = _typed(table, "num_fewshot", int, where, sec)
    if num_fewshot is not None and num_fewshot < 0:
        raise _fail(where, f"`{sec}num_fewshot` must be >= 0", "set num_fewshot to 0 or more")
    bootstrap = _typed(table, "bootstrap_iters", int, where, sec, default=100000)
    if bootstrap < 0:
        raise _fail(where, f"`{sec}bootstrap_iters` must be >= 0", "use 0 to skip bootstrapped standard errors")
    return LmEvalConfig(
        tasks=tuple(tasks), include_path=tuple(paths), limit=limit, num_fewshot=num_fewshot,
        fewshot_seed=_typed(table, "fewshot_seed", int, where, sec, default=1234), bootstrap_iters=bootstrap,
        add_bos_token=_typed(table, "add_bos_token", bool, where, sec),
    )


def resolve_database_url(url: str, root: Path, where: str = "database") -> str:
    """SQLite paths in a suite file are relative to the suite file's directory."""
    try:
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            return "sqlite:///" + str((root / url[len("sqlite:///"):]).resolve())
        if "://" not in url:  # a bare path
            return "sqlite:///" + str((root / url).resolve())
    except (OSError, ValueError, RuntimeError) as exc:  # NUL byte, symlink loop (Python < 3.13)
        raise ConfigError(f"{where}: {_short(url)} is not a usable path ({_os_reason(exc)})",
                          fix="give a SQLite file path or a SQLAlchemy URL, e.g. sqlite:///baselines/evalgate.sqlite") from None
    return url


def load_prompts(path: Path) -> list[Prompt]:
    """Read a JSONL prompts file: one {"id", "prompt", optional "max_tokens", "metadata"} object per line."""
    limit = max_prompts_bytes(path)
    try:
        raw = _read_capped(path, limit, "the prompts file",
                           fix=f"split the prompts over several suites, or raise the limit: {MAX_PROMPTS_ENV}=<bytes> "
                               "(the whole file is read into memory)")
    except FileNotFoundError:
        raise ConfigError(f"{path}: prompts file not found", fix="set [prompts].file to an existing JSONL file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read prompts file ({exc.strerror})", fix="check the path and its permissions") from None
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 (byte {exc.start} of the line)", fix="save the prompts file as UTF-8") from None
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
                fix="allowed: id, prompt, max_tokens, metadata (put anything else under `metadata`)",
            )
        key = obj.get("id")
        if isinstance(key, bool) or not isinstance(key, (str, int)) or str(key) == "":
            raise ConfigError(f"{where}: field `id` must be a non-empty string or integer", fix="give every prompt a unique id")
        key = str(key)
        if _has_surrogate(key):
            raise ConfigError(f"{where}: field `id` contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)",
                              fix="write the character itself, or a complete surrogate pair")
        if key in seen:
            raise ConfigError(f"{where}: duplicate id {key!r} (first on line {seen[key]})", fix="make every id unique")
        seen[key] = lineno
        prompt = obj.get("prompt")
        if not isinstance(prompt, str) or prompt == "":
            raise ConfigError(f"{where}: field `prompt` must be a non-empty string", fix="write the prompt text")
        if "\x00" in prompt:
            raise ConfigError(f"{where}: field `prompt` contains a NUL character", fix="remove NUL characters")
        if _has_surrogate(prompt):  # not encodable as UTF-8: the tokenizer and the database would fail mid-run
            raise ConfigError(f"{where}: field `prompt` contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)",
                              fix="write the character itself, or a complete surrogate pair")
        max_tokens = obj.get("max_tokens")
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
            raise ConfigError(f"{where}: field `max_tokens` must be a positive integer", fix="fix or remove max_tokens")
        prompts.append(Prompt(key=key, text=prompt, max_tokens=max_tokens, line=lineno))
    if not prompts:
        raise ConfigError(f"{path}: prompts file is empty", fix='add lines like {"id": "p1", "prompt": "Hello"}')
    return prompts


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False
