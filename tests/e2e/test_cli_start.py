"""A light CLI start: `evalgate --help` and `evalgate runs list` import none of the heavy libraries, and
opening a store at the newest schema does not run (or import) Alembic. A fresh interpreter is the only
place an import can be seen, hence a subprocess. (How fast the start is: benchmarks/cli_start.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("vllm", "torch", "lm_eval", "transformers", "numpy", "alembic")

# run the CLI in this interpreter, then report which of HEAVY it imported
PROBE = """
import json, sys
from evalgate.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}))
""" % (HEAVY,)


def started(cli_env, *args) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=cli_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def hundred_runs(tmp_path):
    """A store at the newest schema with 100 runs (opened once, so it exists and is migrated)."""
    from evalgate.configuration.suite import load_suite
    from evalgate.fingerprint import COMPONENTS, component
    from evalgate.store import Store

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "prompts.jsonl").write_text('{"id": "a", "prompt": "hello"}\n')
    (tmp_path / "evalgate.toml").write_text('[suite]\nname = "start"\n[engine]\nmodel = "model"\n'
                                            '[prompts]\nfile = "prompts.jsonl"\n')
    suite = load_suite(tmp_path / "evalgate.toml")
    store = Store(f"sqlite:///{tmp_path / 'e.sqlite'}")
    fingerprint = {name: component({"n": name}) for name in COMPONENTS}
    for _ in range(100):
        run_id = store.create_run(suite, "check", {"passes": []}, fingerprint, {"a": [1]})
        store.finish_run(run_id, status="complete", verdict="pass", exit_code=0, summary={"stable": 1})
    store.database.dispose()
    return tmp_path / "e.sqlite"


def test_help_imports_nothing_heavy(cli_env):
    got = started(cli_env, "--help")
    assert got == {"code": 0, "heavy": []}


def test_runs_list_on_a_store_imports_nothing_heavy_nor_alembic(cli_env, hundred_runs):
    got = started(cli_env, "runs", "list", "--db", str(hundred_runs), "--limit", "100")
    assert got == {"code": 0, "heavy": []}


def test_a_store_behind_the_schema_is_still_migrated_on_open(cli_env, hundred_runs):
    """The one-query version check is a shortcut, not a skip: a database one revision behind is upgraded."""
    import sqlite3

    with sqlite3.connect(hundred_runs) as conn:  # as a database four revisions before would read
        conn.execute("update alembic_version set version_num = '0009'")
        conn.execute("alter table runs drop column report")
        conn.execute("drop index ix_outputs_digests")
        conn.execute("create index ix_outputs_run_key on outputs (run_id, request_key)")
        conn.execute("alter table baselines drop column receipt")
        conn.execute("alter table requests drop column rendered")
    got = started(cli_env, "runs", "list", "--db", str(hundred_runs))
    assert got["code"] == 0 and "alembic" in got["heavy"]
    with sqlite3.connect(hundred_runs) as conn:
        from evalgate.store.db import SCHEMA_HEAD

        assert conn.execute("select version_num from alembic_version").fetchall() == [(SCHEMA_HEAD,)]
        indexes = {name for (name,) in conn.execute("select name from sqlite_master where type = 'index'")}
        receipt = [c for c in conn.execute("pragma table_info(baselines)") if c[1] == "receipt"]
    assert "ix_outputs_digests" in indexes and "ix_outputs_run_key" not in indexes and receipt
    assert (hundred_runs.parent / "e.sqlite.backup-0009").is_file()
