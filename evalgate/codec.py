"""One codec for typed rows (frozen dataclasses) to JSON and back, read off their fields' types: every row of a
Report (judgement/report.py) and the rows inside them are stored and read back by it, none by hand.

- A field's JSON key is its name, or `stored_as(...)`'s where the name cannot be it (`pass`, `class`: keywords).
- A field made with `omitted()` is left out of the JSON while it is None (a key that only some rows have).
- A nested row, a list of rows, a dict of rows, and Optional of each are encoded and decoded recursively; a
  frozenset is a sorted list. Anything else is stored as it is (str, numbers, bool, None, plain JSON).
- A row may add keys derived from its fields (`json_extra()`: written for readers of the JSON, never read back)
  and may read a stored row of an older evalgate into this version's keys first (classmethod `from_older`).
- Reading back, a key the stored JSON lacks (an older report) takes the field's default, and a key this version
  does not know is ignored: an older evalgate reads a newer report and the other way round.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def stored_as(name: str, **kwargs):
    """A field stored under another JSON key: `pass_: int = stored_as("pass")`."""
    return dataclasses.field(metadata={"key": name}, **kwargs)


def omitted(default: Any = None):
    """A field left out of the JSON while it is None."""
    return dataclasses.field(default=default, metadata={"omitted": True})


def json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def to_json(value: Any) -> Any:
    """A row (or a list, dict or frozenset of them) as plain JSON."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {json_key(f): to_json(v) for f in dataclasses.fields(value)
               if (v := getattr(value, f.name)) is not None or not f.metadata.get("omitted")}
        return {**out, **value.json_extra()} if hasattr(value, "json_extra") else out
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    if isinstance(value, frozenset):
        return sorted(value)
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


def from_json(cls: type[T], data: Any) -> T:
    """A row of type `cls` from its JSON (`to_json`)."""
    return _decode(cls, data)


@functools.cache
def _hints(cls: type) -> tuple[tuple[str, str, Any, bool], ...]:
    """(field name, JSON key, type, has a default) per init field, the types resolved once per row type."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, json_key(f), hints[f.name],
                  f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)
                 for f in dataclasses.fields(cls) if f.init)


def _decode(tp: Any, data: Any) -> Any:
    if data is None:
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _decode(inner[0], data) if len(inner) == 1 else data
    if dataclasses.is_dataclass(tp):
        data = tp.from_older(data) if hasattr(tp, "from_older") else data
        values = {name: _decode(field_type, data[k]) for name, k, field_type, _ in _hints(tp) if k in data}
        missing = [k for name, k, _, has_default in _hints(tp) if not has_default and name not in values]
        if missing:
            raise ValueError(f"a stored {tp.__name__} lacks {', '.join(missing)}")
        return tp(**values)
    if origin in (list, tuple):
        return [_decode(args[0] if args else Any, item) for item in data]
    if origin is frozenset or tp is frozenset:
        return frozenset(data)
    if origin is dict:
        return {k: _decode(args[1] if args else Any, v) for k, v in data.items()}
    return data
