"""The payload: everything the store keeps of an output (ids, logprobs, top-k, texts) in one
content-addressed blob (docs/storage.md, versions 1 and 2): a pass encoded at once (`encode_pass`) and a
blob of any version read on demand (`PayloadView`)."""

from __future__ import annotations

import array
import hashlib
import json
import struct
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Mapping

from .packing import to_le_bytes

if TYPE_CHECKING:
    import numpy as np

    from .completion import Completion


PAYLOAD_VERSION = 2  # what this evalgate writes; it reads every version (docs/storage.md)
# version 2: id type, float type, flags, bytes per token text length, then the counts: output ids, logprobs,
# top-k rows, k, token texts
_PAYLOAD_HEADER = struct.Struct("<ccBBIIIII")
_RAGGED, _JOINED = 1, 2  # flags: top-k rows of different lengths; `text` is the token texts joined (not stored)
_PAYLOAD_PREFIX = bytes([PAYLOAD_VERSION])
# version 1 (evalgate before 2026-12): the same arrays, texts as JSON; read, never written
_V1_HEADER = struct.Struct("<cc??IIII")
_LENGTH_TYPES = {1: "B", 2: "H", 4: "I"}  # bytes per token text length -> array typecode


def encode_payload(c: Completion) -> tuple[str, bytes]:
    """(payload hash, blob) of one completion (docs/storage.md, version 2): a version byte, a header, the ids
    then the top-k ids (16-bit when every id fits), the logprobs then the top-k logprobs (float32 when every
    value is exactly one), each top-k row's length if they differ, each token text's UTF-8 length, the token
    texts, and the text when it is not the token texts joined. The hash is SHA-256 of the blob. A pass:
    `encode_pass`."""
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
    # request key -> this chunk's output's signature, digest and payload hash (32 bytes each, one bytes object: a
    # leaderboard-sized run keeps one per request): the run's writer adds them to what it has seen, once stored
    seen: dict[str, bytes] = field(repr=False, default_factory=dict)


def signature(c: Completion) -> bytes:
    """A digest of everything an output's payload and digest are made of: equal signatures, equal payloads.
    A digest (32 bytes), not the arrays themselves: a run keeps one per request until it ends (`seen`)."""
    ids, logprobs, top_ids, top_logprobs, lengths = c.output_ids, c.logprobs, c.top_ids, c.top_logprobs, c.top_lengths
    h = hashlib.blake2b(digest_size=32)
    h.update(repr((str(ids.dtype), str(logprobs.dtype), str(top_ids.dtype), str(top_logprobs.dtype), top_ids.shape,
                   ids.size, logprobs.size, top_ids.size, top_logprobs.size, None if lengths is None else lengths.size,
                   [len(t) for t in c.token_texts], len(c.text))).encode())
    for part in (ids, logprobs, top_ids, top_logprobs, lengths):
        if part is not None:
            h.update(part.tobytes())
    h.update("\0".join(c.token_texts).encode("utf-8", "surrogatepass"))
    h.update(c.text.encode("utf-8", "surrogatepass"))
    return h.digest()


def encode_pass(completions: list[Completion], seen: Mapping[str, bytes] | None = None) -> EncodedPass:
    """Encode a pass at once. Its ids (per completion: output ids, then top-k ids) and floats (logprobs,
    then top-k logprobs) are concatenated and converted together: ids to uint16 where all of a completion's
    fit 0..65535, else int32; floats to float32 where all of a completion's are exactly float32 (an engine's
    float32 arrays are, without a look), else float64. Each digest is computed on the int32 ids and float64
    logprobs of the sampled tokens.

    With `seen` (each request's latest stored output in the run, whichever pass it was in: the `seen` of every
    earlier chunk, the later over the earlier), an output equal to it (the same `signature`) takes its digest
    and payload hash without being hashed or encoded again: what a passing run mostly records. `seen` is
    only read: the caller adds this chunk's once it is stored, in place (a copy per chunk would make a
    leaderboard-sized run quadratic)."""

    n = len(completions)
    encoded = EncodedPass([""] * n, [""] * n, {}, 0)
    fresh = []
    for i, c in enumerate(completions):
        mine = signature(c)
        before = seen.get(c.key) if seen is not None else None
        if before is not None and before[:32] == mine:
            encoded.digests[i], encoded.payload_hashes[i] = before[32:64].hex(), before[64:].hex()
            c._digest = encoded.digests[i]
        else:
            fresh.append(i)
        encoded.seen[c.key] = (mine, i)
    encoded.repeats = n - len(fresh)
    if fresh:
        _encode_fresh([completions[i] for i in fresh], fresh, encoded)
    encoded.seen = {key: mine + bytes.fromhex(encoded.digests[i]) + bytes.fromhex(encoded.payload_hashes[i])
                    for key, (mine, i) in encoded.seen.items()}
    return encoded


