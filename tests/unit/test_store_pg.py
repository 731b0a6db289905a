"""The store on PostgreSQL (EVALGATE_TEST_POSTGRES=1, tests/pg.py): the refusals of test_store.py's SQLite
files, for a server database; connection errors; concurrent first opens; and the values a server refuses
where SQLite does not (NUL characters, NaN/Infinity in JSON, over-long strings), checked on both backends.
test_store.py's backend-independent tests run on PostgreSQL through its `db_url` fixture."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import db_baselines, db_query, db_runs, db_tables
from sqlalchemy import create_engine, inspect
from test_store import PROMPT_IDS, completion, fingerprint, new_run, suite  # noqa: F401 (suite: a fixture)

from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError, ExitCode, StoreError
from evalgate.store import Store
from evalgate.store.db import head_revision
from evalgate.store.models import Base
from evalgate.store.portable import NUL_MARK

EVALGATE_TABLES = set(Base.metadata.tables) | {"alembic_version"}


def execute(url: str, *statements: str) -> None:
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for sql in statements:
                conn.exec_driver_sql(sql)
    finally:
        engine.dispose()


def snapshot(url: str) -> dict:
    """Every table's name, columns and rows: what "left untouched" means for a server database."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            insp = inspect(conn)
            return {t: ([c["name"] for c in insp.get_columns(t)],
                        sorted(map(tuple, conn.exec_driver_sql(f'select * from "{t}"').fetchall()), key=repr))
                    for t in insp.get_table_names()}
    finally:
        engine.dispose()


# --- opening and migrations ------------------------------------------------------------------------------


def test_new_database_is_created_at_head(pg_url):
    store = Store(pg_url)
    assert db_tables(pg_url) == EVALGATE_TABLES
    assert db_query(pg_url, "select version_num from alembic_version") == [(head_revision(),)]
    cols = {c["name"]: c["type"] for c in inspect(store.database).get_columns("outputs")}
    assert str(cols["request_key"]) == "VARCHAR(500)" and str(cols["payload_hash"]) == "VARCHAR(64)"
    payloads = {c["name"]: c["type"] for c in inspect(store.database).get_columns("payloads")}
    assert type(payloads["data"]).__name__ == "BYTEA"
    # ids come from sequences: the first run is 1, as on SQLite
    assert db_query(pg_url, "select pg_get_serial_sequence('runs', 'id')") != [(None,)]


def test_models_match_the_migrations(pg_url):
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    store = Store(pg_url)
    with store.database.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []


def test_older_schema_upgrades_in_place(pg_url):
    """The first revision, with data, upgraded to head when opened (in one transaction; no backup file:
    that is SQLite's)."""
    from alembic import command

    from evalgate.store.db import _alembic_config

    engine = create_engine(pg_url)
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
        conn.exec_driver_sql("insert into runs (suite_name, suite_path, kind, status, schedule, started_at) "
                             "values ('s', '/s.toml', 'baseline', 'complete', '{}', '2026-01-01 00:00:00')")
    engine.dispose()
    assert db_query(pg_url, "select version_num from alembic_version") == [("0001",)]
    store = Store(pg_url)
    assert db_query(pg_url, "select version_num from alembic_version") == [(head_revision(),)]
    assert db_tables(pg_url) == EVALGATE_TABLES
    assert [(r.id, r.suite_name) for r in store.runs()] == [(1, "s")]


def test_foreign_database_is_refused_and_left_untouched(pg_url):
    execute(pg_url, "create table users (id serial primary key, name text)",
            "insert into users (name) values ('alice')")
    before = snapshot(pg_url)
    with pytest.raises(ConfigError) as info:
        Store(pg_url)
    msg = str(info.value)
    assert "not an evalgate database" in msg and "users" in msg and pg_url in msg
    assert info.value.exit_code == ExitCode.USAGE
    assert snapshot(pg_url) == before


