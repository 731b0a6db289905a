"""The identity hashing contract (docs/design.md "Identity", docs/fingerprint.md). Changing anything here changes every hash.

canonical_json: JSON with sorted keys, no whitespace, UTF-8 (non-ASCII kept as is), floats in Python's
shortest round-trip repr. digest: lowercase hex SHA-256 of that encoding. Pinned by tests/test_hashing.py.
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