def _encode_fresh(completions: list[Completion], places: list[int], encoded: EncodedPass) -> None:
    """Digests, payload hashes and payloads of completions that repeat nothing, into `encoded` at `places`."""
    import numpy as np

    ids, id_starts = _concatenated([(c.output_ids, c.top_ids.reshape(-1)) for c in completions])
    floats, float_starts = _concatenated([(c.logprobs, c.top_logprobs.reshape(-1)) for c in completions])
    if ids.dtype.itemsize > 2 or ids.dtype.kind != "u":
        low, high = _segment_reduce(np.minimum, ids, id_starts, 0), _segment_reduce(np.maximum, ids, id_starts, 0)
        if ids.size and (low.min() < -(2**31) or high.max() >= 2**31):
            bad = next(c.key for c, lo, hi in zip(completions, low, high) if lo < -(2**31) or hi >= 2**31)
            raise ValueError(f"request {bad!r}: a token id does not fit in 32 bits")
        small = ((low >= 0) & (high <= 0xFFFF)).tolist()
    else:
        small = [True] * len(completions)
    if floats.dtype == np.float32:  # every value is a float32 already
        single = [True] * len(completions)
        float32, double = memoryview(floats.astype("<f4", copy=False)).cast("B"), memoryview(b"")
    else:
        floats = floats.astype(np.float64, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            singles = floats.astype("<f4")
            exact = singles.astype(np.float64) == floats  # NaN is never equal: it keeps its float64 bits
        single = _segment_reduce(np.logical_and, exact, float_starts, True).tolist()
        float32, double = memoryview(singles).cast("B"), memoryview(floats.astype("<f8", copy=False)).cast("B")
    uint16 = memoryview(ids.astype("<u2", copy=False)).cast("B") if any(small) else memoryview(b"")
    int32 = memoryview(ids.astype("<i4", copy=False)).cast("B") if not all(small) else memoryview(b"")
    # the digest's buffers: the sampled tokens' ids as int32 and logprobs as float64 (not the top-k's)
    digest_ids, digest_id_starts = _concatenated([(c.output_ids,) for c in completions])
    digest_lps, digest_lp_starts = _concatenated([(c.logprobs,) for c in completions])
    digest_ids = memoryview(digest_ids.astype("<i4", copy=False)).cast("B")
    digest_lps = memoryview(digest_lps.astype("<f8", copy=False)).cast("B")
    for i, (c, place) in enumerate(zip(completions, places)):
        i_at, i_end, f_at, f_end = id_starts[i], id_starts[i + 1], float_starts[i], float_starts[i + 1]
        n, m = c.output_ids.size, c.logprobs.size
        if c._digest is None:
            c._digest = hashlib.sha256(b"".join((
                b"ids", digest_ids[4 * digest_id_starts[i] : 4 * digest_id_starts[i + 1]],
                b"lp", digest_lps[8 * digest_lp_starts[i] : 8 * digest_lp_starts[i + 1]]))).hexdigest()
        flags, texts_bytes, lengths_bytes, width, text_bytes = _texts(c)
        if c.top_lengths is not None:
            flags |= _RAGGED
        blob = b"".join((
            _PAYLOAD_PREFIX,
            _PAYLOAD_HEADER.pack(b"H" if small[i] else b"i", b"f" if single[i] else b"d", flags, width, n, m,
                                 *c.top_ids.shape, len(c.token_texts)),
            uint16[2 * i_at : 2 * i_end] if small[i] else int32[4 * i_at : 4 * i_end],
            float32[4 * f_at : 4 * f_end] if single[i] else double[8 * f_at : 8 * f_end],
            c.top_lengths.astype("<u2").tobytes() if c.top_lengths is not None else b"",
            lengths_bytes, texts_bytes, text_bytes,
        ))
        payload_hash = hashlib.sha256(blob).hexdigest()
        encoded.digests[place], encoded.payload_hashes[place] = c._digest, payload_hash
        encoded.payloads.setdefault(payload_hash, blob)


def _concatenated(groups: list[tuple]) -> tuple[np.ndarray, list[int]]:
    """Each group's arrays, all joined (numpy's common type), and where each group starts (then the end)."""
    import numpy as np

    starts, at = [0], 0
    for group in groups:
        for part in group:
            at += part.size
        starts.append(at)
    return np.concatenate([part for group in groups for part in group]), starts


def _texts(c: Completion) -> tuple[int, bytes, bytes, int, bytes]:
    """An output's texts as version 2 stores them: (flags, the token texts' UTF-8, their byte lengths, bytes
    per length, the text's UTF-8 unless it is the token texts joined). Lone surrogates (a server's JSON may
    hold them) are kept as they are (`surrogatepass`)."""
    texts = c.token_texts
    joined = "".join(texts)
    texts_bytes = joined.encode("utf-8", "surrogatepass")
    lengths = list(map(len, texts)) if len(texts_bytes) == len(joined) else [
        len(t.encode("utf-8", "surrogatepass")) for t in texts]
    try:
        lengths_bytes, width = bytes(lengths), 1
    except ValueError:  # a token text of 256 bytes or more
        width = 2 if max(lengths) <= 0xFFFF else 4
        lengths_bytes = to_le_bytes(array.array(_LENGTH_TYPES[width], lengths))
    if c.text == joined:
        return _JOINED, texts_bytes, lengths_bytes, width, b""
    return 0, texts_bytes, lengths_bytes, width, c.text.encode("utf-8", "surrogatepass")


def _segment_reduce(ufunc, values, starts: list[int], empty):
    """`ufunc` reduced over each segment of `values` (segment i from starts[i] to starts[i + 1]); `empty`
    for empty ones."""
    import numpy as np

    starts_array = np.asarray(starts[:-1], dtype=np.int64)
    ends = np.asarray(starts[1:], dtype=np.int64)
    filled = ends > starts_array
    result = np.full(len(starts_array), empty, dtype=values.dtype)
    if filled.any():
        result[filled] = ufunc.reduceat(values, starts_array[filled])
    return result


class PayloadView:
    """A payload blob of any version, its header read: each array is made (a view of the blob, read-only, no
    copy) when asked for, a single value is read in place (`id_at`, `logprob_at`, `margin`, `token_text`:
    what a divergence shows), and the texts are decoded when first read."""

    def __init__(self, blob: bytes):
        version = blob[0]
        if version == 2:
            id_code, lp_code, flags, width, n_ids, n_lps, rows, k, count = _PAYLOAD_HEADER.unpack_from(blob, 1)
            at, ragged, joined = 1 + _PAYLOAD_HEADER.size, bool(flags & _RAGGED), bool(flags & _JOINED)
            if width not in _LENGTH_TYPES:
                raise ValueError(f"output payload: token text length width {width} is not 1, 2 or 4")
        elif version == 1:
            id_code, lp_code, ragged, joined, n_ids, n_lps, rows, k = _V1_HEADER.unpack_from(blob, 1)
            at, count, width = 1 + _V1_HEADER.size, -1, 0
        else:
            raise ValueError(f"output payload version {version} is unknown to this evalgate (it knows 1 and 2)")
        small, single = id_code == b"H", lp_code == b"f"
        self.id_type, self.lp_type = ("<u2" if small else "<i4"), ("<f4" if single else "<f8")
        id_size, lp_size = (2 if small else 4), (4 if single else 8)
        self._id_format, self._lp_format = ("<H" if small else "<i"), ("<f" if single else "<d")
        self._lp_pair_format = "<ff" if single else "<dd"
        self.n_ids, self.n_lps, self.rows, self.k = n_ids, n_lps, rows, k
        self.ids_at = at
        self.lps_at = at + (n_ids + rows * k) * id_size
        self._lengths_at = self.lps_at + (n_lps + rows * k) * lp_size if ragged else None
        self._id_size, self._lp_size = id_size, lp_size
        self._blob, self._count, self._width, self._joined = blob, count, width, joined
        self._texts_at = self.lps_at + (n_lps + rows * k) * lp_size + (2 * rows if ragged else 0)

    # --- arrays -----------------------------------------------------------------------------------------

    @property
    def output_ids(self) -> np.ndarray:
        import numpy as np

        return np.frombuffer(self._blob, dtype=self.id_type, count=self.n_ids, offset=self.ids_at)

    @property
    def logprobs(self) -> np.ndarray:
        import numpy as np

        return np.frombuffer(self._blob, dtype=self.lp_type, count=self.n_lps, offset=self.lps_at)

    @property
    def top_ids(self) -> np.ndarray:
        import numpy as np

        at = self.ids_at + self.n_ids * self._id_size
        return np.frombuffer(self._blob, dtype=self.id_type, count=self.rows * self.k, offset=at).reshape(self.rows, self.k)

    @property
    def top_logprobs(self) -> np.ndarray:
        import numpy as np

        at = self.lps_at + self.n_lps * self._lp_size
        return np.frombuffer(self._blob, dtype=self.lp_type, count=self.rows * self.k, offset=at).reshape(self.rows, self.k)

    @property
    def top_lengths(self) -> np.ndarray | None:
        import numpy as np

        if self._lengths_at is None:
            return None
        return np.frombuffer(self._blob, dtype="<u2", count=self.rows, offset=self._lengths_at).astype(np.int64)

    # --- single values, read in place --------------------------------------------------------------------

    def id_at(self, i: int) -> int | None:
        return struct.unpack_from(self._id_format, self._blob, self.ids_at + i * self._id_size)[0] if i < self.n_ids else None

    def logprob_at(self, i: int) -> float | None:
        return struct.unpack_from(self._lp_format, self._blob, self.lps_at + i * self._lp_size)[0] if i < self.n_lps else None

    def margin(self, i: int) -> float | None:
        """Top-1 minus top-2 logprob at position i (`Completion.margin`)."""
        if i >= self.rows:
            return None
        width = self.k if self._lengths_at is None else struct.unpack_from("<H", self._blob, self._lengths_at + 2 * i)[0]
        if width < 2:
            return None
        first, second = struct.unpack_from(self._lp_pair_format, self._blob,
                                           self.lps_at + (self.n_lps + i * self.k) * self._lp_size)
        return None if second == float("-inf") else first - second

    # --- texts --------------------------------------------------------------------------------------------

    @property
    def _lengths(self):
        """Version 2: each token text's UTF-8 length (1-byte lengths are the blob's bytes, which index to ints)."""
        import numpy as np

        at, end = self._texts_at, self._texts_at + self._count * self._width
        if self._width == 1:
            return self._blob[at:end]
        return np.frombuffer(self._blob, dtype=f"<u{self._width}", count=self._count, offset=at).tolist()

    @cached_property
    def _v1_texts(self) -> tuple[str, list[str]]:
        texts = json.loads(self._blob[self._texts_at :])
        return ("".join(texts), texts) if self._joined else texts

    def _utf8(self, start: int, end: int | None = None) -> str:
        return self._blob[start:end].decode("utf-8", "surrogatepass")

    @cached_property
    def token_texts(self) -> list[str]:
        if self._count < 0:
            return self._v1_texts[1]
        at, texts = self._texts_at + self._count * self._width, []
        for length in self._lengths:
            texts.append(self._utf8(at, at + length))
            at += length
        return texts

    def token_text(self, i: int) -> str | None:
        """The text of output token i; None past the last."""
        if self._count < 0 or "token_texts" in vars(self):
            return self.token_texts[i] if 0 <= i < len(self.token_texts) else None
        if not 0 <= i < self._count:
            return None
        lengths = self._lengths
        at = self._texts_at + self._count * self._width + sum(lengths[:i])
        return self._utf8(at, at + lengths[i])

    @cached_property
    def text(self) -> str:
        if self._count < 0:
            return self._v1_texts[0]
        texts_at = self._texts_at + self._count * self._width
        texts_end = texts_at + sum(self._lengths)
        return self._utf8(texts_at, texts_end) if self._joined else self._utf8(texts_end)


def payload_view(blob: bytes) -> PayloadView:
    """A payload blob of any version, read on demand (`PayloadView`)."""
    return PayloadView(blob)


def payload_fields(blob: bytes) -> dict:
    """The Completion fields of a payload blob (any version): output_ids, logprobs, top_ids, top_logprobs,
    top_lengths (arrays that view the blob, read-only), token_texts and text."""
    view = payload_view(blob)
    return {"output_ids": view.output_ids, "logprobs": view.logprobs, "top_ids": view.top_ids,
            "top_logprobs": view.top_logprobs, "top_lengths": view.top_lengths, "token_texts": view.token_texts,
            "text": view.text}


def decode_payload(blob: bytes) -> tuple[list[int], list[float], list[list[int]], list[list[float]], list[str], str]:
    """(output ids, logprobs, top ids, top logprobs, token texts, text) of a payload blob, as lists."""
    fields = payload_fields(blob)
    rows, k = fields["top_ids"].shape
    lengths = [k] * rows if fields["top_lengths"] is None else fields["top_lengths"].tolist()
    top_ids = [fields["top_ids"][i, :n].tolist() for i, n in enumerate(lengths)]
    top_lps = [fields["top_logprobs"][i, :n].tolist() for i, n in enumerate(lengths)]
    return (fields["output_ids"].tolist(), fields["logprobs"].tolist(), top_ids, top_lps, fields["token_texts"],
            fields["text"])
