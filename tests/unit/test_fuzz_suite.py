"""Fuzzing the suite loader: whatever bytes a suite file or prompts file holds, `load_suite` / `load_prompts`
either return a Suite (whose identity can be hashed and whose text can be stored) or raise a ConfigError
that names the file. Never any other exception: anything else would surface as exit 3 ("engine or
infrastructure error") instead of exit 2 with the file, field and fix.

Inputs: arbitrary bytes; arbitrary TOML documents (random nested tables serialized by the small TOML writer
below, and mutations of a valid suite that put random values under the real keys); arbitrary JSONL lines
(random bytes, random JSON values, objects with id/prompt/max_tokens/metadata of random types). Known crash
classes found by this fuzzer are pinned as explicit examples.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from evalgate.configuration.prompts import load_prompts
from evalgate.configuration.suite import SAMPLING_KEYS, Suite, load_suite
from evalgate.errors import ConfigError
from evalgate.hashing import canonical_json

# EVALGATE_FUZZ_EXAMPLES=5000 fuzzes deeper (the default keeps the whole module near 10 s on 2 cores).
FUZZ = settings(max_examples=int(os.environ.get("EVALGATE_FUZZ_EXAMPLES", "150")), deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VALID_PROMPTS = b'{"id": "a", "prompt": "Hello"}\n{"id": 2, "prompt": "World", "max_tokens": 3}\n'
VALID_SUITE = {
    "suite": {"name": "fuzz", "database": "sqlite:///fuzz.sqlite", "code_paths": ["prompts.jsonl"]},
    "engine": {"model": "model", "dtype": "float32", "max_model_len": 256},
    "sampling": {"max_tokens": 8, "logprobs": 4},
    "prompts": {"file": "prompts.jsonl"},
    "schedule": {"concurrency": [1, 4], "shuffles": 1, "repeats": 1, "seed": 0},
}
KNOWN_KEYS = {
    "suite": ["name", "database", "code_paths"],
    "engine": ["kind", "model", "tokenizer", "batch_invariant", "dtype", "max_model_len", "seed"],
    "sampling": sorted(SAMPLING_KEYS),
    "prompts": ["file"],
    "schedule": ["concurrency", "shuffles", "repeats", "seed"],
}


@pytest.fixture(scope="module")
def ws(tmp_path_factory) -> Path:
    """A workspace with a fake model (config.json only), a tokenizer dir, a valid prompts file and a
    symlink loop (`loop` -> `loop`), so path values can hit every kind of filesystem object."""
    root = tmp_path_factory.mktemp("fuzz").resolve()
    (root / "model").mkdir()
    (root / "model" / "config.json").write_text("{}")
    (root / "tok").mkdir()
    (root / "prompts.jsonl").write_bytes(VALID_PROMPTS)
    (root / "loop").symlink_to("loop")
    return root


def assert_loads_or_config_error(fn, *named: Path):
    """Run the loader: a Suite (or prompt list) that is usable downstream, or a ConfigError naming a file."""
    try:
        result = fn()
    except ConfigError as exc:
        text = str(exc)
        assert any(str(p) in text for p in named), f"ConfigError does not name {[str(p) for p in named]}: {text}"
        assert exc.fix, f"ConfigError without a fix: {text}"
        return None
    if isinstance(result, Suite):
        check_usable(result)
        prompts = result.prompts
    else:
        prompts = result
    assert prompts, "the loader returned no prompts instead of an error"
    for p in prompts:
        # stored in the database as UTF-8 text; a lone surrogate would crash the store after the engine ran
        p.key.encode("utf-8"), p.text.encode("utf-8")
        assert isinstance(p.key, str) and isinstance(p.text, str) and p.text
    return result


def check_usable(suite: Suite) -> None:
    """What the fingerprint and the engine do with a loaded suite must not crash."""
    canonical_json(suite.identity())  # suite component (no nan/inf, JSON-able)
    canonical_json(suite.engine_args)  # part of the engine component
    canonical_json(suite.sampling)
    assert all(isinstance(c, int) and c >= 1 for c in suite.schedule.concurrency)


# --- a tiny TOML writer -------------------------------------------------------------------------------------


def toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return toml_str(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{toml_str(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def toml_dumps(doc: dict, table: str = "") -> str:
    """Plain keys first (under [table] if given), then one [table.key] per dict value (deeper dicts inline)."""
    lines = [f"[{table}]"] if table else []
    lines += [f"{toml_str(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for k, v in doc.items():
        if isinstance(v, dict):
            lines.append(f"[{table + '.' if table else ''}{toml_str(k)}]")
            lines += [f"{toml_str(kk)} = {toml_value(vv)}" for kk, vv in v.items()]
    return "\n".join(lines) + "\n"


def test_toml_writer_round_trips():
    import tomllib

    doc = {"a": 1, "b": {"c": [1, "x\"\\\x01\x7f\U0001F600", {"d": float("inf")}], "e": dt.date(2020, 1, 2)}}
    assert tomllib.loads(toml_dumps(doc)) == doc
    assert tomllib.loads(toml_dumps(doc, "tool.evalgate")) == {"tool": {"evalgate": doc}}


# --- strategies ------------------------------------------------------------------------------------------

PATHISH = st.one_of(
    st.sampled_from(["model", "tok", "prompts.jsonl", "loop", "loop/x", "missing", "", ".", "..", "/",
                     "/dev/null", "model/config.json", "a\x00b", "x" * 300, ("y" * 200 + "/") * 25,
                     "sqlite:///a\x00b", "sqlite:///" + "z" * 300, "sqlite:////abs.db", "postgresql://h/db"]),
    st.text(max_size=40),
)
TOML_SCALARS = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.sampled_from([0, 1, -1, 2, 64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    PATHISH,
    st.datetimes(), st.dates(), st.times(),
    st.datetimes(timezones=st.just(dt.timezone.utc)),
)
TOML_VALUES = st.recursive(
    TOML_SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=12), children, max_size=4)),
    max_leaves=12,
)


def _no_nan(v) -> bool:
    if isinstance(v, float):
        return not math.isnan(v)
    if isinstance(v, list):
        return all(_no_nan(x) for x in v)
    if isinstance(v, dict):
        return all(_no_nan(x) for x in v.values())
    return True


@settings(max_examples=100, deadline=None, database=None)
@given(doc=st.dictionaries(st.text(max_size=8), TOML_VALUES, max_size=5).filter(_no_nan))
def test_toml_writer_round_trips_random_documents(doc):
    """The writer itself is right, so the fuzz tests really reach the loader's checks (nan != nan: left out)."""
    import tomllib

    assert tomllib.loads(toml_dumps(doc)) == doc


