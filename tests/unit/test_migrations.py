"""Migrations: the ORM models and the Alembic history agree, and an older database upgrades in place
after a backup copy, keeping its data."""

from __future__ import annotations

import sqlite3

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from evalgate.store import open_store
from evalgate.store.db import _alembic_config, head_revision
from evalgate.store.models import Base


def test_models_match_the_migrations(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'x.sqlite'}")
    with store.database.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_older_schema_upgrades_after_a_backup(tmp_path):
    db = tmp_path / "old.sqlite"
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
        conn.exec_driver_sql("insert into runs (suite_name, suite_path, kind, status, schedule, started_at) "
                             "values ('s', '/s.toml', 'baseline', 'complete', '{}', '2026-01-01 00:00:00')")
    engine.dispose()

    store = open_store(f"sqlite:///{db}")
    with store.database.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head_revision() != "0001"
    assert [r.suite_name for r in store.runs()] == ["s"]  # data kept
    backup = tmp_path / "old.sqlite.backup-0001"
    with sqlite3.connect(backup) as conn:  # the backup is the old schema with the old data
        assert conn.execute("select version_num from alembic_version").fetchone() == ("0001",)
        assert conn.execute("select suite_name from runs").fetchall() == [("s",)]
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}
        assert "scores" not in tables


def test_the_head_a_store_is_opened_at_without_alembic_is_alembics_head():
    """store/db.py opens a database at SCHEMA_HEAD with one query: a new migration must move it."""
    from evalgate.store.db import SCHEMA_HEAD

    assert SCHEMA_HEAD == head_revision()


def test_0013_moves_each_stored_report_into_its_own_column_and_back(tmp_path):
    """A report kept in `runs.schedule["report"]` (0012) moves to `runs.report` whole, the schedule keeps the rest;
    a run with no report (judged before reports were stored) keeps NULL; the downgrade puts it back."""
    import json

    db = tmp_path / "old.sqlite"
    engine = create_engine(f"sqlite:///{db}")
    report = {"schema": "evalgate.report/1", "kind": "check", "counts": {"stable": 3}, "metrics": [{"task": "t"}]}
    schedules = [{"timings": {"inference": 1.5}, "report": report}, {"judged": {"factors": []}}]
    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0012")
        for schedule in schedules:
            conn.exec_driver_sql("insert into runs (suite_name, suite_path, kind, status, schedule, started_at) "
                                 "values ('s', '/s.toml', 'check', 'complete', ?, '2026-01-01 00:00:00')",
                                 (json.dumps(schedule),))
        command.upgrade(_alembic_config(conn), "0013")
        rows = [(json.loads(s), r and json.loads(r)) for s, r in conn.exec_driver_sql(
            "select schedule, report from runs order by id")]
        assert rows == [({"timings": {"inference": 1.5}}, report), ({"judged": {"factors": []}}, None)]
        command.downgrade(_alembic_config(conn), "0012")
        assert [json.loads(s) for (s,) in conn.exec_driver_sql("select schedule from runs order by id")] == schedules
    engine.dispose()
