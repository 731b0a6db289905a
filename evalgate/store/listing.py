"""The runs and baselines tables as plain rows (`evalgate runs list`, `runs history`, `baseline list`, their
`--json`).

A listing is one SELECT of a few columns, so its cost is the imports around it: the ORM models and
Alembic are never imported here. A database at the newest schema is read with SQLAlchemy Core; a SQLite
file with Python's own sqlite3 (the driver SQLAlchemy itself uses), because importing SQLAlchemy takes
longer than the listing (0.12 s of 0.33 s on an Intel Xeon, benchmarks/cli_start.py). Both run the same
SQL text. A database behind the newest schema, or not an evalgate one, is opened as every command opens it
(migrated, or refused with the reason) before it is listed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime

from ..errors import ConfigError
from .location import BUSY_TIMEOUT_MS, SCHEMA_HEAD, sqlite_path

RUNS_SQL = ("SELECT runs.id, runs.suite_name, runs.kind, runs.status, runs.verdict, runs.summary, runs.started_at, "
            "runs.finished_at, runs.hardware_class, runs.owner, "
            "EXISTS (SELECT 1 FROM baselines WHERE baselines.run_id = runs.id) FROM runs {where}"
            "ORDER BY runs.id DESC LIMIT :limit")
HISTORY_SQL = ("SELECT runs.id, runs.kind, runs.verdict, runs.summary, runs.finished_at, runs.hardware_class, "
               "runs.baseline_run_id, runs.report FROM runs WHERE runs.suite_name = :suite AND runs.status = 'complete' "
               "AND runs.kind IN ('baseline', 'check') ORDER BY runs.id DESC LIMIT :limit")
BASELINES_SQL = ("SELECT baselines.suite_name, baselines.hardware_class, baselines.run_id, baselines.promoted_at, "
                 "baselines.receipt, fingerprints.components FROM baselines JOIN runs ON runs.id = baselines.run_id "
                 "LEFT JOIN fingerprints ON fingerprints.hash = runs.fingerprint_hash {where}"
                 "ORDER BY baselines.suite_name, baselines.hardware_class")


def run_rows(url: str, suite_name: str | None = None, limit: int = 50) -> list[dict]:
    """The newest `limit` runs (of one suite), newest first: run, suite, kind, status (as shown), verdict,
    counts, started, finished, hardware class, and whether the run is a current baseline."""
    where = "WHERE runs.suite_name = :suite " if suite_name else ""
    rows = _select(url, RUNS_SQL.format(where=where), {"suite": suite_name, "limit": limit})
    return [{"run": run_id, "suite": suite, "kind": kind, "status": shown_status(status, _json(owner)),
             "verdict": verdict, "counts": {k: v for k, v in (_json(summary) or {}).items() if v},
             "started": when(started), "finished": when(finished), "hardware_class": hardware_class,
             "baseline": bool(is_baseline)}
            for run_id, suite, kind, status, verdict, summary, started, finished, hardware_class, owner, is_baseline in rows]


@dataclass(frozen=True)
class ReportHeader:
    """A judged run at a glance, from the few columns and the stored report's header keys (the Report's
    kind, status, counts, changed components and metrics; judgement/report.py): what `runs history` lists and
    the HTML report's history strip draws. `changed` and `metrics` are None for a run whose report was never
    stored (judged before reports were, and not read since)."""

    run: int
    finished: str | None
    kind: str
    verdict: str | None
    counts: dict[str, int]
    baseline_run: int | None
    hardware_class: str | None
    changed: list[str] | None
    metrics: list[dict] | None  # {task, metric, current, delta}

    @classmethod
    def of(cls, run_id, kind, verdict, summary, finished, hardware_class, baseline_run, report) -> ReportHeader:
        return cls(run_id, when(finished), kind, verdict, {k: v for k, v in (_json(summary) or {}).items() if v},
                   baseline_run, hardware_class,
                   list(report.get("changed_components") or []) if report is not None else None,
                   [{key: m.get(key) for key in ("task", "metric", "current", "delta")} for m in report.get("metrics") or []]
                   if report is not None else None)

    def to_dict(self) -> dict:
        return asdict(self)


def history_rows(url: str, suite_name: str, limit: int = 20) -> list[ReportHeader]:
    """A suite's judged runs at a glance, newest first (`ReportHeader`)."""
    return [ReportHeader.of(run_id, kind, verdict, summary, finished, hardware_class, baseline_run, _json(report))
            for run_id, kind, verdict, summary, finished, hardware_class, baseline_run, report in _select(
                url, HISTORY_SQL, {"suite": suite_name, "limit": limit})]


