"""Token-level records of one request in one pass, and their storage encodings (**contract**,
docs/storage.md).

- In memory an output's tokens are numpy arrays, as the engines hand them over (`Completion`): the ids,
  the sampled tokens' logprobs, and the top-k as two (positions, k) arrays in rank order, with each row's
  length where some row is shorter than k. Lists are accepted and converted once.
- `digest`: SHA-256 over b"ids" + ids (int32 LE) + b"lp" + logprobs (float64 LE, the sampled token's
  logprob at each position). Equal digests mean equal ids and equal logprob bits, so comparisons decide on
  digests and decode only outputs whose digests differ. vLLM's logprobs are float32; float64 holds every
  float32 exactly, so float64 keeps every bit of any engine's values.
- `payload`: everything else the store keeps of an output (ids, logprobs, top-k, texts) in one
  content-addressed blob, stored once however many passes and runs produced it. It is lossless: ids
  exact, logprob bits exact (float32 only when every value is exactly a float32). A pass is encoded at
  once (`encode_pass`): its ids and floats are converted in a few array operations for the whole pass, and
  each output's digest is computed on the same buffers.
- Prompt ids (and the outputs of schema revisions before 0009): little-endian int32 / float64 arrays.

numpy is imported by the functions that use it, not by this module: the store imports this module, and
`evalgate --help` and `evalgate runs list` start without numpy (tests/e2e/test_cli_start.py).
"""

from __future__ import annotations

import array
import hashlib
import json
import struct
import sys
from dataclasses import dataclass, field
from functools import cached_property
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

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


def pack_ids(ids) -> bytes:
    return _to_bytes(array.array("i", ids))


def unpack_ids(blob: bytes) -> list[int]:
    return _from_bytes("i", blob).tolist()


def pack_floats(values) -> bytes:
    return _to_bytes(array.array("d", values))


def unpack_floats(blob: bytes) -> list[float]:
    return _from_bytes("d", blob).tolist()


def output_digest(ids_blob: bytes, logprobs_blob: bytes) -> str:
    """The digest of packed ids (int32 LE) and logprobs (float64 LE)."""
    h = hashlib.sha256(b"ids")
    h.update(ids_blob)
    h.update(b"lp")
    h.update(logprobs_blob)
    return h.hexdigest()


# --- arrays as the engines hand them over --------------------------------------------------------------


def as_ids(values) -> np.ndarray:
    """Token ids as a 1-D integer array: an int32, int64 or uint16 array as it is, anything else (a list, a
    tensor, another integer type) as int64."""
    import numpy as np

    ids = np.asarray(values)
    if ids.dtype not in (np.int32, np.int64, np.uint16):
        ids = ids.astype(np.int64)
    return ids.reshape(-1)


def as_floats(values) -> np.ndarray:
    """Logprobs as a 1-D float32 or float64 array (other float types widened to float64, exactly)."""
    import numpy as np

    floats = np.asarray(values)
    if floats.dtype not in (np.float32, np.float64):
        floats = floats.astype(np.float64)
    return floats.reshape(-1)


