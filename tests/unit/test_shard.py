"""Shard split: deterministic, complete, disjoint, stable when requests are added, and pinned."""

from __future__ import annotations

import pytest

from evalgate.configuration.shard import Shard, parse_shard, shard_index
from evalgate.errors import ConfigError


def test_shards_partition_the_keys():
    keys = [f"req-{i}" for i in range(1000)]
    shards = [Shard(i, 4) for i in range(1, 5)]
    parts = [{k for k in keys if s.contains(k)} for s in shards]
    assert set().union(*parts) == set(keys)
    assert sum(len(p) for p in parts) == len(keys)  # disjoint
    assert all(200 <= len(p) <= 300 for p in parts)  # roughly balanced


def test_a_key_keeps_its_shard_when_others_are_added():
    before = {k: shard_index(k, 3) for k in ["a", "b", "c"]}
    after = {k: shard_index(k, 3) for k in ["a", "b", "c", "d", "e"]}
    assert all(after[k] == v for k, v in before.items())


def test_split_is_pinned():
    # the contract: sha256(key) first 8 bytes big-endian, mod n, 1-based. Changing it reshuffles every CI matrix.
    assert [shard_index(k, 4) for k in ["p000", "p001", "p002", "p003", "émoji🙂"]] == [2, 1, 3, 2, 2]
    import hashlib

    for key in ["p000", "émoji🙂"]:
        expected = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 7 + 1
        assert shard_index(key, 7) == expected


@pytest.mark.parametrize("text", ["0/2", "3/2", "1", "a/b", "", "1/0", "-1/2"])
def test_bad_shard_specs_are_usage_errors(text):
    with pytest.raises(ConfigError, match="--shard"):
        parse_shard(text)


def test_parse_shard():
    assert parse_shard(" 2 / 4 ") == Shard(2, 4) and str(Shard(2, 4)) == "2/4"
