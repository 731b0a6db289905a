"""Token-level records of one request in one pass, and their compact storage encoding (**contract**).

Encoding (docs/storage.md): output ids are little-endian int32; the sampled token's logprob at each
position is a little-endian IEEE-754 float64 (vLLM's logprobs are float32 widened to Python floats, so
float64 keeps every bit); top-k is k ids (int32) and k logprobs (float64) per position, rank order, padded
with id -1 / -inf. `digest` is SHA-256 over b"ids" + ids + b"lp" + logprobs: equal digests mean equal ids
and equal logprob bits, so comparisons run on digests without unpacking.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field


def pack_ids(ids: list[int]) -> bytes:
    return struct.pack(f"<{len(ids)}i", *ids)


def unpack_ids(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 4}i", blob))


def pack_floats(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}d", *values)


def unpack_floats(blob: bytes) -> list[float]:
    return list(struct.unpack(f"<{len(blob) // 8}d", blob))


def output_digest(ids_blob: bytes, logprobs_blob: bytes) -> str:
    return hashlib.sha256(b"ids" + ids_blob + b"lp" + logprobs_blob).hexdigest()


@dataclass
class Completion:
    """What the engine produced for one request in one pass."""

    key: str
    prompt_ids: list[int]
    output_ids: list[int]
    logprobs: list[float]  # the sampled token's logprob at each position
    top_ids: list[list[int]]  # per position: top-k token ids in rank order
    top_logprobs: list[list[float]]
    token_texts: list[str]  # decoded text of each output token (derived; ids are the truth)
    text: str
    finish_reason: str
    # Where it ran: filled in by the runner.
    pass_index: int = 0
    concurrency: int = 1
    wave: int = 0
    position: int = 0
    # Prompt tokens the engine served from its prefix cache (vLLM's num_cached_tokens); None: not reported.
    # Not part of the digest: it says how the output was computed, not what it is.
    cached_tokens: int | None = None
    _digest: str | None = field(default=None, repr=False)

    @property
    def digest(self) -> str:
        if self._digest is None:
            self._digest = output_digest(pack_ids(self.output_ids), pack_floats(self.logprobs))
        return self._digest

    def margin(self, position: int) -> float | None:
        """Top-1 minus top-2 logprob at a position: small means a near-tie that numerics can flip."""
        if position >= len(self.top_logprobs) or len(self.top_logprobs[position]) < 2:
            return None
        first, second = self.top_logprobs[position][:2]
        if second == float("-inf"):
            return None
        return first - second

    def pack_top(self) -> tuple[int, bytes, bytes]:
        k = max((len(row) for row in self.top_ids), default=0)
        ids: list[int] = []
        lps: list[float] = []
        for row_ids, row_lps in zip(self.top_ids, self.top_logprobs):
            pad = k - len(row_ids)
            ids += list(row_ids) + [-1] * pad
            lps += list(row_lps) + [float("-inf")] * pad
        return k, pack_ids(ids), pack_floats(lps)

    @staticmethod
    def unpack_top(k: int, ids_blob: bytes, lps_blob: bytes) -> tuple[list[list[int]], list[list[float]]]:
        ids, lps = unpack_ids(ids_blob), unpack_floats(lps_blob)
        if k == 0:
            return [], []
        rows_ids = [ids[i : i + k] for i in range(0, len(ids), k)]
        rows_lps = [lps[i : i + k] for i in range(0, len(lps), k)]
        return (
            [[t for t in row if t != -1] for row in rows_ids],
            [[v for t, v in zip(ri, rl) if t != -1] for ri, rl in zip(rows_ids, rows_lps)],
        )


def rank_top(entries, k: int) -> tuple[list[int], list[float]]:
    """The top-k of one position as recorded: (token id, logprob) pairs, each id once, by logprob
    descending and, between exactly equal logprobs, by token id. Engines break such ties in whatever
    order their top-k kernel returns them (two processes on one model were seen to differ), so the
    record never depends on it."""
    best: dict[int, float] = {}
    for token_id, logprob in entries:
        best.setdefault(int(token_id), float(logprob))
    ranked = sorted(best.items(), key=lambda item: (-item[1], item[0]))[:k]
    return [t for t, _ in ranked], [lp for _, lp in ranked]

