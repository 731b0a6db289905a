"""The identity hashing contract (docs/design.md "Identity", docs/fingerprint.md). Changing anything here changes every hash.

canonical_json: JSON with sorted keys, no whitespace, UTF-8 (non-ASCII kept as is), floats in Python's
shortest round-trip repr. digest: lowercase hex SHA-256 of that encoding. Pinned by tests/unit/test_hashing.py.
"""

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )


def digest(value: Any) -> str:
    return hashlib.sha256(canonical_json(value)).hexdigest()


def jsonable(value: Any) -> Any:
    """A JSON-able copy of `value`: tuples as lists, keys as strings, functions (lm-eval's `!function`) by
    qualified name, any other object by str(). What is stored or hashed must be one of these."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if callable(value):
        return f"{getattr(value, '__module__', '')}.{getattr(value, '__qualname__', repr(value))}"
    return str(value)