SECTION_NAMES = st.one_of(st.sampled_from([*KNOWN_KEYS, "tool"]), st.text(max_size=12))


@st.composite
def random_documents(draw) -> dict:
    return draw(st.dictionaries(SECTION_NAMES, st.one_of(TOML_VALUES, st.dictionaries(st.text(max_size=12),
                                                                                        TOML_VALUES, max_size=5)),
                                max_size=6))


@st.composite
def mutated_suites(draw) -> dict:
    """A valid suite with a few keys (mostly real ones) set to random values, deleted or added."""
    doc = {k: dict(v) for k, v in VALID_SUITE.items()}
    for _ in range(draw(st.integers(1, 4))):
        section = draw(st.sampled_from(sorted(KNOWN_KEYS)))
        key = draw(st.one_of(st.sampled_from(KNOWN_KEYS[section]), st.text(max_size=10)))
        action = draw(st.sampled_from(["set", "set", "set", "delete", "replace_section"]))
        if action != "replace_section" and not isinstance(doc[section], dict):
            doc[section] = {}
        if action == "set":
            doc[section][key] = draw(TOML_VALUES)
        elif action == "delete":
            doc[section].pop(key, None)
        else:
            doc[section] = draw(TOML_VALUES)
    return doc


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


# --- suite files -----------------------------------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=600), name=st.sampled_from(["evalgate.toml", "pyproject.toml"]))
@example(data=b"a=" + b"[" * 3000 + b"]" * 3000, name="evalgate.toml")  # RecursionError in tomllib
@example(data=b"a={b=" * 2000 + b"1" + b"}" * 2000, name="evalgate.toml")
@example(data=b"\xef\xbb\xbf[suite]\n", name="evalgate.toml")
@example(data=b"tool = 1\n", name="pyproject.toml")  # AttributeError: 'int' object has no attribute 'get'
@example(data=b"[tool]\nevalgate = 3\n", name="pyproject.toml")
def test_suite_file_arbitrary_bytes(ws, data, name):
    path = write(ws / name, data)
    assert_loads_or_config_error(lambda: load_suite(path), path)


@FUZZ
@given(doc=random_documents(), name=st.sampled_from(["evalgate.toml", "pyproject.toml"]))
def test_suite_file_random_toml_documents(ws, doc, name):
    path = write(ws / name, toml_dumps(doc).encode("utf-8"))
    assert_loads_or_config_error(lambda: load_suite(path), path)


SUITE_EXAMPLES = [
    ("engine", "model", "a\x00b"),  # ValueError: embedded null byte (Path.resolve)
    ("engine", "model", "x" * 300),  # OSError: File name too long (Path.is_dir)
    ("engine", "model", "loop/x"),  # RuntimeError: Symlink loop (Path.resolve, Python < 3.13)
    ("engine", "tokenizer", "a\x00b"),
    ("suite", "code_paths", ["x" * 300]),
    ("suite", "code_paths", ["loop"]),
    ("suite", "database", "sqlite:///a\x00b"),
    ("prompts", "file", "x" * 300),
    ("prompts", "file", "a\x00b"),
    ("sampling", "temperature", float("nan")),  # accepted, then canonical_json refuses nan: exit 3 later
    ("sampling", "top_p", float("inf")),
    ("sampling", "stop", [1, dt.date(2020, 1, 1)]),  # not JSON-able: the suite hash crashed
    ("engine", "max_model_len", dt.datetime(2020, 1, 1, 0, 0)),  # engine identity crashed
    ("engine", "rope_scaling", {"factor": float("nan")}),
]


