"""Reading configuration tables: the one place that turns TOML values into checked Python values.

Every reader here raises a ConfigError whose message names the file and the field (`where`: the file,
`section`: the dotted prefix such as `engine.` or `tool.evalgate.engine.`) and whose `fix` says what to
write instead. The suite file (evalgate/configuration/suite.py), each engine kind's `[engine]` keys
(evalgate/engines/), `[load]` (evalgate/configuration/load.py) and `[cost]` (evalgate/cost.py) are all parsed with it.
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .lock import HubResolver, is_hub_id, resolve_hub_repo

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# A suite file is configuration; prompts belong in the prompts file (docs/suite.md, "Limits").
MAX_SUITE_BYTES = 1 << 20  # 1 MiB
READ_CHUNK = 1 << 20  # how much more `read_capped` reads at a time from a file larger than stat() said


# [engine] keys every kind reads; the rest of the table is the kind's own (or passed through to vLLM).
# `revision`/`tokenizer_revision`: the Hub revision when `model`/`tokenizer` is a Hub repo id (configuration/lock.py).
COMMON_KEYS = frozenset({"kind", "model", "revision", "tokenizer", "tokenizer_revision", "batch_invariant"})


def fail(where: str, message: str, fix: str) -> ConfigError:
    return ConfigError(f"{where}: {message}", fix=fix)


def check_keys(table: dict, allowed: set[str], where: str, section: str) -> None:
    """Refuse a key not in `allowed`, with a did-you-mean when one is close."""
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, sorted(allowed), n=1)
            hint = f"did you mean `{close[0]}`?" if close else f"allowed keys: {', '.join(sorted(allowed))}"
            raise fail(where, f"unknown key `{section}{key}`", hint)


def typed(table: dict, key: str, types, where: str, section: str, default=None):
    """`table[key]` if it is of `types` (a bool is never an int here), `default` if absent."""
    if key not in table:
        return default
    value = table[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if isinstance(value, bool) and bool not in allowed:
        raise fail(where, f"`{section}{key}` must be {type_name(types)}, got a boolean", f"set `{key}` to {type_name(types)}")
    if not isinstance(value, types):
        raise fail(where, f"`{section}{key}` must be {type_name(types)}, got {type(value).__name__} {value!r}",
                   f"set `{key}` to {type_name(types)}")
    return value


def type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list", dict: "a table"}
    return " or ".join(dict.fromkeys(names.get(t, t.__name__) for t in types))


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 5] + "...'"


def os_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def resolve_path(root: Path, value: str, where: str, field: str) -> Path:
    """`root / value`, resolved (`~` is the home directory, as in a shell). A path the OS cannot look at (NUL
    byte, name too long, symlink loop, no permission) is a ConfigError naming the field; a path that does not
    exist is returned for the caller to judge."""
    try:
        path = (root / Path(value).expanduser()).resolve()
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return path
    except (OSError, ValueError, RuntimeError) as exc:  # RuntimeError: symlink loop in resolve() (Python < 3.13)
        raise fail(where, f"`{field}` = {short(value)} is not a usable path ({os_reason(exc)})",
                   f"set `{field}` to an existing path (relative to the suite file's directory)") from None
    return path


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"  # how a Git LFS pointer file starts
LFS_FIX = "fetch the files: `git lfs pull` in its repository (in GitHub Actions: `lfs: true` on actions/checkout)"


def lfs_pointers(directory: Path) -> list[str]:
    """The files under `directory` (hidden ones aside) that are Git LFS pointers, not the files they stand for:
    what a clone without its LFS objects holds (`git clone` of a Hub model without git-lfs, a CI checkout)."""
    found, seen = [], set()
    for top, dirs, files in os.walk(directory, followlinks=True):  # a Hub snapshot is links
        real = os.path.realpath(top)
        dirs[:] = [] if real in seen else sorted(d for d in dirs if not d.startswith("."))
        if real in seen:  # a link back up the tree
            continue
        seen.add(real)
        found += [str((Path(top) / name).relative_to(directory)) for name in sorted(files)
                  if is_lfs_pointer(Path(top) / name)]
    return found


def is_lfs_pointer(path: Path) -> bool:
    """Whether a file is a Git LFS pointer (about 130 bytes of text) instead of the file it stands for."""
    try:
        if path.stat().st_size >= 1024:
            return False
        with path.open("rb") as f:
            return f.read(len(LFS_POINTER)) == LFS_POINTER
    except OSError:
        return False


def refuse_lfs_pointers(directory: Path, where: str, field: str) -> None:
    """A model, tokenizer or adapter directory of Git LFS pointers: refused naming them (vLLM's own error, after an
    engine start, would be about a safetensors header)."""
    pointers = lfs_pointers(directory)
    if pointers:
        more = f" and {len(pointers) - 3} more" if len(pointers) > 3 else ""
        raise fail(where, f"`{field}`: {directory} holds Git LFS pointers, not the files they stand for "
                   f"({', '.join(pointers[:3])}{more})", LFS_FIX)


# What vLLM loads a model's weights from (its load_format "auto"), and the indexes of a sharded checkpoint
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.pth")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def refuse_missing_weights(directory: Path, where: str, field: str) -> None:
    """A model directory vLLM would start on only to fail: no weight file, or a shard its index names missing
    (an interrupted copy or download). The kinds that load the weights ask it before vLLM is imported."""
    fix = "copy the model's weight files into it (an interrupted copy or download leaves them out), or `evalgate fetch` again"
    if not any(any(directory.glob(pattern)) for pattern in WEIGHT_FILES):
        raise fail(where, f"`{field}`: {directory} has no weights (no *.safetensors, *.bin or *.pt file)", fix)
    for index in (directory / name for name in WEIGHT_INDEXES):
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8-sig"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # absent or unreadable: vLLM's to judge
            continue
        missing = sorted(str(name) for name in shards if not is_file(directory / str(name)))
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise fail(where, f"`{field}`: {index} names weight files the directory lacks ({', '.join(missing[:3])}{more})", fix)


def model_dir(table: dict, root: Path, where: str, section: str, *, required: bool,
              hub: HubResolver = resolve_hub_repo) -> Path | None:
    """`model`: a local Hugging Face model directory (config.json + weights), or a Hub repo id at `revision`
    (its snapshot as evalgate.lock pins it, or as `hub` resolves it); None when optional and absent."""
    value = typed(table, "model", str, where, section)
    revision = typed(table, "revision", str, where, section)
    if value is None and not required:
        if revision is not None:
            raise fail(where, f"`{section}revision` is set without `{section}model`", f"set `{section}model` to a Hub repo id")
        return None
    if not value:
        raise fail(where, f"`{section}model` is missing",
                   'set it to a local model directory (config.json + weights) or a Hub repo id, e.g. "org/name"')
    path = local_or_hub(value, revision, root, where, f"{section}model", "revision", hub)
    if not is_dir(path) or not is_file(path / "config.json"):
        raise fail(where, f"`{section}model`: {path} is not a model directory (no config.json)",
                   "point it at a local Hugging Face model directory (`evalgate build-model DIR` builds one), or name a "
                   'Hub repo: model = "org/name" with revision = "<commit, tag or branch>", then `evalgate fetch`')
    refuse_lfs_pointers(path, where, f"{section}model")
    return path


def tokenizer_dir(table: dict, root: Path, where: str, section: str, *,
                  hub: HubResolver = resolve_hub_repo) -> Path | None:
    value = typed(table, "tokenizer", str, where, section)
    revision = typed(table, "tokenizer_revision", str, where, section)
    if revision is not None and not value:
        raise fail(where, f"`{section}tokenizer_revision` is set without `{section}tokenizer`",
                   f"set `{section}tokenizer` to a Hub repo id")
    path = local_or_hub(value, revision, root, where, f"{section}tokenizer", "tokenizer_revision", hub) \
        if value else None
    if path is not None and not is_dir(path):
        raise fail(where, f"`{section}tokenizer`: {path} is not a directory", "point it at a tokenizer directory or a Hub repo id")
    if path is not None:
        refuse_lfs_pointers(path, where, f"{section}tokenizer")
    return path


# Where transformers finds a tokenizer's chat template besides `chat_template` in tokenizer_config.json.
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json", "additional_chat_templates")


def chat_template_in(directory: Path | None) -> bool | None:
    """Whether a local tokenizer directory carries a chat template, as its files tell: a template file, or
    `chat_template` in tokenizer_config.json. None where the files cannot tell (no readable tokenizer_config.json,
    or a Mistral tokenizer's tekken.json, which may bring its own): the engine's tokenizer decides."""
    if not isinstance(directory, Path) or not is_dir(directory):
        return None
    if any((directory / name).exists() for name in TEMPLATE_FILES):
        return True
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if config.get("chat_template"):
        return True
    return None if (directory / "tekken.json").exists() else False


def vocabulary_sizes(model: Path, tokenizer: Path) -> tuple[int, int] | None:
    """(the model's vocabulary, as config.json sizes its embeddings; one past the largest token id the tokenizer's
    tokenizer.json can produce), or None where the files do not say."""
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8-sig"))
        data = json.loads((tokenizer / "tokenizer.json").read_text(encoding="utf-8-sig"))
    except (OSError, ValueError):
        return None
    size = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    vocab = (data.get("model") or {}).get("vocab") if isinstance(data, dict) else None
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab))) if isinstance(vocab, list) else []
    ids += [t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)]
    ids = [i for i in ids if isinstance(i, int)]
    return (size, max(ids) + 1) if isinstance(size, int) and ids else None


def local_or_hub(value: str, revision: str | None, root: Path, where: str, field: str, revision_key: str,
                 hub: HubResolver = resolve_hub_repo) -> Path:
    """A local path (relative to the suite), or a Hub repo id at `revision` as `hub` resolves it (the lock's
    snapshot; a download, for `evalgate fetch`)."""
    if is_hub_id(value, root):
        return hub(value, revision, root, where, field)
    if revision is not None:
        raise fail(where, f"`{field}` = {short(value)} is a local path; `{revision_key}` is for a Hub repo id",
                   f"remove `{revision_key}`, or name the model as the Hub does (\"org/name\")")
    return resolve_path(root, value, where, field)


def not_json(value: Any) -> str | None:
    """Why `value` cannot be part of an identity hash (canonical JSON), or None if it can."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"a non-finite number ({value})"
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return f"a TOML date/time ({value.isoformat()})"
    if isinstance(value, (list, tuple)):
        return next((r for r in map(not_json, value) if r), None)
    if isinstance(value, dict):
        return next((r for r in map(not_json, value.values()) if r), None)
    return None


def json_values(table: dict, where: str, section: str) -> dict[str, Any]:
    """A table of pass-through values (engine arguments): each must be hashable as canonical JSON."""
    for key, value in table.items():
        reason = not_json(value)
        if reason:  # the engine identity is hashed as canonical JSON; vLLM takes no such values anyway
            raise fail(where, f"`{section}{key}` holds {reason}", "use a string, a finite number, true/false, a list or a table")
    return dict(table)


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


BOM = "\ufeff"
UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # little- and big-endian: what Windows PowerShell's `>` writes first


def read_capped(path: Path, limit: int, what: str, fix: str) -> bytes:
    """The file's bytes; refused before reading (stat) when larger than `limit`, and never more than
    `limit` bytes read even if the file grows or stat() reports no size (pipes, /proc). One read of the size
    stat() gives, never `read(limit + 1)`: that reserves the whole limit up front (256 MiB for a prompts file of
    a few lines), and fails with MemoryError under an address-space limit (`ulimit -v`, some batch schedulers)."""
    size = path.stat().st_size
    if size > limit:
        raise ConfigError(f"{path}: {what} is {size} bytes ({mib(size)}), over the limit of {limit} bytes "
                          f"({mib(limit)})", fix=fix)
    with path.open("rb") as f:
        want = size + 1
        raw = f.read(want)
        if len(raw) == want:  # more than stat() said (a growing file, a pipe, /proc): read on, to the limit
            grown = bytearray(raw)
            while len(grown) <= limit and (chunk := f.read(min(READ_CHUNK, limit + 1 - len(grown)))):
                grown += chunk
            raw = bytes(grown)
    if len(raw) > limit:
        raise ConfigError(f"{path}: {what} is over the limit of {limit} bytes ({mib(limit)})", fix=fix)
    return raw


def read_text(path: Path, limit: int, what: str, *, too_large: str, missing: str) -> str:
    """A UTF-8 configuration file's text (a suite, a trace, a log), every failure a ConfigError naming it:
    over `limit` bytes (`too_large`: the fix), not found (`missing`: the fix), unreadable, not UTF-8."""
    try:
        raw = read_capped(path, limit, f"the {what}", fix=too_large)
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found", fix=missing) from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what} ({exc.strerror})", fix="check the path and its permissions") from None
    try:
        return without_bom(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise not_utf8(f"{path}: not UTF-8 (byte {exc.start})", raw, what) from None


def not_utf8(message: str, raw: bytes, what: str) -> ConfigError:
    """A file that is not UTF-8, saying so, and that it is UTF-16 where its first bytes say it is."""
    if raw.startswith(UTF16_BOMS):
        return ConfigError(f"{message}: it is UTF-16 (it starts with UTF-16's byte-order mark)",
                           fix=f"save the {what} as UTF-8 (in PowerShell, `Out-File -Encoding utf8` instead of `>`)")
    return ConfigError(message, fix=f"save the {what} as UTF-8")


def without_bom(text: str) -> str:
    """A text without the byte-order mark some Windows editors write first: it marks the encoding, it is not
    content, and the TOML and JSON parsers refuse it."""
    return text.removeprefix(BOM)


def read_toml(path: Path) -> dict:
    """A TOML configuration file (a suite, a candidates file), every failure a ConfigError naming it."""
    text = read_text(path, MAX_SUITE_BYTES, "suite file", missing="pass the path of an existing suite TOML file",
                     too_large="a suite file is configuration only: keep prompts in the [prompts].file JSONL file "
                               "and remove anything else that makes it this large")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}", fix="fix the TOML syntax at the position shown") from None
    except RecursionError:
        raise ConfigError(f"{path}: malformed TOML: arrays or inline tables nested too deeply",
                          fix="flatten the nesting (a suite needs at most a few levels)") from None


