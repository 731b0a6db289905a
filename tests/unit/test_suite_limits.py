"""Size limits of suite and prompts files (docs/suite.md, "Limits"): refused with stat() before reading,
as a ConfigError (exit 2) naming the file, its size, the limit and the fix."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

import evalgate.configuration.config as config_mod
import evalgate.configuration.prompts as prompts_mod
from evalgate.configuration.config import MAX_SUITE_BYTES
from evalgate.configuration.prompts import DEFAULT_MAX_PROMPTS_BYTES, MAX_PROMPTS_ENV, load_prompts
from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError, ExitCode

SUITE = """
[engine]
model = "model"

[prompts]
file = "prompts.jsonl"
"""


@pytest.fixture
def ws(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv(MAX_PROMPTS_ENV, raising=False)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    lines = [json.dumps({"id": f"p{i}", "prompt": f"prompt number {i}"}) for i in range(20)]
    (tmp_path / "prompts.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "evalgate.toml").write_text(SUITE)
    return tmp_path


def refused(fn) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        fn()
    assert info.value.exit_code == ExitCode.USAGE
    return info.value


def test_documented_defaults():
    assert MAX_SUITE_BYTES == 1 << 20
    assert DEFAULT_MAX_PROMPTS_BYTES == 256 << 20
    assert MAX_PROMPTS_ENV == "EVALGATE_MAX_PROMPTS_BYTES"
    docs = (Path(__file__).resolve().parents[2] / "docs" / "suite.md").read_text()
    assert "## Limits" in docs and MAX_PROMPTS_ENV in docs and "256 MiB" in docs and "1 MiB" in docs


def test_files_at_the_limit_load(ws, monkeypatch):
    size = (ws / "prompts.jsonl").stat().st_size
    monkeypatch.setenv(MAX_PROMPTS_ENV, str(size))
    monkeypatch.setattr(config_mod, "MAX_SUITE_BYTES", (ws / "evalgate.toml").stat().st_size)
    assert len(load_suite(ws / "evalgate.toml").prompts) == 20


def test_prompts_file_over_the_limit(ws, monkeypatch):
    path = (ws / "prompts.jsonl").resolve()
    size = path.stat().st_size
    monkeypatch.setenv(MAX_PROMPTS_ENV, str(size - 1))
    reads = []
    real_open = Path.open
    monkeypatch.setattr(Path, "open", lambda self, *a, **kw: reads.append(self) or real_open(self, *a, **kw))
    for fn in (lambda: load_prompts(path), lambda: load_suite(ws / "evalgate.toml")):
        err = refused(fn)
        text = str(err)
        assert str(path) in text
        assert f"{size} bytes" in text and f"limit of {size - 1} bytes" in text
        assert MAX_PROMPTS_ENV in err.fix and "split" in err.fix
    assert path not in reads  # refused from stat(), before reading


def test_prompts_limit_default_applies_without_the_variable(ws, monkeypatch):
    monkeypatch.setattr(prompts_mod, "DEFAULT_MAX_PROMPTS_BYTES", 10)
    err = refused(lambda: load_prompts(ws / "prompts.jsonl"))
    assert "limit of 10 bytes" in str(err)


def test_prompts_file_growing_past_stat_is_still_capped(ws, monkeypatch):
    """stat() can under-report (a file growing while read, pipes, /proc): never read past the limit."""
    path = ws / "prompts.jsonl"
    monkeypatch.setenv(MAX_PROMPTS_ENV, "100")
    real_stat = Path.stat

    class Small:
        st_size = 1

    monkeypatch.setattr(Path, "stat", lambda self, **kw: Small() if self == path else real_stat(self, **kw))
    err = refused(lambda: load_prompts(path))
    assert str(path) in str(err) and "over the limit of 100 bytes" in str(err)


def test_a_file_larger_than_stat_said_is_read_whole_when_it_fits(ws, monkeypatch):
    """A file that stat() under-reports (a growing file, a pipe, /proc) is read on, a chunk at a time."""
    path = ws / "prompts.jsonl"
    monkeypatch.setattr(config_mod, "READ_CHUNK", 7)  # many reads past the byte stat() reported
    real_stat = Path.stat

    class Small:
        st_size = 1

    monkeypatch.setattr(Path, "stat", lambda self, **kw: Small() if self == path else real_stat(self, **kw))
    assert [p.key for p in load_prompts(path)] == [f"p{i}" for i in range(20)]


def test_a_small_prompts_file_never_reserves_the_limit(ws):
    """`read(limit + 1)` reserves the whole limit (256 MiB) before reading a byte: under an address-space limit
    (`ulimit -v`, some batch schedulers) a prompts file of 20 lines failed with MemoryError. Reads are sized by
    the file."""
    tracemalloc.start()
    try:
        prompts = load_prompts(ws / "prompts.jsonl")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(prompts) == 20
    assert peak < 1 << 20, f"reading a {(ws / 'prompts.jsonl').stat().st_size}-byte file peaked at {peak} bytes"


@pytest.mark.parametrize("value", ["lots", "0", "-5", "1.5"])
def test_bad_limit_variable_is_a_config_error(ws, monkeypatch, value):
    monkeypatch.setenv(MAX_PROMPTS_ENV, value)
    err = refused(lambda: load_prompts(ws / "prompts.jsonl"))
    assert MAX_PROMPTS_ENV in str(err) and str(ws / "prompts.jsonl") in str(err) and MAX_PROMPTS_ENV in err.fix


def test_suite_file_over_the_limit(ws, monkeypatch):
    path = (ws / "evalgate.toml").resolve()
    size = path.stat().st_size
    monkeypatch.setattr(config_mod, "MAX_SUITE_BYTES", size - 1)
    err = refused(lambda: load_suite(path))
    text = str(err)
    assert str(path) in text and f"{size} bytes" in text and f"limit of {size - 1} bytes" in text
    assert "prompts" in err.fix


def test_suite_file_of_two_mib_is_refused_with_the_real_limit(ws):
    path = (ws / "evalgate.toml").resolve()
    path.write_text(SUITE + "# " + "x" * (2 << 20) + "\n")
    err = refused(lambda: load_suite(path))
    assert "2.0 MiB" in str(err) and "limit of 1048576 bytes (1.0 MiB)" in str(err)


def test_pyproject_is_capped_too(ws, monkeypatch):
    path = (ws / "pyproject.toml").resolve()
    path.write_text("[tool.evalgate.engine]\nmodel = 'model'\n[tool.evalgate.prompts]\nfile = 'prompts.jsonl'\n")
    assert load_suite(path).name == ws.name
    monkeypatch.setattr(config_mod, "MAX_SUITE_BYTES", 10)
    assert str(path) in str(refused(lambda: load_suite(path)))