@FUZZ
@given(doc=mutated_suites(), name=st.sampled_from(["evalgate.toml", "evalgate.toml", "pyproject.toml"]))
def test_suite_file_mutated_valid_suites(ws, doc, name):
    data = toml_dumps(doc, "tool.evalgate") if name == "pyproject.toml" else toml_dumps(doc)
    path = write(ws / name, data.encode("utf-8"))
    assert_loads_or_config_error(lambda: load_suite(path), path, ws / "prompts.jsonl")


@pytest.mark.parametrize("section,key,value", SUITE_EXAMPLES, ids=[f"{s}.{k}-{i}" for i, (s, k, _) in
                                                                   enumerate(SUITE_EXAMPLES)])
def test_pinned_crashes_are_config_errors_naming_file_and_field(ws, section, key, value):
    doc = {k: dict(v) for k, v in VALID_SUITE.items()}
    doc[section][key] = value
    path = write(ws / "evalgate.toml", toml_dumps(doc).encode("utf-8"))
    with pytest.raises(ConfigError) as info:
        load_suite(path)
    assert str(path) in str(info.value) and f"{section}.{key}" in str(info.value), str(info.value)


def test_database_override_with_unusable_path_is_a_config_error(ws, monkeypatch):
    path = write(ws / "evalgate.toml", toml_dumps(VALID_SUITE).encode("utf-8"))
    monkeypatch.chdir(ws)
    with pytest.raises(ConfigError) as info:
        load_suite(path, database="a\x00b.sqlite")
    assert "--db" in str(info.value)


# --- prompts files ---------------------------------------------------------------------------------------

JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                         st.text(max_size=20))
JSON_VALUES = st.recursive(JSON_SCALARS, lambda c: st.one_of(st.lists(c, max_size=4),
                                                            st.dictionaries(st.text(max_size=8), c, max_size=4)),
                           max_leaves=10)
RANDOM_FIELD = st.one_of(JSON_VALUES, st.sampled_from(["", "ok", "a\x00b", "\ud800", "x\udfffy", 0, -1, 1, True,
                                                       2**70, 1.5, "12"]))
PROMPT_OBJECTS = st.fixed_dictionaries(
    {},
    optional={"id": RANDOM_FIELD, "prompt": RANDOM_FIELD, "max_tokens": RANDOM_FIELD, "metadata": JSON_VALUES,
              "extra": JSON_VALUES},
)
# ensure_ascii=True writes lone surrogates as \udXXX escapes, which json.loads turns back into them
JSON_LINES = st.one_of(
    st.binary(max_size=80),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    PROMPT_OBJECTS.map(lambda v: json.dumps(v).encode()),
    PROMPT_OBJECTS.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.sampled_from([b"", b"   ", b"\r", b"\xef\xbb\xbf{}", b"[" * 5000 + b"]" * 5000,
                     b'{"id": ' + b"9" * 5000 + b', "prompt": "x"}']),
)
VALID_LINES = st.builds(lambda i, t: json.dumps({"id": f"k{i}", "prompt": t or "x"}).encode(),
                        st.integers(0, 10**6), st.text(max_size=20))


@FUZZ
@given(lines=st.lists(st.one_of(JSON_LINES, VALID_LINES), max_size=8), newline=st.sampled_from([b"\n", b"\r\n"]))
@example(lines=[b"[" * 100000 + b"]" * 100000], newline=b"\n")  # RecursionError in json.loads
@example(lines=[b'{"id": ' + b"9" * 5000 + b', "prompt": "x"}'], newline=b"\n")  # ValueError: int digits limit
@example(lines=[b'{"id": "a", "prompt": "\\ud800"}'], newline=b"\n")  # lone surrogate: store crashes later
@example(lines=[b'{"id": "\\udfff", "prompt": "x"}'], newline=b"\n")
def test_prompts_file_arbitrary_lines(ws, lines, newline):
    path = write(ws / "fuzz-prompts.jsonl", newline.join(lines))
    assert_loads_or_config_error(lambda: load_prompts(path), path)


@FUZZ
@given(data=st.binary(max_size=400))
def test_prompts_file_arbitrary_bytes_through_load_suite(ws, data):
    write(ws / "prompts-b.jsonl", data)
    doc = {k: dict(v) for k, v in VALID_SUITE.items()}
    doc["prompts"]["file"] = "prompts-b.jsonl"
    path = write(ws / "evalgate.toml", toml_dumps(doc).encode("utf-8"))
    assert_loads_or_config_error(lambda: load_suite(path), ws / "prompts-b.jsonl")


def test_valid_suite_loads(ws):
    path = write(ws / "evalgate.toml", toml_dumps(VALID_SUITE).encode("utf-8"))
    suite = load_suite(path)
    assert [p.key for p in suite.prompts] == ["a", "2"]
    check_usable(suite)