def baseline_rows(url: str, suite_name: str | None = None) -> list[dict]:
    """The current baseline of each suite and hardware class: suite, class, its label, run, when promoted,
    and how it became the baseline (`receipt`: adopted by proof from another class; None: recorded here)."""
    from ..fingerprint import hardware_label

    where = "WHERE baselines.suite_name = :suite " if suite_name else ""
    found = []
    for suite, hardware_class, run_id, promoted, receipt, components in _select(
            url, BASELINES_SQL.format(where=where), {"suite": suite_name}):
        receipt = _json(receipt)
        found.append({"suite": suite, "hardware_class": hardware_class,
                      "hardware": hardware_label((_json(components) or {}).get("hardware") or {}), "run": run_id,
                      "promoted": when(promoted), "receipt": receipt, "lineage": lineage(receipt)})
    return found


def shown_status(status: str, owner: dict | None) -> str:
    """A run's status for people: `abandoned` for a `running` run whose owner process is gone."""
    if status == "running":
        from ..owners import owner_alive

        if owner_alive(owner) is False:
            return "abandoned"
    return status


def display_status(run) -> str:
    """A stored run's status for people (`shown_status` of its row)."""
    return shown_status(run.status, run.owner)


def lineage(receipt: dict | None) -> str:
    """`adopted from run 3 (AMD EPYC ...): 20 of 24 identical, drift 4, ...`: a baseline's proof, or `recorded here`."""
    if not receipt:
        return "recorded on this class"
    counts = receipt["counts"]
    env = receipt.get("envelope") or {}
    envelope = f"; envelope max {env['max']:.3g}" if env.get("max") is not None else ""
    return (f"adopted from run {receipt['adopted_from']} ({receipt['from_label']}): {counts['identical']} of "
            f"{receipt['compared']} identical, drift {counts['drift']}, near ties {counts['near_tie']}{envelope}")


def when(moment) -> str | None:
    """A timestamp as `YYYY-MM-DD HH:MM:SS` (SQLite hands over the stored text, a server a datetime)."""
    if not moment:
        return None
    return moment.strftime("%Y-%m-%d %H:%M:%S") if isinstance(moment, datetime) else str(moment)[:19]


def _json(value):
    """A JSON column's value: sqlite3 hands over the stored text (json.dumps, as SQLAlchemy wrote it), the
    engine of a server the value (read with its json_deserializer)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _select(url: str, sql: str, params: dict) -> list[tuple]:
    path = sqlite_path(url)
    if path is not None and not path.exists():
        raise ConfigError(f"no evalgate database at {path}",
                          fix="pass --db or --suite naming an existing database (see `evalgate baseline create`)")
    if path is not None and not path.is_dir():
        rows = _sqlite_select(path, sql, params)
        if rows is not None:
            return rows
    return _core_select(url, sql, params)


def _sqlite_select(path, sql: str, params: dict) -> list[tuple] | None:
    """The rows, read-only through sqlite3; None when the file is not an evalgate database at the newest
    schema (then it is opened as every command opens it)."""
    import sqlite3

    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    except sqlite3.Error:
        return None
    try:
        if conn.execute("SELECT version_num FROM alembic_version").fetchall() != [(SCHEMA_HEAD,)]:
            return None
        return conn.execute(sql, params).fetchall()
    except sqlite3.Error:
        return None
    finally:
        conn.close()


def _core_select(url: str, sql: str, params: dict) -> list[tuple]:
    """The rows through SQLAlchemy Core, on a database at the newest schema (opened first if it is not)."""
    import sqlalchemy as sa

    from .db import make_engine, migrate

    engine = make_engine(url)
    migrate(engine, url)  # as every command opens it: migrated, or refused with the reason
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.text(sql), params)]
