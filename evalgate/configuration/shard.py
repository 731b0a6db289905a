"""Sharding a suite across CI jobs: `--shard i/n` runs the requests whose key hashes into shard i.

The split depends on the request key only (SHA-256 of its UTF-8 bytes, first 8 bytes as an integer,
modulo n), so a request stays in its shard when others are added or removed, and every job of a matrix
computes the same split without talking to the others. The n shard runs of one CI run share a group
label; `--merge --group G` turns them into one run judged as a whole (evalgate/gate.py).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class Shard:
    index: int  # 1-based
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def contains(self, key: str) -> bool:
        return shard_index(key, self.count) == self.index


def shard_index(key: str, count: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % count + 1


def parse_shard(text: str) -> Shard:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ConfigError(f"--shard {text!r}: expected I/N with 1 <= I <= N", fix="e.g. --shard 2/4")
    return Shard(int(match.group(1)), int(match.group(2)))


def select_shard(suite, shard: Shard):
    """The suite with only this shard's requests (lm-eval requests included, so it runs after they are built)."""
    from dataclasses import replace

    prompts = [p for p in suite.prompts if shard.contains(p.key)]
    if not prompts:
        raise ConfigError(f"shard {shard} of suite {suite.name!r} has no requests", fix="use fewer shards than requests")
    return replace(suite, prompts=prompts)


def select_keys(suite, keys):
    """The suite with only the requests named by `keys`, in suite order (bisect trials). Every key must exist."""
    from dataclasses import replace

    wanted = set(keys)
    missing = wanted - {p.key for p in suite.prompts}
    if missing:
        raise ConfigError(f"suite {suite.name!r} has no request(s) {', '.join(sorted(missing)[:5])}",
                          fix="pick request keys from `evalgate runs show RUN`")
    return replace(suite, prompts=[p for p in suite.prompts if p.key in wanted])