def top_arrays(ids, logprobs, lengths=None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The top-k as (rows, k) id and logprob arrays and each row's length (None: every row has k). Takes
    arrays, or lists of rows of any lengths (padded here with id 0 and logprob 0.0, as in the payload)."""
    import numpy as np

    if isinstance(ids, np.ndarray) and ids.ndim == 2:
        top_ids, top_lps = ids, as_floats(logprobs).reshape(ids.shape)
        if lengths is not None:  # canonical: as wide as the longest row, zeros past each row's end
            lengths = np.asarray(lengths, dtype=np.int64)
            width = int(lengths.max(initial=0))
            top_ids, top_lps = top_ids[:, :width], top_lps[:, :width]
            padding = np.arange(width) >= lengths[:, None]
            if padding.any():
                top_ids = np.where(padding, 0, top_ids)
                top_lps = np.where(padding, 0.0, top_lps).astype(top_lps.dtype)
        elif not len(top_ids):
            top_ids, top_lps = top_ids[:, :0], top_lps[:, :0]
    else:  # rows: lists or 1-D arrays, possibly of different lengths
        rows_ids, rows_lps = list(ids), list(logprobs)
        lengths = np.array([len(row) for row in rows_ids], dtype=np.int64)
        k = int(lengths.max(initial=0))
        top_ids = np.zeros((len(rows_ids), k), dtype=np.int64)
        top_lps = np.zeros((len(rows_ids), k), dtype=np.float64)
        for i, (row_ids, row_lps) in enumerate(zip(rows_ids, rows_lps)):
            top_ids[i, : len(row_ids)] = row_ids
            top_lps[i, : len(row_lps)] = row_lps
    if lengths is not None and (len(lengths) == 0 or (lengths == top_ids.shape[1]).all()):
        lengths = None
    return top_ids, top_lps, lengths


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


def rank_top_rows(ids, logprobs, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`rank_top` for every position at once: `ids` and `logprobs` are (positions, entries) arrays (vLLM's
    flat logprobs: the sampled token, then its top-k). Returns the (positions, k) top-k arrays and the
    row lengths (None when every row has k distinct ids)."""
    import numpy as np

    ids, logprobs = np.asarray(ids), np.asarray(logprobs)
    rows, width = ids.shape
    # an id seen earlier in its row is a repeat (rank_top keeps an id's first entry): mark it
    by_id = np.lexsort((np.broadcast_to(np.arange(width), ids.shape), ids), axis=1)
    sorted_ids = np.take_along_axis(ids, by_id, axis=1)
    repeat_sorted = np.zeros(ids.shape, dtype=bool)
    repeat_sorted[:, 1:] = sorted_ids[:, 1:] == sorted_ids[:, :-1]
    repeat = np.empty_like(repeat_sorted)
    np.put_along_axis(repeat, by_id, repeat_sorted, axis=1)
    # first entries by logprob descending, then id; repeats last
    order = np.lexsort((ids, -logprobs, repeat), axis=1)[:, :k]
    top_ids, top_lps = np.take_along_axis(ids, order, axis=1), np.take_along_axis(logprobs, order, axis=1)
    lengths = np.minimum((~repeat).sum(axis=1), k)
    return top_arrays(top_ids, top_lps, lengths)


@dataclass(eq=False)
class Completion:
    """What the engine produced for one request in one pass."""

    key: str
    prompt_ids: list[int]
    output_ids: np.ndarray  # (n,) integer
    logprobs: np.ndarray  # (n,) float32 or float64: the sampled token's logprob at each position
    top_ids: np.ndarray  # (rows, k) integer: per position the top-k token ids in rank order (`rank_top`)
    top_logprobs: np.ndarray  # (rows, k) float
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
    # Entries in each top-k row when some row is shorter than k (then padded with id 0, logprob 0.0); None: all k.
    top_lengths: np.ndarray | None = None
    _digest: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.output_ids, self.logprobs = as_ids(self.output_ids), as_floats(self.logprobs)
        self.top_ids, self.top_logprobs, self.top_lengths = top_arrays(self.top_ids, self.top_logprobs, self.top_lengths)

    @property
    def digest(self) -> str:
        if self._digest is None:
            ids = self.output_ids
            if ids.dtype.itemsize > 4 and ids.size and (ids.min() < -(2**31) or ids.max() >= 2**31):
                raise ValueError(f"request {self.key!r}: a token id does not fit in 32 bits")
            self._digest = output_digest(ids.astype("<i4").tobytes(), self.logprobs.astype("<f8").tobytes())
        return self._digest

    def top(self, position: int) -> tuple[list[int], list[float]]:
        """The top-k row of a position: its ids and logprobs, best first (without padding)."""
        n = self.top_ids.shape[1] if self.top_lengths is None else int(self.top_lengths[position])
        return self.top_ids[position, :n].tolist(), self.top_logprobs[position, :n].tolist()

    def top_rows(self) -> tuple[list[list[int]], list[list[float]]]:
        """The top-k as lists of rows (without padding): ids, logprobs."""
        rows = [self.top(i) for i in range(len(self.top_ids))]
        return [ids for ids, _ in rows], [lps for _, lps in rows]

    def margin(self, position: int) -> float | None:
        """Top-1 minus top-2 logprob at a position: small means a near-tie that numerics can flip."""
        if position >= len(self.top_ids):
            return None
        row = self.top(position)[1]
        if len(row) < 2 or row[1] == float("-inf"):
            return None
        return row[0] - row[1]

    # The 0001 encoding of the top-k (columns top_k, top_ids, top_logprobs), read and written by migration 0009.
    def pack_top(self) -> tuple[int, bytes, bytes]:
        rows = list(zip(*self.top_rows()))
        k = max((len(ids) for ids, _ in rows), default=0)
        ids: list[int] = []
        lps: list[float] = []
        for row_ids, row_lps in rows:
            pad = k - len(row_ids)
            ids += row_ids + [-1] * pad
            lps += row_lps + [float("-inf")] * pad
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


# --- payloads ------------------------------------------------------------------------------------------

PAYLOAD_VERSION = 1
# id type, float type, whether top-k rows are ragged, whether `text` is the token texts joined (then not
# stored), ids, logprobs, top-k rows, k
_PAYLOAD_HEADER = struct.Struct("<cc??IIII")
_PAYLOAD_VERSION_BYTE = bytes([PAYLOAD_VERSION])


def encode_payload(c: Completion) -> tuple[str, bytes]:
    """(payload hash, blob) of one completion. The blob: a version byte, a header, the ids then the top-k
    ids (16-bit when every id fits), the logprobs then the top-k logprobs (float32 when every value is
    exactly one), each top-k row's length if they differ, and the JSON of the token texts (with the text,
    when it is not the token texts joined). The hash is SHA-256 of the blob. A pass: `encode_pass`."""
    encoded = encode_pass([c])
    return encoded.payload_hashes[0], encoded.payloads[encoded.payload_hashes[0]]


@dataclass
class EncodedPass:
    """One pass's outputs, encoded (`encode_pass`): per completion its digest and payload hash, the payloads
    of the outputs that are not repeats, and what the next pass is compared with."""

    digests: list[str]
    payload_hashes: list[str]
    payloads: dict[str, bytes]  # payload hash -> blob
    repeats: int  # outputs equal to the same request's output in the previous pass: neither hashed nor encoded
    # request key -> (its latest output's signature, digest, payload hash), in this pass or before: for the next
    seen: dict[str, tuple] = field(repr=False, default_factory=dict)


def signature(c: Completion) -> tuple:
    """Everything an output's payload and digest are made of, as a value: equal signatures, equal payloads."""
    ids, logprobs, top_ids, top_logprobs, lengths = c.output_ids, c.logprobs, c.top_ids, c.top_logprobs, c.top_lengths
    return (ids.dtype, logprobs.dtype, top_ids.dtype, top_logprobs.dtype, top_ids.shape, ids.tobytes(),
            logprobs.tobytes(), top_ids.tobytes(), top_logprobs.tobytes(), None if lengths is None else lengths.tobytes(),
            c.token_texts, c.text)


def encode_pass(completions: list[Completion], previous: EncodedPass | None = None) -> EncodedPass:
    """Encode a pass at once. Its ids (per completion: output ids, then top-k ids) and floats (logprobs,
    then top-k logprobs) are concatenated and converted together: ids to uint16 where all of a completion's
    fit 0..65535, else int32; floats to float32 where all of a completion's are exactly float32 (NaN never),
    else float64. Each digest is computed on the same int32 and float64 buffers.

    With `previous` (the run's previous pass, once stored), an output equal to the same request's latest
    output there (the same `signature`; `seen` carries each request's latest, whichever pass it was in)
    takes its digest and payload hash without being hashed or encoded again: what a passing run mostly
    records."""

    n = len(completions)
    encoded = EncodedPass([""] * n, [""] * n, {}, 0)
    fresh = []
    for i, c in enumerate(completions):
        mine = signature(c)
        before = previous.seen.get(c.key) if previous is not None else None
        if before is not None and before[0] == mine:
            encoded.digests[i], encoded.payload_hashes[i] = before[1], before[2]
            c._digest = before[1]
        else:
            fresh.append(i)
        encoded.seen[c.key] = (mine, i)
    encoded.repeats = n - len(fresh)
    if fresh:
        _encode_fresh([completions[i] for i in fresh], fresh, encoded)
    # a request this pass left out (a rotating or probe pass covers some requests) keeps its earlier output
    encoded.seen = {**(previous.seen if previous is not None else {}),
                    **{key: (mine, encoded.digests[i], encoded.payload_hashes[i]) for key, (mine, i) in encoded.seen.items()}}
    return encoded


def _encode_fresh(completions: list[Completion], places: list[int], encoded: EncodedPass) -> None:
    """Digests, payload hashes and payloads of completions that repeat nothing, into `encoded` at `places`."""
    import numpy as np

    id_parts, float_parts, id_starts, float_starts = [], [], [], []
    id_at = float_at = 0
    for c in completions:
        id_parts += (c.output_ids, c.top_ids.reshape(-1))
        float_parts += (c.logprobs, c.top_logprobs.reshape(-1))
        id_starts.append(id_at)
        float_starts.append(float_at)
        id_at += c.output_ids.size + c.top_ids.size
        float_at += c.logprobs.size + c.top_logprobs.size
    ids = np.concatenate(id_parts).astype(np.int64, copy=False)
    floats = np.concatenate(float_parts).astype(np.float64, copy=False)
    low, high = _segment_reduce(np.minimum, ids, id_starts, 0), _segment_reduce(np.maximum, ids, id_starts, 0)
    if ids.size and (low.min() < -(2**31) or high.max() >= 2**31):
        bad = next(c.key for c, lo, hi in zip(completions, low, high) if lo < -(2**31) or hi >= 2**31)
        raise ValueError(f"request {bad!r}: a token id does not fit in 32 bits")
    small = ((low >= 0) & (high <= 0xFFFF)).tolist()
    with np.errstate(over="ignore", invalid="ignore"):
        singles = floats.astype("<f4")
        exact = singles.astype(np.float64) == floats  # NaN is never equal: it keeps its float64 bits
    single = _segment_reduce(np.logical_and, exact, float_starts, True).tolist()
    int32, double = ids.astype("<i4").tobytes(), floats.astype("<f8").tobytes()
    uint16 = ids.astype("<u2").tobytes() if any(small) else b""
    float32 = singles.tobytes() if any(single) else b""
    id_starts.append(ids.size)
    float_starts.append(floats.size)
    for i, (c, place) in enumerate(zip(completions, places)):
        i_at, i_end, f_at, f_end = id_starts[i], id_starts[i + 1], float_starts[i], float_starts[i + 1]
        n, m = c.output_ids.size, c.logprobs.size
        if c._digest is None:
            c._digest = hashlib.sha256(b"ids" + int32[4 * i_at : 4 * (i_at + n)] + b"lp"
                                       + double[8 * f_at : 8 * (f_at + m)]).hexdigest()
        ragged, joined = c.top_lengths is not None, c.text == "".join(c.token_texts)
        blob = b"".join((
            _PAYLOAD_VERSION_BYTE,
            _PAYLOAD_HEADER.pack(b"H" if small[i] else b"i", b"f" if single[i] else b"d", ragged, joined, n, m,
                                 *c.top_ids.shape),
            uint16[2 * i_at : 2 * i_end] if small[i] else int32[4 * i_at : 4 * i_end],
            float32[4 * f_at : 4 * f_end] if single[i] else double[8 * f_at : 8 * f_end],
            c.top_lengths.astype("<u2").tobytes() if ragged else b"",
            _texts_json(c.token_texts, None if joined else c.text),
        ))
        payload_hash = hashlib.sha256(blob).hexdigest()
        encoded.digests[place], encoded.payload_hashes[place] = c._digest, payload_hash
        encoded.payloads.setdefault(payload_hash, blob)


def _texts_json(token_texts: list[str], text: str | None) -> bytes:
    """`json.dumps(token_texts)`, or of `[text, token_texts]`, byte for byte, at half the cost: the payload's
    JSON is a list of strings, so each is escaped by json's own C escaper and the list is written here."""
    try:
        body = "[" + ", ".join(map(encode_basestring_ascii, token_texts)) + "]"
        if text is not None:
            body = "[" + encode_basestring_ascii(text) + ", " + body + "]"
    except TypeError:  # not all strings: json's general path
        return json.dumps(token_texts if text is None else [text, token_texts]).encode()
    return body.encode()


def _segment_reduce(ufunc, values, starts: list[int], empty):
    """`ufunc` reduced over each segment of `values` (segment i starts at starts[i]); `empty` for empty ones."""
    import numpy as np

    starts_array = np.asarray(starts, dtype=np.int64)
    ends = np.append(starts_array[1:], values.size)
    filled = ends > starts_array
    result = np.full(len(starts), empty, dtype=values.dtype)
    if filled.any():
        result[filled] = ufunc.reduceat(values, starts_array[filled])
    return result


def payload_fields(blob: bytes) -> dict:
    """The Completion fields of an `encode_payload` blob: output_ids, logprobs, top_ids, top_logprobs,
    top_lengths (arrays that view the blob, read-only), token_texts and text."""
    import numpy as np

    if blob[0] != PAYLOAD_VERSION:
        raise ValueError(f"output payload version {blob[0]} is unknown to this evalgate (it knows {PAYLOAD_VERSION})")
    id_code, lp_code, ragged, joined, n_ids, n_lps, rows, k = _PAYLOAD_HEADER.unpack_from(blob, 1)
    id_type, lp_type = ("<u2" if id_code == b"H" else "<i4"), ("<f4" if lp_code == b"f" else "<f8")
    at = 1 + _PAYLOAD_HEADER.size
    ids = np.frombuffer(blob, dtype=id_type, count=n_ids + rows * k, offset=at)
    at += ids.nbytes
    lps = np.frombuffer(blob, dtype=lp_type, count=n_lps + rows * k, offset=at)
    at += lps.nbytes
    lengths = None
    if ragged:
        lengths = np.frombuffer(blob, dtype="<u2", count=rows, offset=at).astype(np.int64)
        at += 2 * rows
    texts = json.loads(blob[at:])
    text, token_texts = ("".join(texts), texts) if joined else texts
    return {"output_ids": ids[:n_ids], "logprobs": lps[:n_lps], "top_ids": ids[n_ids:].reshape(rows, k),
            "top_logprobs": lps[n_lps:].reshape(rows, k), "top_lengths": lengths, "token_texts": token_texts,
            "text": text}


def decode_payload(blob: bytes) -> tuple[list[int], list[float], list[list[int]], list[list[float]], list[str], str]:
    """(output ids, logprobs, top ids, top logprobs, token texts, text) of an `encode_payload` blob, as lists."""
    fields = payload_fields(blob)
    rows, k = fields["top_ids"].shape
    lengths = [k] * rows if fields["top_lengths"] is None else fields["top_lengths"].tolist()
    top_ids = [fields["top_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
    top_lps = [fields["top_logprobs"][i, :n].tolist() for i, n in enumerate(lengths)]
    return (fields["output_ids"].tolist(), fields["logprobs"].tolist(), top_ids, top_lps, fields["token_texts"],
            fields["text"])


class StoredCompletion(Completion):
    """A completion read back from the store. Its place, digest and finish reason are there at once; its
    tokens are fetched (`fetch_payload(payload_hash)` -> the blob) and decoded, as arrays that view the
    blob, the first time anything reads them; its prompt ids come from its `request` row."""

    def __init__(self, key: str, payload_hash: str, fetch_payload, digest: str, finish_reason: str, *,
                 pass_index: int, concurrency: int, wave: int, position: int, cached_tokens: int | None, request):
        self.key, self.finish_reason, self._digest = key, finish_reason, digest
        self.pass_index, self.concurrency, self.wave, self.position = pass_index, concurrency, wave, position
        self.cached_tokens = cached_tokens
        self.payload_hash, self._fetch_payload, self._request = payload_hash, fetch_payload, request

    @cached_property
    def _decoded(self) -> dict:
        return payload_fields(self._fetch_payload(self.payload_hash))

    @cached_property
    def prompt_ids(self) -> list[int]:
        return unpack_ids(self._request.prompt_ids) if self._request is not None else []

    @cached_property
    def output_ids(self) -> np.ndarray:
        return self._decoded["output_ids"]

    @cached_property
    def logprobs(self) -> np.ndarray:
        return self._decoded["logprobs"]

    @cached_property
    def top_ids(self) -> np.ndarray:
        return self._decoded["top_ids"]

    @cached_property
    def top_logprobs(self) -> np.ndarray:
        return self._decoded["top_logprobs"]

    @cached_property
    def top_lengths(self) -> np.ndarray | None:
        return self._decoded["top_lengths"]

    @cached_property
    def token_texts(self) -> list[str]:
        return self._decoded["token_texts"]

    @cached_property
    def text(self) -> str:
        return self._decoded["text"]


class Positions:
    """One output's positions, collected one at a time as an engine hands them over (a server's JSON):
    each token id, its logprob and the top-k row, ranked canonically (`rank_top`), so the record of a
    position never depends on the kind that produced it. `completion` turns them into arrays once."""

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
