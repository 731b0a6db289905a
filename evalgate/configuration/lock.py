"""Models and data named as the Hub names them, pinned by a lock file: `evalgate.lock` beside the suite.

A suite may name its model (and tokenizer) as a Hub repo id at a revision, `model = "org/name"` with
`revision = "<commit, tag or branch>"`, and its lm-eval tasks may be lm-eval's built-in ones, whose data is a
Hub dataset. `evalgate fetch` (evalgate/fetch.py) resolves each revision to its commit, downloads the snapshot
into the Hugging Face cache and writes the lock: repo ids, requested revisions, resolved commits and the sha256
of every file. Every other command reads the lock and the cache only, never the network: a branch that moves
on the Hub changes nothing until `evalgate fetch` runs again, and then the change is the commit in the lock.

The lock is TOML, written by evalgate and meant to be committed, like a `uv.lock`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..atomic import write_text_atomic
from ..errors import ConfigError
from ..fingerprint import hash_files
from ..hub_cache import hub_cache, snapshot_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

LOCK_FILE = "evalgate.lock"
LOCK_VERSION = 1
FETCH_FIX = "run `evalgate fetch` (it downloads what the suite names and writes evalgate.lock beside the suite; commit it)"

# A Hub repo id: one slash between an owner and a name (https://huggingface.co/docs/hub/repositories).
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Pin:
    """One Hub repo at one commit, as fetched: `revision` is what the suite asked for (a branch, a tag or a
    commit), `commit` what it resolved to, `files` the sha256 of each file of the snapshot."""

    repo_type: str  # "model" or "dataset"
    repo: str
    revision: str
    commit: str
    files: dict[str, str] = field(default_factory=dict)
    task: str | None = None  # a dataset's lm-eval task
    config_name: str | None = None  # a dataset's configuration (lm-eval's `dataset_name`)

    @property
    def snapshot(self) -> Path:
        return snapshot_dir(self.repo_type, self.repo, self.commit)

    def to_dict(self) -> dict:
        out = {"type": self.repo_type, "repo": self.repo, "revision": self.revision, "commit": self.commit}
        out.update({k: v for k, v in (("task", self.task), ("config_name", self.config_name)) if v is not None})
        out["files"] = dict(sorted(self.files.items()))
        return out


@dataclass(frozen=True)
class Lock:
    pins: tuple[Pin, ...] = ()

    def find(self, repo_type: str, repo: str, revision: str, task: str | None = None) -> Pin | None:
        return next((p for p in self.pins if (p.repo_type, p.repo, p.revision) == (repo_type, repo, revision)
                     and (task is None or p.task == task)), None)

    def dataset_for(self, task: str) -> Pin | None:
        return next((p for p in self.pins if p.repo_type == "dataset" and p.task == task), None)


def is_hub_id(value: str, root: Path) -> bool:
    """Whether a `model`/`tokenizer` value names a Hub repo: shaped `org/name`, and no such local path exists
    (a local directory keeps working unchanged, whatever its name)."""
    return bool(HUB_ID.match(value)) and not (root / value).exists()


def lock_path(root: Path) -> Path:
    return root / LOCK_FILE


def read_lock(root: Path) -> Lock:
    """The lock beside the suite (`root`: the suite file's directory); an empty Lock when there is none."""
    path = lock_path(root)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return Lock()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable lock file ({exc})", fix=FETCH_FIX.replace("writes", "rewrites")) from None
    if data.get("version") != LOCK_VERSION:
        raise ConfigError(f"{path}: lock version {data.get('version')!r}, this evalgate reads version {LOCK_VERSION}",
                          fix="run `evalgate fetch` to rewrite it")
    try:
        pins = tuple(Pin(repo_type=p["type"], repo=p["repo"], revision=p["revision"], commit=p["commit"],
                         files=dict(p.get("files") or {}), task=p.get("task"), config_name=p.get("config_name"))
                     for p in data.get("repo", []))
    except (KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: a [[repo]] entry lacks {exc}", fix="run `evalgate fetch` to rewrite it") from None
    return Lock(pins)


def write_lock(root: Path, lock: Lock) -> Path:
    """Write the lock atomically (a half-written lock is never left): a header, then one [[repo]] per pin."""
    import tomlkit

    document = tomlkit.document()
    document.add(tomlkit.comment("evalgate.lock: written by `evalgate fetch`; commit it. Every evalgate command"))
    document.add(tomlkit.comment("reads the models and data it pins from the Hugging Face cache, offline."))
    document.add("version", LOCK_VERSION)
    repos = tomlkit.aot()
    for pin in sorted(lock.pins, key=lambda p: (p.repo_type != "model", p.repo, p.task or "", p.revision)):
        repos.append(tomlkit.item(pin.to_dict()))
    document.add("repo", repos)
    path = lock_path(root)
    write_text_atomic(path, tomlkit.dumps(document))
    return path


def locked_snapshot(pin: Pin, where: str, field_name: str, *, verify: bool = True) -> Path:
    """The pinned snapshot in the cache, every locked file present (and, with `verify`, of the locked content)."""
    snapshot = pin.snapshot
    missing = [name for name in pin.files if not (snapshot / name).is_file()]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ConfigError(f"{where}: `{field_name}` = {pin.repo!r} at commit {pin.commit[:12]} (evalgate.lock): the "
                          f"Hugging Face cache ({hub_cache()}) lacks {shown}",
                          fix="run `evalgate fetch` to download it again (or point HF_HOME at the cache that has it)")
    if verify:
        hashes = hash_files({name: snapshot / name for name in pin.files})
        changed = sorted(name for name, sha in pin.files.items() if hashes[name] != sha)
        if changed:
            raise ConfigError(f"{where}: `{field_name}` = {pin.repo!r} at commit {pin.commit[:12]}: the cached "
                              f"{', '.join(changed[:3])} differ from evalgate.lock",
                              fix="run `evalgate fetch` to download them again (the cache was edited or is corrupt)")
    return snapshot


def resolve_hub_repo(value: str, revision: str | None, root: Path, where: str, field_name: str) -> Path:
    """The local snapshot of the model repo `value` at `revision` (default "main"), as evalgate.lock pins it."""
    revision = revision or "main"
    lock = read_lock(root)
    pin = lock.find("model", value, revision)
    if pin is None:
        other = next((p for p in lock.pins if p.repo_type == "model" and p.repo == value), None)
        why = (f"evalgate.lock pins it at revision {other.revision!r}, not {revision!r}" if other else
               f"{LOCK_FILE} beside the suite does not pin it" if lock.pins else f"there is no {LOCK_FILE} beside the suite")
        raise ConfigError(f"{where}: `{field_name}` = {value!r} (revision {revision!r}) names a Hugging Face Hub repo, "
                          f"and {why}", fix=FETCH_FIX)
    return locked_snapshot(pin, where, field_name)


# How the suite reader turns a Hub repo id into a local directory: (repo id, revision as written or None, the
# suite's directory, the file, the field) -> the directory. Every command reads the lock's snapshot offline
# (`resolve_hub_repo`); `evalgate fetch` passes one that downloads, so the suite file has one reader.
HubResolver = Callable[[str, "str | None", Path, str, str], Path]
