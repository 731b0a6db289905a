"""Token-level records of one request in one pass, and their storage encodings (**contract**,
docs/storage.md).

- `digest`: SHA-256 over b"ids" + ids (int32 LE) + b"lp" + logprobs (float64 LE, the sampled token's
  logprob at each position). Equal digests mean equal ids and equal logprob bits, so comparisons decide on
  digests and unpack only outputs whose digests differ. vLLM's logprobs are float32 widened to Python
  floats, so float64 keeps every bit of any engine's values.
- `payload`: everything else the store keeps of an output (ids, logprobs, top-k, texts) in one
  content-addressed blob (`encode_payload`), stored once however many passes and runs produced it. It
  is lossless: ids exact, logprob bits exact (float32 only when every value is exactly a float32).
- Prompt ids (and the outputs of schema revisions before 0009): little-endian int32 / float64 arrays.
"""

from __future__ import annotations

import array
import hashlib
import json
import struct
import sys
from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain

_SWAP = sys.byteorder != "little"  # the encodings are little-endian; array is native


def _to_bytes(a: array.array) -> bytes:
    if _SWAP:
        a = array.array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def _from_bytes(typecode: str, blob: bytes) -> array.array:
    a = array.array(typecode)
    a.frombytes(blob)
    if _SWAP:
        a.byteswap()
    return a


def pack_ids(ids: list[int]) -> bytes:
    return _to_bytes(array.array("i", ids))


def unpack_ids(blob: bytes) -> list[int]:
    return _from_bytes("i", blob).tolist()


def pack_floats(values: list[float]) -> bytes:
    return _to_bytes(array.array("d", values))


def unpack_floats(blob: bytes) -> list[float]:
    return _from_bytes("d", blob).tolist()


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


PAYLOAD_VERSION = 1
# id type, float type, whether top-k rows are ragged, whether `text` is the token texts joined (then not
# stored), ids, logprobs, top-k rows, k
_PAYLOAD_HEADER = struct.Struct("<cc??IIII")


def _payload_body(c: Completion) -> bytes:
    lengths = list(map(len, c.top_ids))
    k = max(lengths, default=0)
    ragged = lengths.count(k) != len(lengths)
    if ragged:  # pad each row to k; the row lengths are recorded
        top_ids = [t for row in c.top_ids for t in (*row, *[0] * (k - len(row)))]
        top_lps = [v for row in c.top_logprobs for v in (*row, *[0.0] * (k - len(row)))]
    else:
        top_ids, top_lps = chain.from_iterable(c.top_ids), chain.from_iterable(c.top_logprobs)
    try:  # 16-bit ids when every id fits (vocabularies up to 65,536 tokens)
        ids = array.array("H", c.output_ids)
        ids.extend(top_ids)
    except OverflowError:
        ids = array.array("i", c.output_ids)
        ids.extend(chain.from_iterable(c.top_ids) if not ragged else top_ids)
    values = [*c.logprobs, *top_lps]
    floats = array.array("f", values)
    # float32 when it holds every value exactly (vLLM's logprobs are float32). Rounding keeps the sign of
    # zero, and a NaN compares unequal (so it keeps its float64 bits): equal values are equal bits.
    if floats.tolist() != values:
        floats = array.array("d", values)
    joined = c.text == "".join(c.token_texts)
    return b"".join((
        _PAYLOAD_HEADER.pack(ids.typecode.encode(), floats.typecode.encode(), ragged, joined, len(c.output_ids),
                             len(c.logprobs), len(lengths), k),
        _to_bytes(ids), _to_bytes(floats), _to_bytes(array.array("H", lengths)) if ragged else b"",
        json.dumps(c.token_texts if joined else [c.text, c.token_texts]).encode(),
    ))


def encode_payload(c: Completion) -> tuple[str, bytes]:
    """(payload hash, blob). The blob: a version byte, a header, the ids then the top-k ids (16-bit when
    every id fits), the logprobs then the top-k logprobs (float32 when every value is exactly one), each
    top-k row's length if they differ, and the JSON of the token texts (with the text, when it is not the
    token texts joined). The hash is SHA-256 of the blob."""
    blob = bytes([PAYLOAD_VERSION]) + _payload_body(c)
    return hashlib.sha256(blob).hexdigest(), blob


def same_payload(a: Completion, b: Completion) -> bool:
    """Whether two completions have the same payload, without encoding either (a pass that repeats an
    earlier one's output). Equal digests give equal ids and logprob bits; list equality settles the rest,
    except that it takes 0.0 for -0.0 (and a NaN for itself only when it is the same object, which has
    the same bits): a top-k with a zero logprob is left to the encoding."""
    return (a.digest == b.digest and a.top_ids == b.top_ids and a.top_logprobs == b.top_logprobs
            and a.token_texts == b.token_texts and a.text == b.text
            and not any(0.0 in row for row in a.top_logprobs))


