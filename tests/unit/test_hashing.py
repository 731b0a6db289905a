"""Golden tests for the identity hashing contract (docs/design.md "Identity", docs/fingerprint.md).

The expected bytes and digests below were computed once and hard-coded: any change to canonical_json or
digest changes every stored fingerprint, so it must fail here first.
"""

from __future__ import annotations

import hashlib

import pytest

from evalgate.hashing import canonical_json, digest

# Keys deliberately out of order, nested containers, non-ASCII text, escapes, big ints and awkward floats.
VALUE = {
    "z": [1, 2.5, -0.0, 1e-300, 1e21, 0.1],
    "a": {"é": "naïve ✓ 日本", "b": None, "c": True, "A": False},
    "m": {"k": [{"y": 1, "x": 2}]},
    "int": 10**20,
    "neg": -7,
    "esc": 'quote" back\\ tab\t nl\n',
}

GOLDEN_BYTES = (
    b'{"a":{"A":false,"b":null,"c":true,"\xc3\xa9":"na\xc3\xafve \xe2\x9c\x93 \xe6\x97\xa5\xe6\x9c\xac"},'
    b'"esc":"quote\\" back\\\\ tab\\t nl\\n","int":100000000000000000000,"m":{"k":[{"x":2,"y":1}]},'
    b'"neg":-7,"z":[1,2.5,-0.0,1e-300,1e+21,0.1]}'
)
GOLDEN_DIGEST = "4932c7ab8578b9812ae989406ef062b16740c1fa075c5550f510425025f1fa6e"
EMPTY_DIGEST = "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def test_canonical_json_golden_bytes():
    assert canonical_json(VALUE) == GOLDEN_BYTES


def test_digest_golden_hex():
    assert digest(VALUE) == GOLDEN_DIGEST
    assert digest({}) == EMPTY_DIGEST


def test_digest_is_sha256_of_canonical_json():
    assert digest(VALUE) == hashlib.sha256(GOLDEN_BYTES).hexdigest()
    assert len(GOLDEN_DIGEST) == 64 and GOLDEN_DIGEST == GOLDEN_DIGEST.lower()


def test_canonical_json_properties():
    out = canonical_json(VALUE)
    # No whitespace outside strings: the only spaces are inside the two string values.
    assert b": " not in out and b", " not in out and b"\n" not in out
    # Non-ASCII kept as UTF-8, never \u escapes.
    assert "日本".encode() in out and b"\\u" not in out
    # Sorted keys at every depth, so insertion order does not matter.
    reordered = {k: VALUE[k] for k in reversed(list(VALUE))}
    reordered["a"] = dict(reversed(list(VALUE["a"].items())))
    assert canonical_json(reordered) == out


def test_floats_use_shortest_round_trip_and_differ_from_ints():
    assert canonical_json(0.1) == b"0.1"
    assert canonical_json(1.0) == b"1.0"
    assert canonical_json(1) == b"1"
    assert digest(1) != digest(1.0)
    assert canonical_json(-0.0) == b"-0.0" and digest(-0.0) != digest(0.0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_are_refused(bad):
    with pytest.raises(ValueError):
        canonical_json({"x": bad})
