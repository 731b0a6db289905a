"""`evalgate runs list` and `baseline list` (evalgate/store/listing.py): the rows, their `--json` equal to
the table cell for cell, on both backends, and a listing that imports neither the ORM nor Alembic (nor, for
a SQLite file, SQLAlchemy at all)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest
from test_store import PROMPT_IDS, fingerprint, suite  # noqa: F401 (the suite fixture)

from evalgate.store import Store

RUNS_COLUMNS = ["run", "suite", "kind", "status", "verdict", "counts", "started", "baseline"]
BASELINE_COLUMNS = ["suite", "hardware class", "hardware", "run", "promoted", "lineage"]
RECEIPT = {"adopted_from": 1, "from_label": "AMD EPYC 9B14 (avx512f)", "compared": 4,
           "counts": {"identical": 3, "drift": 1, "near_tie": 0, "confident": 0}, "envelope": {"max": 2.5e-05}}


@pytest.fixture
def listed(db_url, suite):  # noqa: F811
    """A store with a baseline, an adopted baseline on another class, a check and an abandoned run."""
    store = Store(db_url)
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    ids = []
    for kind, hardware, status, owner in (("baseline", "cpu-a", "complete", None), ("check", "cpu-b", "complete", None),
                                          ("check", "cpu-a", "complete", None),
                                          ("check", "cpu-a", "running", {"host": socket.gethostname(), "pid": gone.pid, "started": 1.0})):
        run_id = store.create_run(suite, kind, {}, fingerprint(hardware), PROMPT_IDS, owner=owner)
        if status == "complete":
            store.finish_run(run_id, status="complete", verdict="pass", exit_code=0,
                             summary={"stable": 2, "batch_variance": 0}, promote=kind == "baseline")
        ids.append(run_id)
    store.promote(ids[1])
    with store.database.begin() as conn:
        conn.exec_driver_sql(f"UPDATE baselines SET receipt = '{json.dumps(RECEIPT)}' WHERE run_id = {ids[1]}")
    store.database.dispose()
    return db_url, ids


def test_runs_are_listed_newest_first_with_their_shown_status(listed):
    from evalgate.store.listing import run_rows

    url, ids = listed
    rows = run_rows(url)
    assert [r["run"] for r in rows] == ids[::-1]
    assert [r["status"] for r in rows] == ["abandoned", "complete", "complete", "complete"]
    assert [r["baseline"] for r in rows] == [False, False, True, True]
    assert rows[-1]["counts"] == {"stable": 2} and rows[-1]["kind"] == "baseline" and rows[0]["verdict"] is None
    assert [r["run"] for r in run_rows(url, "unit", 2)] == ids[:1:-1] and run_rows(url, "other") == []


def test_baselines_are_listed_with_their_lineage(listed):
    from evalgate.store.listing import baseline_rows

    url, ids = listed
    rows = baseline_rows(url)
    assert sorted((r["run"], r["receipt"]) for r in rows if r["receipt"] is None) == [(ids[0], None)]
    assert [(r["run"], r["receipt"]) for r in rows if r["receipt"]] == [(ids[1], RECEIPT)]
    assert [r["hardware_class"] for r in rows] == sorted(r["hardware_class"] for r in rows)
    adopted = next(r for r in rows if r["receipt"])
    assert adopted["lineage"] == ("adopted from run 1 (AMD EPYC 9B14 (avx512f)): 3 of 4 identical, drift 1, near ties 0; "
                                  "envelope max 2.5e-05")
    assert next(r for r in rows if not r["receipt"])["lineage"] == "recorded on this class"


def plain_table(text: str, columns: list[str]) -> list[dict]:
    """The cells of a plain table (columns two spaces apart, as wide as their widest cell)."""
    lines = text.rstrip("\n").split("\n")
    starts, at = [], 0
    for name in columns:  # each header after the one before it ("hardware" after "hardware class")
        starts.append(lines[0].index(name, at))
        at = starts[-1] + len(name)
    return [{name: line[start:end].strip() for name, start, end in zip(columns, starts, [*starts[1:], None])}
            for line in lines[1:]]


def test_json_of_both_lists_matches_their_table(listed, inline_cli):
    url, ids = listed
    table = plain_table(inline_cli("runs", "list", "--db", url, check=0).stdout, RUNS_COLUMNS)
    rows = json.loads(inline_cli("runs", "list", "--db", url, "--json", check=0).stdout)
    assert len(table) == len(rows) == 4
    for cells, row in zip(table, rows):
        assert cells == {"run": str(row["run"]), "suite": row["suite"], "kind": row["kind"], "status": row["status"],
                         "verdict": row["verdict"] or "", "counts": ", ".join(f"{k} {v}" for k, v in row["counts"].items()),
                         "started": row["started"], "baseline": "yes" if row["baseline"] else ""}
    table = plain_table(inline_cli("baseline", "list", "--db", url, check=0).stdout, BASELINE_COLUMNS)
    rows = json.loads(inline_cli("baseline", "list", "--db", url, "--json", check=0).stdout)
    assert len(table) == len(rows) == 2
    for cells, row in zip(table, rows):
        assert cells == {"suite": row["suite"], "hardware class": row["hardware_class"][:12], "hardware": row["hardware"],
                         "run": str(row["run"]), "promoted": row["promoted"], "lineage": row["lineage"]}


PROBE = """
import json, sys
from evalgate.cli import app
try:
    app(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "loaded": [m for m in ("sqlalchemy", "sqlalchemy.orm", "alembic", "evalgate.store.models")
                                         if m in sys.modules]}))
"""


@pytest.mark.parametrize("command", [["runs", "list"], ["runs", "list", "--json"], ["baseline", "list", "--json"]])
def test_a_listing_imports_no_orm(listed, cli_env, command):
    """A fresh interpreter is the only place an import can be seen. SQLite: not even SQLAlchemy."""
    url, _ = listed
    done = subprocess.run([sys.executable, "-c", PROBE, *command, "--db", url], env=cli_env, capture_output=True,
                          text=True, timeout=120)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["code"] == 0, done.stderr
    assert got["loaded"] == ([] if url.startswith("sqlite") else ["sqlalchemy"])
