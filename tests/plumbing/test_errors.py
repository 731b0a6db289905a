"""Bad input that never reaches an engine, through the CLI on the fake engine (moved from the e2e tier: what
is refused is the same whatever the engine): a clear message naming the file and field, exit 2, and nothing
written. The checks that need real vLLM (engine arguments, prompt lengths) stay in tests/e2e/test_e2e_errors.py."""

from __future__ import annotations

import hashlib
import re
import sqlite3

import pytest
from helpers import write_suite


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_missing_model_dir(inline_cli, tmp_path):
    suite = write_suite(tmp_path, tmp_path / "no-such-model", ["hello"], kind="fake")
    proc = inline_cli("baseline", "create", suite, check=2)
    assert str(suite) in proc.stderr and "engine.model" in proc.stderr and "fix:" in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()


def test_malformed_suite_file(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    suite.write_text(suite.read_text() + "\n[schedule\nconcurrency = 3\n")
    proc = inline_cli("check", suite, check=2)
    assert str(suite) in proc.stderr and "malformed TOML" in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()


def test_wrong_type_names_the_field(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    suite.write_text(suite.read_text().replace("max_tokens = 16", 'max_tokens = "lots"'))
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "sampling.max_tokens" in proc.stderr and "integer" in proc.stderr


@pytest.mark.parametrize("flag", ["--json-report", "--junit"])
def test_an_output_path_the_run_could_not_write_is_refused_before_it_runs(inline_cli, tmp_path, fake_model, flag):
    """A report path that is a directory, or under a file: exit 2 before anything runs (it was exit 3 after the
    run, the run stored); a path in directories that do not exist yet is written, the directories made."""
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    (tmp_path / "taken").mkdir()
    (tmp_path / "a-file").write_text("")
    for path, why in [(tmp_path / "taken", "it is a directory"), (tmp_path / "a-file" / "r.xml", "a-file is a file, not a directory")]:
        said = " ".join(re.sub("[│╭╮╰╯─]", " ", inline_cli("baseline", "create", suite, flag, path, check=2).stderr).split())
        assert f"Invalid value for '{flag}'" in said and "cannot write there" in said and why in said, said
    # `-` is no file named "-" (as it was written): standard output carries the report for people
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", inline_cli("baseline", "create", suite, flag, "-", check=2).stderr).split())
    assert "`-`: name a file (standard output carries the report for people)" in said, said
    assert not (tmp_path / "evalgate.sqlite").exists() and not (tmp_path / "-").exists()
    inline_cli("baseline", "create", suite, flag, tmp_path / "new" / "dirs" / "out", check=0)
    assert (tmp_path / "new" / "dirs" / "out").stat().st_size > 0


def test_one_path_for_both_reports_is_refused_before_the_run(inline_cli, tmp_path, fake_model):
    """--json-report and --junit at one path: the JUnit XML overwrote the JSON report without a word."""
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    proc = inline_cli("check", suite, "--json-report", tmp_path / "r.json", "--junit", tmp_path / "." / "r.json", check=2)
    said = " ".join(re.sub("[│╭╮╰╯─]", " ", proc.stderr).split())
    assert "Invalid value for --junit:" in said and "is the --json-report's path too" in said, said
    assert not (tmp_path / "evalgate.sqlite").exists()


def test_empty_prompts_file(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    (tmp_path / "prompts.jsonl").write_text("\n")
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "prompts.jsonl" in proc.stderr and "empty" in proc.stderr
    assert not (tmp_path / "evalgate.sqlite").exists()


def test_database_from_newer_schema_is_refused_untouched(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    from evalgate.store import Store

    db = tmp_path / "evalgate.sqlite"
    Store(f"sqlite:///{db}").database.dispose()  # a real evalgate database (not this process's cached store)...
    conn = sqlite3.connect(db)  # ...as a future evalgate would leave it
    with conn:
        conn.execute("update alembic_version set version_num = '9999_from_the_future'")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    before = digest(db)
    proc = inline_cli("check", suite, check=2)
    assert "newer evalgate" in proc.stderr and "9999_from_the_future" in proc.stderr and str(db) in proc.stderr
    assert digest(db) == before


def test_not_a_database_file_is_refused_untouched(inline_cli, tmp_path, fake_model):
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    db = tmp_path / "evalgate.sqlite"
    db.write_bytes(b"these are my notes, not a database\n" * 10)
    before = digest(db)
    proc = inline_cli("baseline", "create", suite, check=2)
    assert "not an evalgate database" in proc.stderr and str(db) in proc.stderr
    assert digest(db) == before


def test_out_of_memory_says_so_and_the_run_is_stored_incomplete(inline_cli, tmp_path, fake_model, monkeypatch):
    """A MemoryError (an address-space limit: `ulimit -v`, some batch schedulers) is an engine failure, exit 3,
    with what happened and the fix; never Python's empty "MemoryError: ". The run it cut short is failed."""
    from evalgate.engines.fake import FakeEngine

    def out_of_memory(self, prompts, **kwargs):
        raise MemoryError

    monkeypatch.setattr(FakeEngine, "generate", out_of_memory)
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    proc = inline_cli("baseline", "create", suite, check=3)
    assert "error: out of memory (MemoryError)" in proc.stderr and "ulimit -v" in proc.stderr, proc.stderr
    assert "--shard" in proc.stderr and "EVALGATE_DEBUG" not in proc.stderr
    with sqlite3.connect(tmp_path / "evalgate.sqlite") as conn:
        assert conn.execute("select status, exit_code from runs").fetchall() == [("failed", 3)]


def test_out_of_memory_in_the_cli_process_says_so(inline_cli, tmp_path, fake_model, monkeypatch):
    """Judging (the CLI's own process, after the passes) out of memory: the same message and exit 3, on the
    terminal and in the JUnit file CI shows."""
    import evalgate.gate as gate_mod

    def out_of_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(gate_mod, "judge_and_store", out_of_memory)
    suite = write_suite(tmp_path, fake_model, ["hello"], kind="fake")
    proc = inline_cli("baseline", "create", suite, "--junit", tmp_path / "junit.xml", check=3)
    assert "error: out of memory (MemoryError)" in proc.stderr and "ulimit -v" in proc.stderr, proc.stderr
    assert "out of memory (MemoryError)" in (tmp_path / "junit.xml").read_text()


def runs_out_of_memory(*, progress, on_run):
    raise MemoryError


def test_an_engine_process_out_of_memory_reports_it_across_the_process_boundary(monkeypatch):
    """The engine's own process (not inline) sends the same error back: exit 3, message and fix."""
    from evalgate.errors import EngineError
    from evalgate.execution import worker

    monkeypatch.delenv(worker.INLINE_ENV, raising=False)
    with pytest.raises(EngineError) as caught:
        worker.call_in_worker(runs_out_of_memory, {})
    assert caught.value.message == "out of memory (MemoryError)" and "ulimit -v" in caught.value.fix
