"""`evalgate fetch`: bring what a suite names from the Hugging Face Hub into the local cache, and pin it.

For each Hub repo the suite names (`[engine] model`/`tokenizer` at `revision`/`tokenizer_revision`, an
`[adapters]` entry) and each dataset of its lm-eval built-in tasks, download the snapshot at the revision asked
for (huggingface_hub: its cache, `HF_HOME`, `HF_ENDPOINT`, `HF_TOKEN` for gated repos), take the commit it
resolved to, hash every file, and write evalgate.lock beside the suite (configuration/lock.py). The suite is
read by `load_suite` itself, with a Hub resolver that downloads, so fetch checks the whole suite as every other
command will read it. Every other command runs offline from the
cache and the lock, so a branch that moves on the Hub changes nothing until the next fetch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .configuration.lock import Lock, Pin, lock_path, read_lock, write_lock
from .configuration.suite import load_suite
from .errors import ConfigError, EngineError, MissingDependency
from .fingerprint import hash_files
from .hub_cache import hub_cache

TOKEN_FIX = ("set HF_TOKEN to a Hugging Face token that has access (accept the model's terms on its Hub page first); "
             "in CI, from a secret")


@dataclass(frozen=True)
class Fetched:
    """What a fetch did: the lock written (kept, with --locked), each pin under the role the suite gave it, and
    a line per pin that moved from the previous lock ("repo (type, revision): old -> new")."""

    path: Path
    lock: Lock
    roles: tuple[tuple[str, Pin], ...]  # ("engine.tokenizer", pin), ("adapters.a", pin), ("lm_eval task 'sciq': dataset", pin)
    moved: tuple[str, ...] = ()


def fetch(suite_path: Path, *, progress: bool = True, locked: bool = False) -> Fetched:
    """Fetch everything the suite names and write its lock. `locked` (CI): download exactly the commits the lock
    pins, resolve no branch, and leave the lock as it is; the lock must cover the suite."""
    suite_path = Path(suite_path).resolve()
    root = suite_path.parent
    before = read_lock(root)
    commit_of = _locked_commits(before, suite_path) if locked else lambda repo_type, repo, revision, task=None: revision
    roles: list[tuple[str, Pin]] = []

    def download(repo: str, revision: str | None, _root: Path, _where: str, field: str) -> Path:
        """The Hub resolver of `load_suite`: each repo the suite names, downloaded and pinned under its role."""
        revision = revision or "main"
        pin = _download("model", repo, revision, field, progress=progress, at=commit_of("model", repo, revision))
        roles.append((field, pin))
        return pin.snapshot

    suite = load_suite(suite_path, hub=download)
    roles += _task_datasets(suite, progress=progress, commit_of=commit_of)
    pins = [pin for _, pin in roles]
    lock = Lock(tuple(pins))
    if locked:
        changed = [p.repo for p in pins if before.find(p.repo_type, p.repo, p.revision, p.task).files != p.files]
        if changed:
            raise ConfigError(f"{lock_path(root)}: the Hub's files of {', '.join(changed)} differ from the lock at the "
                              "same commit", fix="run `evalgate fetch` without --locked and review the change")
        return Fetched(lock_path(root), before, tuple(roles))
    moved = tuple(f"{p.repo} ({p.repo_type}, {p.revision}): {old.commit} -> {p.commit}" for p in pins
                  if (old := before.find(p.repo_type, p.repo, p.revision, p.task)) and old.commit != p.commit)
    return Fetched(write_lock(root, lock), lock, tuple(roles), moved)


def download_model(repo: str, revision: str, field: str, *, progress: bool = False) -> Pin:
    """One Hub model at a revision, into the cache: its pin (the commit it resolved to, its files' hashes)."""
    return _download("model", repo, revision, field, progress=progress)


def _locked_commits(lock: Lock, suite_path: Path):
    """For --locked: the commit the lock pins for each (repo, revision) the suite names; a suite the lock does
    not cover is a ConfigError (the lock is stale: fetch again and commit it)."""
    def commit_of(repo_type: str, repo: str, revision: str, task: str | None = None) -> str:
        pin = lock.find(repo_type, repo, revision, task)
        if pin is None:
            raise ConfigError(f"{lock_path(suite_path.parent)}: the lock does not pin {repo_type} {repo!r} at revision "
                              f"{revision!r}, which {suite_path.name} names",
                              fix="run `evalgate fetch` (without --locked) and commit evalgate.lock")
        return pin.commit

    return commit_of


def _download(repo_type: str, repo: str, revision: str, field: str, *, progress: bool, at: str | None = None) -> Pin:
    hf = _import_hub()
    from huggingface_hub import errors

    if not progress:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    named = f"{field} = {repo!r} (revision {revision!r})"
    try:
        snapshot = Path(hf.snapshot_download(repo, repo_type=repo_type, revision=at or revision, cache_dir=hub_cache()))
    except errors.GatedRepoError:
        why = "HF_TOKEN is set but has no access" if os.environ.get("HF_TOKEN") else "a gated repo, and HF_TOKEN is not set"
        raise ConfigError(f"{named}: the Hub refused access ({why})", fix=TOKEN_FIX) from None
    except errors.RevisionNotFoundError:
        raise ConfigError(f"{named}: the Hub has no such revision",
                          fix="set the revision to a branch, tag or commit sha of the repo") from None
    except errors.RepositoryNotFoundError:
        raise ConfigError(f"{named}: the Hub has no such {repo_type} repo (or it is private)",
                          fix=f"check the repo id; for a private repo, {TOKEN_FIX}") from None
    except errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            raise ConfigError(f"{named}: the Hub refused access (HTTP {status})", fix=TOKEN_FIX) from None
        raise EngineError(f"{named}: the Hub at {endpoint} failed: {exc}", fix="retry; check HF_ENDPOINT and the network") from None
    except (errors.LocalEntryNotFoundError, OSError) as exc:
        offline = " (HF_HUB_OFFLINE is set)" if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") else ""
        raise EngineError(f"{named}: could not download from {endpoint}{offline}: {type(exc).__name__}: {exc}",
                          fix="`evalgate fetch` needs the Hub: unset HF_HUB_OFFLINE, check HF_ENDPOINT and the network") from None
    files = {str(p.relative_to(snapshot)): p for p in sorted(snapshot.rglob("*")) if p.is_file()}
    return Pin(repo_type=repo_type, repo=repo, revision=revision, commit=snapshot.name, files=hash_files(files))


def _task_datasets(suite, *, progress: bool, commit_of) -> list[tuple[str, Pin]]:
    """The Hub datasets of the suite's lm-eval built-in tasks (a group or tag: of each of its tasks), one pin
    per task under its role (tasks that share a dataset and revision share the download)."""
    if suite.lm_eval is None:
        return []
    from .lmeval.tasks import hub_datasets

    roles, fetched = [], {}
    for task, (repo, config_name, revision) in hub_datasets(suite.lm_eval, suite.path).items():
        key, role = (repo, revision or "main"), f"lm_eval task {task!r}: dataset"
        if key not in fetched:
            fetched[key] = _download("dataset", repo, key[1], role, progress=progress,
                                     at=commit_of("dataset", repo, key[1], task))
        roles.append((role, Pin(**{**fetched[key].__dict__, "task": task, "config_name": config_name})))
    return roles


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise MissingDependency("huggingface_hub (pip install huggingface_hub; transformers brings it)") from None
    return huggingface_hub
