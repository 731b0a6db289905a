"""The suite file on disk (evalgate/configuration/suite_file.py): found in one place, and edited with tomlkit so
that a user's comments, order and layout survive a remedy being written into it."""

from __future__ import annotations

import pytest

from evalgate.configuration.config import tomllib
from evalgate.configuration.suite_file import add_engine_settings, find_suite
from evalgate.errors import ConfigError

REORDERED = '''# my suite, my order
[gate]   # the gate first
fail_on = "tokens"

[engine]
model = "m"   # my model
max_num_seqs = 4

[sampling]
max_tokens = 8
'''


def test_a_remedy_is_written_into_a_suite_laid_out_by_its_user(tmp_path):
    suite = tmp_path / "evalgate.toml"
    suite.write_text(REORDERED, encoding="utf-8")
    add_engine_settings(suite, {"max_num_seqs": 1, "enable_prefix_caching": False}, "chosen by evalgate init")
    text = suite.read_text(encoding="utf-8")
    assert tomllib.loads(text) == {"gate": {"fail_on": "tokens"}, "sampling": {"max_tokens": 8},
                                   "engine": {"model": "m", "max_num_seqs": 1, "enable_prefix_caching": False}}
    # every line the user wrote is still there, in order, but the one value set in place
    kept = [line for line in REORDERED.splitlines() if not line.startswith("max_num_seqs")]
    lines = text.splitlines()
    assert [line for line in lines if line in kept] == kept
    assert "max_num_seqs = 1 # chosen by evalgate init" in lines
    assert lines[lines.index("enable_prefix_caching = false") - 1] == "# chosen by evalgate init"
    assert text.index("enable_prefix_caching") < text.index("\n\n[sampling]")  # the table keeps its spacing


def test_a_pyproject_suite_and_a_suite_without_an_engine_table(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"  # mine\n\n[tool.evalgate.engine]\nmodel = "m"\n', encoding="utf-8")
    add_engine_settings(pyproject, {"max_num_seqs": 1}, "why")
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    assert data["tool"]["evalgate"]["engine"] == {"model": "m", "max_num_seqs": 1} and data["project"] == {"name": "x"}
    assert 'name = "x"  # mine' in pyproject.read_text(encoding="utf-8")
    bare = tmp_path / "bare.toml"
    bare.write_text('[suite]\nname = "s"\n', encoding="utf-8")
    add_engine_settings(bare, {"enable_chunked_prefill": False}, "why")
    assert tomllib.loads(bare.read_text(encoding="utf-8"))["engine"] == {"enable_chunked_prefill": False}


def test_a_remedy_keeps_the_byte_order_mark_its_user_s_editor_wrote(tmp_path):
    suite = tmp_path / "evalgate.toml"
    suite.write_bytes(b"\xef\xbb\xbf" + REORDERED.encode())
    add_engine_settings(suite, {"max_num_seqs": 1}, "why")
    raw = suite.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf# my suite") and raw.count(b"\xef\xbb\xbf") == 1
    assert tomllib.loads(raw[3:].decode())["engine"] == {"model": "m", "max_num_seqs": 1}


def test_find_suite_is_the_one_discovery(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_suite(required=False) is None
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n', encoding="utf-8")
    assert find_suite(required=False) is None  # a pyproject.toml without [tool.evalgate] is not a suite
    (tmp_path / "pyproject.toml").write_text('[tool.evalgate.suite]\nname = "x"\n', encoding="utf-8")
    assert find_suite().name == "pyproject.toml"
    (tmp_path / "evalgate.toml").write_text('[suite]\nname = "x"\n', encoding="utf-8")
    assert find_suite().name == "evalgate.toml" and find_suite("other.toml").name == "other.toml"


def test_find_suite_looks_up_from_a_subdirectory_to_the_repositorys_root(tmp_path, monkeypatch):
    """As pre-commit finds its own: `evalgate check` in a repository's subdirectory finds the project's suite, and
    never one above the repository's root; outside a repository, only the working directory counts."""
    project = tmp_path / "outer" / "project"
    (project / "src" / "deep").mkdir(parents=True)
    (project / "pyproject.toml").write_text('[tool.evalgate.suite]\nname = "x"\n', encoding="utf-8")
    (tmp_path / "outer" / "evalgate.toml").write_text('[suite]\nname = "other"\n', encoding="utf-8")
    monkeypatch.chdir(project / "src" / "deep")
    assert find_suite(required=False) is None  # no repository: a suite above is not taken
    (project / ".git").mkdir()
    assert find_suite() == project / "pyproject.toml"
    (project / "src" / "evalgate.toml").write_text('[suite]\nname = "nearer"\n', encoding="utf-8")
    assert find_suite() == project / "src" / "evalgate.toml"  # the nearest wins
    (project / "src" / "evalgate.toml").unlink()
    (project / "pyproject.toml").unlink()
    with pytest.raises(ConfigError, match="none found"):  # the repository's root is the boundary
        find_suite()