def test_newer_schema_is_refused_and_left_untouched(pg_url, suite):
    new_run(Store(pg_url), suite)
    execute(pg_url, "update alembic_version set version_num = 'ffff9999'")
    before = snapshot(pg_url)
    with pytest.raises(ConfigError) as info:
        Store(pg_url)
    msg = str(info.value)
    assert "newer evalgate" in msg and "ffff9999" in msg and head_revision() in msg and pg_url in msg
    assert info.value.exit_code == ExitCode.USAGE
    assert snapshot(pg_url) == before


def test_another_alembic_application_is_not_called_a_newer_evalgate(pg_url):
    execute(pg_url, "create table alembic_version (version_num varchar(32) not null primary key)",
            "insert into alembic_version values ('a1b2c3d4e5f6')", "create table invoices (id serial primary key)")
    before = snapshot(pg_url)
    with pytest.raises(ConfigError) as info:
        Store(pg_url)
    msg = str(info.value)
    assert "not an evalgate database" in msg and "invoices" in msg and "newer evalgate" not in msg
    assert snapshot(pg_url) == before


def test_missing_database_is_a_config_error(pg_server):
    url = pg_server.url("no_such_database")
    with pytest.raises(ConfigError) as info:
        Store(url)
    assert "does not exist" in str(info.value) and url in str(info.value)
    assert "createdb" in info.value.fix
    assert "not an evalgate database" not in str(info.value)
    assert db_query(pg_server.url("postgres"),
                    "select count(*) from pg_database where datname = 'no_such_database'") == [(0,)]


def test_unknown_role_is_a_config_error(pg_server):
    url = pg_server.url("postgres").replace("//evalgate@", "//nobody@")
    with pytest.raises(ConfigError) as info:
        Store(url)
    assert "refused the login" in str(info.value) and url in str(info.value)


def test_unreachable_server_is_an_infrastructure_error_without_the_password(pg_server):
    from pg import _free_port

    url = f"postgresql+psycopg://evalgate:s3cret-pw@127.0.0.1:{_free_port()}/evalgate"  # nothing listens
    with pytest.raises(StoreError) as info:
        Store(url)
    msg = str(info.value)
    assert info.value.exit_code == ExitCode.INFRA
    assert "could not use the database server" in msg and "127.0.0.1" in msg
    assert "s3cret-pw" not in msg and "evalgate:***@127.0.0.1" in msg


OPENER = r"""
import os, sys, time
sys.path[:0] = [sys.argv[3], os.path.dirname(sys.argv[3])]  # test_store, and the helpers it imports
from evalgate.store import Store
from evalgate.configuration.suite import load_suite
from test_store import PROMPT_IDS, fingerprint
url, suite_path, _, ready, go = sys.argv[1:6]
open(ready, "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
store = Store(url)
run_id = store.create_run(load_suite(suite_path), "baseline", {}, fingerprint(), PROMPT_IDS)
store.finish_run(run_id, status="complete", verdict="pass", exit_code=0, promote=True)
"""


def test_concurrent_first_opens_create_the_schema_once(pg_url, suite, tmp_path):
    """CI runners sharing one new database, starting at once: one creates the schema, the others wait for
    it (an advisory lock); then all of them store the same new fingerprint and promote the first baseline of
    the same suite and hardware at once (upserts): every run completes, one fingerprint, one pointer."""
    n = 5
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", OPENER, pg_url, str(suite.path), str(Path(__file__).parent),
                               str(tmp_path / f"ready{i}"), str(go)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(n)]
    try:
        deadline = time.monotonic() + 120
        while not all((tmp_path / f"ready{i}").exists() for i in range(n)) and time.monotonic() < deadline:
            time.sleep(0.05)
        go.touch()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * n, "\n".join(outputs)
    assert db_query(pg_url, "select version_num from alembic_version") == [(head_revision(),)]
    assert db_runs(pg_url) == [(i, "baseline", "complete", "pass") for i in range(1, n + 1)]
    assert db_query(pg_url, "select count(*) from fingerprints") == [(1,)]
    ((suite_name, run_id),) = db_baselines(pg_url)
    assert suite_name == "unit" and 1 <= run_id <= n


