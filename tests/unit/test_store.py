"""The store: migrations, refusing foreign or newer databases, run round trips, baselines.

Tests that take `db_url` run on SQLite and on PostgreSQL (the latter with EVALGATE_TEST_POSTGRES=1,
tests/pg.py); the rest are about SQLite files. PostgreSQL's own refusals: tests/unit/test_store_pg.py."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
from pathlib import Path

import pytest
from helpers import db_query, db_tables
from sqlalchemy import inspect

from evalgate.configuration.suite import load_suite
from evalgate.errors import ConfigError, ExitCode
from evalgate.fingerprint import COMPONENTS, component, fingerprint_hash
from evalgate.records import Completion
from evalgate.store import RunRecord, Store
from evalgate.store.db import head_revision

TABLES = {"alembic_version", "fingerprints", "runs", "requests", "outputs", "payloads", "verdicts", "baselines", "scores", "sample_scores",
          "cost_results", "bisect_sessions", "bisect_trials"}


# --- helpers ---------------------------------------------------------------------------------------------


def url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture
def suite(tmp_path):
    d = tmp_path / "suite"
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text("{}")
    (d / "prompts.jsonl").write_text(
        '{"id": "a", "prompt": "Hello"}\n{"id": "b", "prompt": "Grüße ✓", "max_tokens": 3}\n', encoding="utf-8")
    (d / "evalgate.toml").write_text(
        '[suite]\nname = "unit"\n[engine]\nmodel = "model"\n[sampling]\nmax_tokens = 4\n'
        '[prompts]\nfile = "prompts.jsonl"\n')
    return load_suite(d / "evalgate.toml")


def fingerprint(hardware: str = "cpu-a", **data) -> dict:
    return {name: component(data.get(name, {"hardware": hardware} if name == "hardware" else {"n": name}),
                            {"note": name}) for name in COMPONENTS}


PROMPT_IDS = {"a": [1, 15043], "b": [1, 2, 3, 2147483647]}


def completion(key: str, pass_index: int, *, ids=None, lps=None) -> Completion:
    ids = ids if ids is not None else [5, 6, 7]
    lps = lps if lps is not None else [-0.0, -5e-324, -1.2345678901234567][: len(ids)]
    return Completion(
        key=key, prompt_ids=PROMPT_IDS[key], output_ids=ids, logprobs=lps,
        top_ids=[[t, t + 1, t + 2][: 1 + i % 3] for i, t in enumerate(ids)],
        top_logprobs=[[lp, lp - 1.5, float("-inf")][: 1 + i % 3] for i, lp in enumerate(lps)],
        token_texts=[f"tok{t}é" for t in ids], text="".join(f"tok{t}é" for t in ids), finish_reason="length",
        pass_index=pass_index, concurrency=[1, 8][pass_index % 2], wave=pass_index, position=len(key),
    )


def new_run(store: Store, suite, *, fp=None, kind="baseline", passes=2) -> int:
    run_id = store.create_run(suite, kind, {"concurrency": [1, 8]}, fp or fingerprint(), PROMPT_IDS)
    for p in range(passes):
        store.add_outputs(run_id, [completion("a", p), completion("b", p)])
    return run_id


def bits(values) -> list[bytes]:
    return [struct.pack("<d", v) for v in values]


def tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("select name from sqlite_master where type = 'table'")}


# --- opening and migrations ------------------------------------------------------------------------------


def test_new_database_is_created_at_head(tmp_path):
    path = tmp_path / "nested" / "dir" / "e.sqlite"
    store = Store(url(path))
    assert path.is_file()
    assert tables(path) == TABLES
    with sqlite3.connect(path) as conn:
        assert conn.execute("select version_num from alembic_version").fetchall() == [(head_revision(),)]
        assert conn.execute("pragma journal_mode").fetchone() == ("wal",)
    with store.database.connect() as conn:
        assert conn.exec_driver_sql("pragma busy_timeout").scalar() == 60000
        assert conn.exec_driver_sql("pragma foreign_keys").scalar() == 1
    cols = {c["name"] for c in inspect(store.database).get_columns("outputs")}
    assert {"digest", "payload_hash"} <= cols and "output_ids" not in cols
    assert {c["name"] for c in inspect(store.database).get_columns("payloads")} == {"hash", "data"}


def test_second_open_is_a_no_op(db_url, tmp_path, monkeypatch, suite):
    store = Store(db_url)
    run_id = new_run(store, suite)
    store.database.dispose()

    import alembic.command

    def no_upgrade(*args, **kwargs):
        raise AssertionError("a database at head must not be migrated again")

    monkeypatch.setattr(alembic.command, "upgrade", no_upgrade)
    again = Store(db_url)
    assert again.get_run(run_id).status == "running"
    assert sorted(p.name for p in tmp_path.iterdir() if ".backup-" in p.name) == []
    assert db_tables(db_url) == TABLES


def test_empty_file_is_a_new_database(tmp_path):
    path = tmp_path / "e.sqlite"
    path.write_bytes(b"")
    Store(url(path))
    assert tables(path) == TABLES


@pytest.mark.parametrize("content", [
    os.urandom(4096),
    b"name,value\nfoo,1\nbar,2\n",
    "just some notes ✓\n".encode(),
    b"SQLite format 3\x00" + b"\xff" * 200,  # the right magic, then garbage
])
def test_not_sqlite_is_refused_and_left_untouched(tmp_path, content):
    path = tmp_path / "notes.sqlite"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        Store(url(path))
    assert "not an evalgate database" in str(info.value) and str(path) in str(info.value)
    assert info.value.exit_code == ExitCode.USAGE
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.sqlite"]


def test_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="not an evalgate database"):
        Store(url(tmp_path))


def test_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("create table users (id integer primary key, name text)")
        conn.execute("insert into users (name) values ('alice')")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        Store(url(path))
    msg = str(info.value)
    assert "not an evalgate database" in msg and "users" in msg and str(path) in msg
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.sqlite"]
    assert tables(path) == {"users"}


def test_newer_schema_is_refused_and_left_untouched(tmp_path):
    path = tmp_path / "e.sqlite"
    Store(url(path)).database.dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("update alembic_version set version_num = 'ffff9999'")
    conn.close()
    files_before = sorted(p.name for p in tmp_path.iterdir())
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        Store(url(path))
    msg = str(info.value)
    assert "newer evalgate" in msg and "ffff9999" in msg and head_revision() in msg and str(path) in msg
    assert path.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if ".backup-" in p.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before


def test_newer_schema_from_a_plain_sqlite_file_is_left_untouched(tmp_path):
    """Same refusal for a database that was never opened in WAL mode: opening must not convert it."""
    path = tmp_path / "e.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("create table alembic_version (version_num varchar(32) not null primary key)")
        conn.execute("insert into alembic_version values ('ffff9999')")
        conn.execute("create table runs (id integer primary key)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ConfigError, match="newer evalgate"):
        Store(url(path))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e.sqlite"]


def test_another_alembic_application_is_not_called_a_newer_evalgate(tmp_path):
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("create table alembic_version (version_num varchar(32) not null primary key)")
        conn.execute("insert into alembic_version values ('a1b2c3d4e5f6')")
        conn.execute("create table invoices (id integer primary key)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(ConfigError) as info:
        Store(url(path))
    msg = str(info.value)
    assert "not an evalgate database" in msg and "invoices" in msg and "newer evalgate" not in msg
    assert path.read_bytes() == before


def test_sqlite_file_is_backed_up_before_an_upgrade(tmp_path, monkeypatch, suite):
    """An older schema revision is copied to `<file>.backup-<rev>` before Alembic upgrades it."""
    import alembic.command

    from evalgate.store import db

    path = tmp_path / "e.sqlite"
    run_id = new_run(Store(url(path)), suite)
    calls = []

    def fake_upgrade(config, target):
        backup = tmp_path / "e.sqlite.backup-0000"
        assert backup.is_file(), "the backup must exist before the upgrade starts"
        with sqlite3.connect(backup) as conn:
            assert conn.execute("select id from runs").fetchall() == [(run_id,)]
        conn.close()
        calls.append(target)

    # pretend the file is at an older revision, both to the one-query version check and to Alembic's own
    monkeypatch.setattr(db, "schema_version", lambda engine: "0000")
    monkeypatch.setattr(db, "_identify", lambda *args: "0000")
    monkeypatch.setattr(alembic.command, "upgrade", fake_upgrade)
    Store(url(path))
    assert calls == ["head"]


# --- runs ------------------------------------------------------------------------------------------------


def test_run_round_trip_is_bit_exact(db_url, suite):
    store = Store(db_url)
    fp = fingerprint()
    run_id = new_run(store, suite, fp=fp)
    record = store.load(run_id)
    assert isinstance(record, RunRecord) and record.id == run_id
    assert record.run.status == "running" and record.run.kind == "baseline" and record.run.suite_name == "unit"
    assert record.run.fingerprint_hash == fingerprint_hash(fp)
    assert record.run.hardware_class == fp["hardware"]["hash"]
    assert record.fingerprint == fp
    assert list(record.requests) == ["a", "b"]  # prompts-file order
    b = record.requests["b"]
    assert b.request_hash == suite.request_hash(suite.prompts[1]) and b.prompt == "Grüße ✓"
    assert b.sampling["max_tokens"] == 3 and b.location.endswith("prompts.jsonl:2")
    for key in ("a", "b"):
        loaded = record.outputs[key]
        assert [c.pass_index for c in loaded] == [0, 1]
        for p, got in enumerate(loaded):
            want = completion(key, p)
            assert got.output_ids.tolist() == want.output_ids.tolist() and got.prompt_ids == PROMPT_IDS[key]
            assert bits(got.logprobs) == bits(want.logprobs)  # -0.0 and the subnormal survive
            assert got.top_rows()[0] == want.top_rows()[0]
            assert [bits(r) for r in got.top_rows()[1]] == [bits(r) for r in want.top_rows()[1]]
            assert got.token_texts == want.token_texts and got.text == want.text
            assert got.finish_reason == "length"
            assert (got.concurrency, got.wave, got.position) == (want.concurrency, want.wave, want.position)
            assert got.digest == want.digest


NAN_WITH_PAYLOAD = struct.unpack("<d", bytes.fromhex("010000000000f87f"))[0]


@pytest.mark.parametrize(("id_type", "float_type"), [("int64", "float32"), ("int32", "float64"), ("uint16", "float32")])
def test_payloads_of_both_versions_round_trip_bit_for_bit(db_url, suite, id_type, float_type):
    """Version 2 as written today and version 1 as every evalgate wrote it before (docs/storage.md), on this
    backend: every id and float type the engines hand over, ragged top-k, non-finite values, NUL and lone
    surrogates in texts, a text that is not the token texts joined."""
    import hashlib

    import numpy as np
    import sqlalchemy as sa

    tiny = -5e-324 if float_type == "float64" else -0.25  # a subnormal float64
    odd = [-0.0, float("-inf"), float("nan"), tiny, -1.5]
    ids = np.array([7, 65_535 if id_type == "uint16" else 70_000, 0, 3, 9], dtype=id_type)
    lps = np.array(odd, dtype=float_type)
    if float_type == "float64":
        lps[2] = NAN_WITH_PAYLOAD  # a NaN's payload bits too
    made = Completion(key="a", prompt_ids=PROMPT_IDS["a"], output_ids=ids, logprobs=lps,
                      top_ids=[[7, 1], [int(ids[1])], [], [3, 4, 5], [9]],
                      top_logprobs=[[-0.0, -1.0], [-2.0], [], [-1.5, -3.0, -4.0], [-0.25]],
                      token_texts=["a\x00", "\ud800", "é", "", "z" * 300], text="other\x00text", finish_reason="length")
    store = Store(db_url)
    run_id = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS)
    store.add_outputs(run_id, [made])
    got = store.load(run_id).outputs["a"][0]
    assert got.output_ids.tolist() == ids.tolist() and bits(got.logprobs) == bits(lps.astype(np.float64))
    assert got.top_rows()[0] == made.top_rows()[0]
    assert [bits(r) for r in got.top_rows()[1]] == [bits(r) for r in made.top_rows()[1]]
    assert (got.token_texts, got.text, got.digest) == (made.token_texts, made.text, made.digest)
    assert [got.token_text(i) for i in range(6)] == [*made.token_texts, None]
    assert [got.margin(i) for i in range(5)] == [made.margin(i) for i in range(5)]

    # a version 1 payload, as stored before version 2, read back from this backend
    v1 = bytes.fromhex("014866010102000000020000000200000002000000010002000100030002000000000000bf0000c0bf000000bf00"
                       "0000c00000c0bf00000000020001005b2261222c202262225d")
    v1_hash = hashlib.sha256(v1).hexdigest()
    with store.database.begin() as conn:
        conn.execute(sa.text("INSERT INTO payloads (hash, data) VALUES (:h, :d)"), {"h": v1_hash, "d": v1})
        conn.execute(sa.text("UPDATE outputs SET payload_hash = :h WHERE run_id = :r"), {"h": v1_hash, "r": run_id})
    old = store.load(run_id).outputs["a"][0]
    assert old.output_ids.tolist() == [1, 2] and old.logprobs.tolist() == [-0.5, -1.5]
    assert old.top_rows() == ([[1, 3], [2]], [[-0.5, -2.0], [-1.5]])
    assert (old.token_texts, old.text, old.token_text(1), old.margin(0)) == (["a", "b"], "ab", "b", 1.5)


def test_outputs_load_in_pass_order(db_url, suite):
    store = Store(db_url)
    run_id = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS)
    store.add_outputs(run_id, [completion("a", 2), completion("b", 2)])
    store.add_outputs(run_id, [completion("a", 0), completion("b", 0)])
    store.add_outputs(run_id, [completion("a", 1)])
    assert [c.pass_index for c in store.load(run_id).outputs["a"]] == [0, 1, 2]


def test_fingerprints_are_content_addressed(db_url, suite):
    store = Store(db_url)
    new_run(store, suite)
    new_run(store, suite)
    new_run(store, suite, fp=fingerprint(env={"OMP_NUM_THREADS": "4"}))
    assert db_query(db_url, "select count(*) from fingerprints") == [(2,)]


def test_finish_run_stores_verdicts_and_summary(db_url, suite):
    store = Store(db_url)
    run_id = new_run(store, suite, kind="check")
    verdicts = [{"key": "b", "verdict": "silent_regression", "divergence": {"position": 1}}]
    store.finish_run(run_id, status="complete", verdict="regression", exit_code=1, summary={"stable": 1},
                     verdicts=verdicts, schedule={"timings": {"inference": 1.5}}, baseline_run_id=None)
    run = store.get_run(run_id)
    assert (run.status, run.verdict, run.exit_code, run.summary) == ("complete", "regression", 1, {"stable": 1})
    assert run.schedule == {"timings": {"inference": 1.5}} and run.finished_at is not None
    assert store.verdicts(run_id) == verdicts


def test_unknown_run_is_a_config_error(db_url):
    store = Store(db_url)
    with pytest.raises(ConfigError, match="run 42 does not exist"):
        store.load(42)
    with pytest.raises(ConfigError, match="run 42 does not exist"):
        store.promote(42)


# --- baselines -------------------------------------------------------------------------------------------


def test_finishing_with_promote_moves_the_pointer(db_url, suite):
    store = Store(db_url)
    first = new_run(store, suite)
    assert store.baseline_for("unit", fingerprint()["hardware"]["hash"]) is None
    store.finish_run(first, status="complete", verdict="pass", exit_code=0, promote=True)
    hw = fingerprint()["hardware"]["hash"]
    assert store.baseline_for("unit", hw) == first
    second = new_run(store, suite)
    store.finish_run(second, status="complete", verdict="pass", exit_code=0, promote=True)
    assert store.baseline_for("unit", hw) == second
    assert [(b.suite_name, b.run_id) for b in store.baselines()] == [("unit", second)]


@pytest.mark.parametrize("status", ["running", "failed", "interrupted"])
def test_promote_refuses_incomplete_runs_and_keeps_the_pointer(db_url, suite, status):
    store = Store(db_url)
    hw = fingerprint()["hardware"]["hash"]
    good = new_run(store, suite)
    store.finish_run(good, status="complete", exit_code=0, promote=True)
    bad = new_run(store, suite)
    if status != "running":
        store.mark_incomplete(bad, status, "boom")
    assert store.get_run(bad).status == status
    with pytest.raises(ConfigError, match=f"run {bad} is {status}, not complete"):
        store.promote(bad)
    assert store.baseline_for("unit", hw) == good
    # Finishing a run as not complete while asking to promote it is refused as a whole.
    with pytest.raises(ConfigError):
        store.finish_run(bad, status="failed", exit_code=3, promote=True)
    assert store.baseline_for("unit", hw) == good
    assert store.get_run(bad).status == status  # the refused transaction changed nothing


def test_promote_complete_run_later(db_url, suite):
    store = Store(db_url)
    run_id = new_run(store, suite, kind="check")
    store.finish_run(run_id, status="complete", exit_code=1)
    assert store.baseline_for("unit", fingerprint()["hardware"]["hash"]) is None
    assert store.promote(run_id).id == run_id
    assert store.baseline_for("unit", fingerprint()["hardware"]["hash"]) == run_id


def test_baselines_are_per_suite_and_hardware_class(db_url, suite):
    store = Store(db_url)
    on_a = new_run(store, suite, fp=fingerprint("cpu-a"))
    on_b = new_run(store, suite, fp=fingerprint("gpu-b"))
    for run_id in (on_a, on_b):
        store.finish_run(run_id, status="complete", exit_code=0, promote=True)
    hw_a, hw_b = fingerprint("cpu-a")["hardware"]["hash"], fingerprint("gpu-b")["hardware"]["hash"]
    assert hw_a != hw_b
    assert store.baseline_for("unit", hw_a) == on_a
    assert store.baseline_for("unit", hw_b) == on_b
    assert store.baseline_for("other-suite", hw_a) is None
    # A different env does not make a different hardware class.
    on_a2 = new_run(store, suite, fp=fingerprint("cpu-a", env={"OMP_NUM_THREADS": "8"}))
    store.finish_run(on_a2, status="complete", exit_code=0, promote=True)
    assert store.baseline_for("unit", hw_a) == on_a2 and store.baseline_for("unit", hw_b) == on_b
    assert len(store.baselines("unit")) == 2


def test_runs_listing(db_url, suite):
    store = Store(db_url)
    ids = [new_run(store, suite, passes=0) for _ in range(3)]
    assert [r.id for r in store.runs()] == ids[::-1]
    assert [r.id for r in store.runs("unit", limit=2)] == ids[:0:-1]
    assert store.runs("nope") == []


def test_store_survives_json_content(db_url, suite):
    """Fingerprint data with nested, non-ASCII content comes back equal."""
    store = Store(db_url)
    fp = fingerprint(env={"VLLM_X": "ü ✓", "nested": {"list": [1, 2.5, None, True]}})
    record = store.load(new_run(store, suite, fp=fp, passes=0))
    assert json.dumps(record.fingerprint, sort_keys=True) == json.dumps(fp, sort_keys=True)


def test_only_baseline_and_check_runs_can_become_baselines(db_url, suite):
    """`evalgate cost` stores its measurement runs as kind `cost`: complete, but never a baseline."""
    store = Store(db_url)
    run_id = new_run(store, suite, kind="cost")
    store.finish_run(run_id, status="complete", verdict="variant", exit_code=0, summary={})
    with pytest.raises(ConfigError, match="`cost` run"):
        store.promote(run_id)
    assert store.baseline_for(suite.name, fingerprint()["hardware"]["hash"]) is None
    assert [r.id for r in store.runs(suite.name, kinds=("baseline", "check"))] == []


def test_a_running_run_whose_owner_is_gone_is_abandoned(db_url, suite):
    """The owner is host + pid + start time: a dead pid, a reused pid (other start time) and a live owner;
    an owner on another host cannot be judged from here and keeps its stored status."""
    import socket
    import subprocess

    from evalgate.owners import current_owner
    from evalgate.store import display_status

    store = Store(db_url)
    gone = subprocess.Popen(["sleep", "0"])
    gone.wait()
    here = socket.gethostname()
    owners = {
        "dead": {"host": here, "pid": gone.pid, "started": 1.0},
        "reused": {**current_owner(), "started": current_owner()["started"] - 3600},
        "live": current_owner(),
        "elsewhere": {"host": here + "-other", "pid": 1, "started": 1.0},
        "none": None,
    }
    ids = {name: store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS, owner=owner)
           for name, owner in owners.items()}
    shown = {name: display_status(store.get_run(run_id)) for name, run_id in ids.items()}
    assert shown == {"dead": "abandoned", "reused": "abandoned", "live": "running", "elsewhere": "running",
                     "none": "running"}
    store.finish_run(ids["dead"], status="interrupted", error="x")
    assert display_status(store.get_run(ids["dead"])) == "interrupted"  # only `running` can be abandoned
    with pytest.raises(ConfigError, match="not complete"):
        store.promote(ids["reused"])


def test_a_pass_is_read_back_a_window_at_a_time(db_url, suite, monkeypatch):
    from evalgate.store import loaded

    monkeypatch.setattr(loaded, "CHUNK", 1)  # one request a window: every lookup past the window reads anew
    store = Store(db_url)
    run_id = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS)
    store.add_outputs(run_id, [completion("b", 0, ids=[9, 8]), completion("a", 0)])
    store.add_outputs(run_id, [completion("a", 1, ids=[4])])
    first = store.pass_outputs(run_id, 0, ["a", "b"])
    assert list(first) == ["a", "b"] and len(first) == 2 and "b" in first and "c" not in first
    assert [c.output_ids.tolist() for c in first.values()] == [[5, 6, 7], [9, 8]]
    assert bits(first["a"].logprobs) == bits([-0.0, -5e-324, -1.2345678901234567])
    assert list(first._window) == ["a"]  # what it holds: the window of the last lookup, never the pass
    with pytest.raises(KeyError):
        first["c"]
    assert dict(store.pass_outputs(run_id, 1, ["a", "b"])).keys() == {"a"}


def test_what_a_resume_reads_of_an_unfinished_run(db_url, suite):
    store = Store(db_url)
    run_id = store.create_run(suite, "check", {}, fingerprint(), PROMPT_IDS, shard="1/2", shard_group="g")
    rescored = completion("a", -1)
    store.add_outputs(run_id, [completion("a", 0), completion("b", 0), completion("a", 1), rescored])
    assert store.stored_waves(run_id) == {0: {0}, 1: {1}}  # pass -> its waves (completion(): wave = pass index)
    assert store.rescored_keys(run_id) == {-1: {"a"}}
    store.delete_outputs(run_id, 1)
    assert store.stored_waves(run_id) == {0: {0}}
    assert [r.id for r in store.unfinished_runs("unit", "check", "1/2", "g")] == [run_id]
    assert store.unfinished_runs("unit", "check", None, "g") == store.unfinished_runs("unit", "baseline", "1/2", "g") == []
    store.mark_incomplete(run_id, "failed", "engine died")
    store.reopen_run(run_id, owner={"host": "h", "pid": 1}, engine_log=None)
    run = store.get_run(run_id)
    assert (run.status, run.error, run.exit_code, run.finished_at, run.owner["pid"]) == ("running", None, None, None, 1)
    store.finish_run(run_id, status="complete")
    assert store.unfinished_runs("unit", "check", "1/2", "g") == []
