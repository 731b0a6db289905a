"""The packed storage encoding of token-level records (evalgate/records/, docs/storage.md)."""

from __future__ import annotations

import hashlib
import math
import struct

import pytest
from helpers import migration

from evalgate.records import (
    Completion,
    output_digest,
    pack_floats,
    pack_ids,
    unpack_floats,
    unpack_ids,
)

OLD_ENCODING = migration("0009")  # the 0001 top-k encoding, which only that migration reads and writes

TRICKY_FLOATS = [
    0.0, -0.0, 1.0, -1.0, -1e-7, float("inf"), float("-inf"),
    5e-324,  # smallest positive subnormal
    -5e-324,
    2.2250738585072014e-308,  # smallest normal
    2.225073858507201e-308,  # largest subnormal
    1.7976931348623157e308,
    -0.6931471805599453,
    float.fromhex("-0x1.fffffep-1"),  # a float32 value widened to float64
]


def bits(x: float) -> bytes:
    return struct.pack("<d", x)


def flip_last_mantissa_bit(x: float) -> float:
    (n,) = struct.unpack("<Q", struct.pack("<d", x))
    return struct.unpack("<d", struct.pack("<Q", n ^ 1))[0]


def make(ids, lps, **kw) -> Completion:
    top_ids = kw.pop("top_ids", [[t, t + 1] for t in ids])
    top_lps = kw.pop("top_logprobs", [[lp, lp - 1.0] for lp in lps])
    return Completion(key=kw.pop("key", "k"), prompt_ids=[1, 2], output_ids=list(ids), logprobs=list(lps),
                      top_ids=top_ids, top_logprobs=top_lps, token_texts=[f"t{t}" for t in ids],
                      text="".join(f"t{t}" for t in ids), finish_reason="length", **kw)


# --- ids -------------------------------------------------------------------------------------------------


def test_pack_ids_is_int32_little_endian():
    assert pack_ids([1, -2, 0x01020304]) == bytes.fromhex("01000000" "feffffff" "04030201")
    assert pack_ids([]) == b""


def test_ids_round_trip_including_extremes():
    ids = [0, 1, -1, 151_935, 2**31 - 1, -(2**31)]
    blob = pack_ids(ids)
    assert len(blob) == 4 * len(ids)
    assert unpack_ids(blob) == ids


def test_ids_out_of_int32_range_are_refused():
    with pytest.raises(OverflowError):
        pack_ids([2**31])


# --- logprobs --------------------------------------------------------------------------------------------


def test_pack_floats_is_float64_little_endian():
    assert pack_floats([1.0]) == bytes.fromhex("000000000000f03f")
    assert pack_floats([-0.0]) == bytes.fromhex("0000000000000080")
    assert pack_floats([5e-324]) == bytes.fromhex("0100000000000000")


def test_floats_round_trip_every_bit():
    blob = pack_floats(TRICKY_FLOATS)
    assert len(blob) == 8 * len(TRICKY_FLOATS)
    back = unpack_floats(blob)
    assert [bits(x) for x in back] == [bits(x) for x in TRICKY_FLOATS]
    assert math.copysign(1.0, back[1]) == -1.0  # -0.0 stays negative


def test_nan_payload_survives():
    nan = struct.unpack("<d", bytes.fromhex("010000000000f87f"))[0]
    assert bits(unpack_floats(pack_floats([nan]))[0]) == bytes.fromhex("010000000000f87f")


# --- digest ----------------------------------------------------------------------------------------------


def test_digest_definition():
    ids, lps = [1, 2, 3], [-0.5, -1.25, -0.0]
    expected = hashlib.sha256(b"ids" + pack_ids(ids) + b"lp" + pack_floats(lps)).hexdigest()
    assert output_digest(pack_ids(ids), pack_floats(lps)) == expected
    # Golden value: the digest is stored in every output row.
    assert expected == "1cec377035e7e6ec795c7c8d8d2bf8a4d811097176ca4cf8bf6b6a86f251303f"
    assert make(ids, lps).digest == expected


def test_digest_ignores_text_top_k_and_placement():
    a = make([5, 6, 7], [-0.1, -0.2, -0.3])
    b = make([5, 6, 7], [-0.1, -0.2, -0.3], top_ids=[[5], [6], [7]], top_logprobs=[[-0.1], [-0.2], [-0.3]],
             pass_index=3, concurrency=16, wave=2, position=9)
    b.token_texts = ["x", "y", "z"]
    assert a.digest == b.digest