# --- values a server refuses and SQLite keeps (both backends) --------------------------------------------


def test_nul_characters_and_non_finite_floats_round_trip(db_url, suite):
    store = Store(db_url)
    run_id = store.create_run(suite, "check", {"concurrency": [1]}, fingerprint(), PROMPT_IDS)
    odd = completion("a", 0)
    odd.text = "nul\x00in the middle"
    odd.token_texts = ["nul\x00", "in", " the middle"]
    marked = completion("b", 0)
    marked.text = NUL_MARK + "starts with the escape marker \\u0000"  # must not be mistaken for an escape
    plain = completion("a", 1)
    store.add_outputs(run_id, [odd, marked, plain])
    verdicts = [{"key": "a", "verdict": "silent_regression",
                 "divergence": {"margin": float("nan"), "reference_logprob": float("-inf"),
                                "other_logprob": float("inf"), "reference_text": "\x00", "n": [1.5, None]}}]
    store.finish_run(run_id, status="complete", verdict="regression", exit_code=1, verdicts=verdicts,
                     summary={"silent_regression": 1})

    outputs = store.load(run_id).outputs
    assert outputs["a"][0].text == odd.text and outputs["a"][0].token_texts == odd.token_texts
    assert outputs["b"][0].text == marked.text
    assert outputs["a"][1].text == plain.text
    # plain text is stored as is, readable from SQL (output texts are inside their payloads)
    assert db_query(db_url, "select prompt from requests where run_id = :r and key = 'a'", r=run_id) == [("Hello",)]
    (got,) = store.verdicts(run_id)
    d = got["divergence"]
    assert math.isnan(d["margin"]) and d["reference_logprob"] == -math.inf and d["other_logprob"] == math.inf
    assert d["reference_text"] == "\x00" and d["n"] == [1.5, None]
    assert json.dumps(got, sort_keys=True) == json.dumps(verdicts[0], sort_keys=True)

    failed = new_run(store, suite, passes=0)
    store.mark_incomplete(failed, "failed", "engine said \x00 and died")
    run = store.get_run(failed)
    assert (run.status, run.error, run.exit_code) == ("failed", "engine said \x00 and died", 3)


def _suite_with(tmp_path, name: str, key: str):
    d = tmp_path / "long"
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text("{}")
    (d / "prompts.jsonl").write_text(json.dumps({"id": key, "prompt": "Hello"}) + "\n", encoding="utf-8")
    (d / "evalgate.toml").write_text(f'[suite]\nname = "{name}"\n[engine]\nmodel = "model"\n'
                                     '[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(d / "evalgate.toml")


@pytest.mark.parametrize("name, key", [("unit", "k" * 501), ("s" * 201, "a")], ids=["prompt-id", "suite-name"])
def test_values_longer_than_a_server_column_are_a_config_error(db_url, store_backend, tmp_path, name, key):
    """SQLite does not enforce varchar lengths (and keeps doing so); a server does: refused up front,
    naming the field, with nothing written."""
    store = Store(db_url)
    long_suite = _suite_with(tmp_path, name, key)
    if store_backend == "sqlite":
        store.create_run(long_suite, "check", {}, fingerprint(), {key: [1]})
        assert [r[0] for r in db_runs(db_url)] == [1]
        return
    with pytest.raises(ConfigError) as info:
        store.create_run(long_suite, "check", {}, fingerprint(), {key: [1]})
    assert info.value.exit_code == ExitCode.USAGE
    assert ("prompt id is 501 characters" if key != "a" else "[suite].name is 201 characters") in str(info.value)
    assert db_runs(db_url) == []