def evalgate_tables(path: Path) -> tuple[dict, str]:
    """The evalgate tables of a suite file and the prefix its fields are named with: the whole file, or
    the `[tool.evalgate]` table of a pyproject.toml (prefix `tool.evalgate.`)."""
    data = read_toml(path)
    if path.name != "pyproject.toml":
        return data, ""
    tool = data.get("tool", {})
    data = tool.get("evalgate") if isinstance(tool, dict) else None
    if data is None:
        raise ConfigError(f"{path}: no [tool.evalgate] table", fix="add a [tool.evalgate] table (see docs/suite.md)")
    if not isinstance(data, dict):
        raise fail(str(path), "`tool.evalgate` must be a table", "write it as [tool.evalgate] with tables below it")
    return data, "tool.evalgate."


# --- where the store is ---------------------------------------------------------------------------------

DEFAULT_DATABASE = "sqlite:///baselines/evalgate.sqlite"


def resolve_database_url(url: str, root: Path, where: str = "database") -> str:
    """SQLite paths in a suite file are relative to the suite file's directory."""
    try:
        if url.startswith("sqlite:///") and not url.startswith("sqlite:////") and url != "sqlite:///:memory:":
            return "sqlite:///" + str((root / url[len("sqlite:///"):]).resolve())
        if "://" not in url:  # a bare path
            return "sqlite:///" + str((root / url).resolve())
    except (OSError, ValueError, RuntimeError) as exc:  # NUL byte, symlink loop (Python < 3.13)
        raise ConfigError(f"{where}: {short(url)} is not a usable path ({os_reason(exc)})",
                          fix="give a SQLite file path or a SQLAlchemy URL, e.g. sqlite:///baselines/evalgate.sqlite") from None
    return url
