"""Little-endian byte encodings of id and float arrays (prompt ids; the outputs of schema revisions before
0009), and an output's digest over them (docs/storage.md)."""

from __future__ import annotations

import array
import hashlib
import sys

SWAP = sys.byteorder != "little"  # the encodings are little-endian; array is native


def to_le_bytes(a: array.array) -> bytes:
    if SWAP:
        a = array.array(a.typecode, a)
        a.byteswap()
    return a.tobytes()


def from_le_bytes(typecode: str, blob: bytes) -> array.array:
    a = array.array(typecode)
    a.frombytes(blob)
    if SWAP:
        a.byteswap()
    return a


def pack_ids(ids) -> bytes:
    return to_le_bytes(array.array("i", ids))


def unpack_ids(blob: bytes) -> list[int]:
    return from_le_bytes("i", blob).tolist()


def pack_floats(values) -> bytes:
    return to_le_bytes(array.array("d", values))


def unpack_floats(blob: bytes) -> list[float]:
    return from_le_bytes("d", blob).tolist()


def output_digest(ids_blob: bytes, logprobs_blob: bytes) -> str:
    """The digest of packed ids (int32 LE) and logprobs (float64 LE)."""
    h = hashlib.sha256(b"ids")
    h.update(ids_blob)
    h.update(b"lp")
    h.update(logprobs_blob)
    return h.hexdigest()
