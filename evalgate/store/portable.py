"""What SQLite stores as is and a database server refuses: NUL characters in text, non-finite floats in JSON.

SQLite keeps every Python string and every float (NaN, ±inf as JSON `NaN`/`Infinity`) unchanged; these
helpers change nothing there. PostgreSQL refuses both, so a model that emits byte 0 as a token, a prompt
with U+0000 in it, or a NaN logprob in a verdict (a broken model: exactly what the gate must report) would
fail the run's final transaction. On PostgreSQL these values are stored in a reversible form
(docs/storage.md) and come back equal.
"""

from __future__ import annotations

import json
import math

from sqlalchemy import Text
from sqlalchemy.types import TypeDecorator

# --- text: NUL characters ------------------------------------------------------------------------------

# A noncharacter: marks a value stored escaped. Values that contain NUL, or happen to start with the
# marker, are stored as MARK + the body of their JSON string literal; every other value is stored as is.
NUL_MARK = "\ufdd0"


def escape_nul(value: str) -> str:
    if "\x00" in value or value.startswith(NUL_MARK):
        return NUL_MARK + json.dumps(value, ensure_ascii=False)[1:-1]
    return value


def unescape_nul(value: str) -> str:
    if value.startswith(NUL_MARK):
        return json.loads('"' + value[len(NUL_MARK):] + '"')
    return value


class NulSafeText(TypeDecorator):
    """TEXT that round-trips U+0000: unchanged on SQLite; escaped (only when needed) on PostgreSQL."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is None or dialect.name != "postgresql":
            return value
        return escape_nul(value)

    def process_result_value(self, value, dialect):
        if value is None or dialect.name != "postgresql":
            return value
        return unescape_nul(value)


# --- JSON: non-finite floats ---------------------------------------------------------------------------

FLOAT_TAG = "$evalgate_float"  # {"$evalgate_float": "NaN" | "Infinity" | "-Infinity"}


def _tag_nonfinite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return {FLOAT_TAG: "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, dict):
        return {k: _tag_nonfinite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tag_nonfinite(v) for v in value]
    return value


def _untag(obj: dict):
    if len(obj) == 1 and FLOAT_TAG in obj and obj[FLOAT_TAG] in ("NaN", "Infinity", "-Infinity"):
        return float(obj[FLOAT_TAG])
    return obj


def server_json_dumps(value) -> str:
    """JSON a server's json type accepts: NaN/±inf become tagged objects (strict JSON has no literal)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        return json.dumps(_tag_nonfinite(value), allow_nan=False)


def server_json_loads(text: str | bytes):
    return json.loads(text, object_hook=_untag)
