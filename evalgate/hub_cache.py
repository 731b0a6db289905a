"""Where huggingface_hub keeps what it downloads, read without importing it: the fingerprint names a
model's Hub origin from its snapshot path, and the lock (configuration/lock.py) finds the snapshots it pins."""

from __future__ import annotations

import os
import re
from pathlib import Path

COMMIT = re.compile(r"^[0-9a-f]{40}$")


def hub_cache() -> Path:
    """The Hugging Face hub cache, as huggingface_hub finds it: $HF_HUB_CACHE, else $HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub (read at each call: tests and CI set it)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def snapshot_dir(repo_type: str, repo: str, commit: str) -> Path:
    """huggingface_hub's cache layout: {cache}/{models|datasets}--{org}--{name}/snapshots/{commit}/."""
    return hub_cache() / f"{repo_type}s--{repo.replace('/', '--')}" / "snapshots" / commit


def hub_origin(path: Path) -> dict | None:
    """{repo, commit} of a snapshot directory of the hub cache (the fingerprint's `info`), else None."""
    snapshots, folder = path.parent, path.parent.parent.name
    if snapshots.name != "snapshots" or not COMMIT.match(path.name) or "--" not in folder:
        return None
    return {"repo": folder.split("--", 1)[1].replace("--", "/", 1), "commit": path.name}