def decode_payload(blob: bytes) -> tuple[list[int], list[float], list[list[int]], list[list[float]], list[str], str]:
    """(output ids, logprobs, top ids, top logprobs, token texts, text) of an `encode_payload` blob."""
    if blob[0] != PAYLOAD_VERSION:
        raise ValueError(f"output payload version {blob[0]} is unknown to this evalgate (it knows {PAYLOAD_VERSION})")
    id_code, lp_code, ragged, joined, n_ids, n_lps, rows, k = _PAYLOAD_HEADER.unpack_from(blob, 1)
    id_code, lp_code = id_code.decode(), lp_code.decode()
    at = 1 + _PAYLOAD_HEADER.size

    def take(typecode: str, count: int) -> list:
        nonlocal at
        end = at + count * array.array(typecode).itemsize
        values = _from_bytes(typecode, blob[at:end]).tolist()
        at = end
        return values

    ids, lps = take(id_code, n_ids + rows * k), take(lp_code, n_lps + rows * k)
    lengths = take("H", rows) if ragged else [k] * rows
    texts = json.loads(blob[at:])
    text, token_texts = ("".join(texts), texts) if joined else texts
    top_ids = [ids[n_ids + i * k : n_ids + i * k + n] for i, n in enumerate(lengths)]
    top_lps = [lps[n_lps + i * k : n_lps + i * k + n] for i, n in enumerate(lengths)]
    return ids[:n_ids], lps[:n_lps], top_ids, top_lps, token_texts, text


class StoredCompletion(Completion):
    """A completion read back from the store. Its place, digest and finish reason are there at once; its
    tokens are fetched (`fetch_payload(payload_hash)` -> the blob) and decoded the first time anything reads
    them, so comparing two runs whose digests agree never reads or unpacks a token."""

    def __init__(self, key: str, payload_hash: str, fetch_payload, digest: str, finish_reason: str, *,
                 pass_index: int, concurrency: int, wave: int, position: int, cached_tokens: int | None,
                 prompt_ids_blob: bytes):
        self.key, self.finish_reason, self._digest = key, finish_reason, digest
        self.pass_index, self.concurrency, self.wave, self.position = pass_index, concurrency, wave, position
        self.cached_tokens = cached_tokens
        self.payload_hash, self._fetch_payload, self._prompt_ids_blob = payload_hash, fetch_payload, prompt_ids_blob

    @cached_property
    def _decoded(self):
        return decode_payload(self._fetch_payload(self.payload_hash))

    @cached_property
    def prompt_ids(self) -> list[int]:
        return unpack_ids(self._prompt_ids_blob)

    @cached_property
    def output_ids(self) -> list[int]:
        return self._decoded[0]

    @cached_property
    def logprobs(self) -> list[float]:
        return self._decoded[1]

    @cached_property
    def top_ids(self) -> list[list[int]]:
        return self._decoded[2]

    @cached_property
    def top_logprobs(self) -> list[list[float]]:
        return self._decoded[3]

    @cached_property
    def token_texts(self) -> list[str]:
        return self._decoded[4]

    @cached_property
    def text(self) -> str:
        return self._decoded[5]


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



class Positions:
    """One output's positions, collected as an engine hands them over (vLLM's objects, a server's JSON):
    each token id, its logprob and the top-k row, ranked canonically (`rank_top`). Every engine kind records
    through it, so the record of a position never depends on the kind that produced it."""

    def __init__(self, k: int):
        self.k = k
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.top_ids: list[list[int]] = []
        self.top_logprobs: list[list[float]] = []

    def add(self, token_id: int, logprob: float, top) -> None:
        """`top`: (token id, logprob) pairs of the position's top-k, in any order."""
        self.ids.append(int(token_id))
        self.logprobs.append(float(logprob))
        row_ids, row_logprobs = rank_top(top, self.k)
        self.top_ids.append(row_ids)
        self.top_logprobs.append(row_logprobs)

    def completion(self, key: str, prompt_ids: list[int], **fields) -> Completion:
        """The Completion of these positions; `fields`: text, token_texts, finish_reason, cached_tokens."""
        fields.setdefault("token_texts", [])
        return Completion(key=key, prompt_ids=prompt_ids, output_ids=self.ids, logprobs=self.logprobs,
                          top_ids=self.top_ids, top_logprobs=self.top_logprobs, **fields)