@pytest.mark.parametrize("position", [0, 1, 4])
def test_digest_changes_on_any_single_id(position):
    ids, lps = [10, 11, 12, 13, 14], [-0.1, -0.2, -0.3, -0.4, -0.5]
    base = make(ids, lps).digest
    changed = list(ids)
    changed[position] += 1
    assert make(changed, lps).digest != base


@pytest.mark.parametrize("position", [0, 2, 4])
def test_digest_changes_on_a_single_logprob_bit(position):
    ids, lps = [10, 11, 12, 13, 14], [-0.1, -0.2, -0.3, -0.4, -0.5]
    base = make(ids, lps).digest
    changed = list(lps)
    changed[position] = flip_last_mantissa_bit(changed[position])
    assert changed[position] != lps[position]
    assert abs(changed[position] - lps[position]) < 1e-15
    assert make(ids, changed).digest != base


def test_digest_distinguishes_signed_zero():
    assert make([1], [0.0]).digest != make([1], [-0.0]).digest


def test_digest_distinguishes_ids_from_logprobs_boundary():
    # One more id and one fewer logprob must not collide with the original layout.
    assert make([1, 2], [-1.0, -2.0]).digest != make([1], [-1.0, -2.0]).digest
    assert make([1, 2], [-1.0]).digest != make([1, 2], [-1.0, -2.0]).digest


def test_stored_digest_is_trusted():
    c = make([1, 2], [-1.0, -2.0])
    c._digest = "f" * 64
    assert c.digest == "f" * 64


# --- top-k -----------------------------------------------------------------------------------------------


def test_top_k_packing_pads_with_minus_one_and_minus_inf():
    c = make([3, 4, 5], [-0.1, -0.2, -0.3],
             top_ids=[[3, 9, 8], [4], [5, 7]],
             top_logprobs=[[-0.1, -2.0, -3.0], [-0.2], [-0.3, -5e-324]])
    k, ids_blob, lps_blob = OLD_ENCODING.pack_top(c)
    assert k == 3
    assert unpack_ids(ids_blob) == [3, 9, 8, 4, -1, -1, 5, 7, -1]
    lps = unpack_floats(lps_blob)
    assert lps[3] == -0.2 and lps[4] == lps[5] == lps[8] == float("-inf")
    assert len(ids_blob) == 4 * 9 and len(lps_blob) == 8 * 9
    top_ids, top_lps = OLD_ENCODING.unpack_top(k, ids_blob, lps_blob)
    assert top_ids == c.top_rows()[0]
    assert [[bits(x) for x in row] for row in top_lps] == [[bits(x) for x in row] for row in c.top_rows()[1]]


def test_top_k_keeps_a_real_minus_inf_logprob():
    c = make([3], [-0.1], top_ids=[[3, 4]], top_logprobs=[[-0.1, float("-inf")]])
    top_ids, top_lps = OLD_ENCODING.unpack_top(*OLD_ENCODING.pack_top(c))
    assert top_ids == [[3, 4]] and top_lps == [[-0.1, float("-inf")]]


def test_top_k_empty():
    c = make([], [], top_ids=[], top_logprobs=[])
    k, ids_blob, lps_blob = OLD_ENCODING.pack_top(c)
    assert (k, ids_blob, lps_blob) == (0, b"", b"")
    assert OLD_ENCODING.unpack_top(k, ids_blob, lps_blob) == ([], [])


# --- margin ----------------------------------------------------------------------------------------------


def test_margin_is_top1_minus_top2():
    c = make([3, 4], [-0.25, -1.0], top_ids=[[3, 9], [4, 5, 6]], top_logprobs=[[-0.25, -0.75], [-1.0, -1.0, -2.0]])
    assert c.margin(0) == 0.5
    assert c.margin(1) == 0.0  # an exact tie


def test_margin_missing_cases():
    c = make([3, 4], [-0.25, -1.0], top_ids=[[3], [4, 5]], top_logprobs=[[-0.25], [-1.0, float("-inf")]])
    assert c.margin(0) is None  # only one candidate
    assert c.margin(1) is None  # the second candidate is padding
    assert c.margin(2) is None  # past the end
