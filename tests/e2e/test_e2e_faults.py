"""The fault matrix, each fault injected for real against the real CLI: a killed engine, SIGTERM, Ctrl-C,
a killed evalgate, two writers on one SQLite file, a full disk, a truncated database. Every one ends with
a clear message, the contract exit code, no verdict printed, and the previous baseline intact.

The engine process is killed with SIGKILL under the real vLLM CPU engine (only a real engine proves that
supervision); the other faults hit evalgate's own CLI, worker and store, and run on the fake test engine
(evalgate/engines/fake.py) with slow waves, so each one can land mid-run."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from helpers import write_suite

pytestmark = pytest.mark.e2e

PROMPTS = [f"Fault test prompt {i}: the river, the city and the number {i}" for i in range(48)]


def rows(db: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()  # (a `with` block would leave it open, and the tmpfs busy)


def wait_for_running_run(db: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        try:
            if rows(db, "select count(*) from runs where status = 'running'")[0][0]:
                time.sleep(1.5)  # let it get into its passes
                return
        except sqlite3.Error:
            pass
        time.sleep(0.3)
    raise AssertionError(f"no running run appeared (exit {proc.poll()})")


def engine_child(pid: int) -> int:
    """The spawned engine process of an evalgate CLI process."""
    for child in subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split():
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            return int(child)
    raise AssertionError("engine process not found")


def make_baseline(cli, tmp_path, model, kind: str):
    """A suite with a complete baseline (run 1); its checks run 48 waves of one request, on the fake engine a
    quarter of a second each (slow enough to be stopped mid-pass). The baseline runs without that delay: its
    rescoring is 48 more waves, and these tests stop only checks."""
    settings = dict(concurrency=(1,), shuffles=0, max_tokens=24, kind=kind, hot_pass=False)
    suite = write_suite(tmp_path / "ws", model, PROMPTS, **settings)
    cli("baseline", "create", suite, "--concurrency", "16", check=0)
    if kind == "fake":
        write_suite(tmp_path / "ws", model, PROMPTS, extra_engine="fake_seconds_per_wave = 0.25", **settings)
    db = tmp_path / "ws" / "evalgate.sqlite"
    assert rows(db, "select suite_name, run_id from baselines") == [("test", 1)]
    return suite, db


@pytest.fixture
def baselined(cli, tmp_path, tiny_model):
    """A baseline on the fake test engine, and the database's baseline pointer."""
    return make_baseline(cli, tmp_path, tiny_model, "fake")


@pytest.fixture
def vllm_baselined(cli, tmp_path, tiny_model):
    """A baseline on the real vLLM CPU engine."""
    return make_baseline(cli, tmp_path, tiny_model, "vllm")


def assert_baseline_intact(cli, suite, db):
    assert rows(db, "select run_id from baselines") == [(1,)]
    assert rows(db, "select status from runs where id = 1") == [("complete",)]
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    shown = cli("runs", "show", "1", "--suite", suite, "--json", check=0)
    assert '"status": "complete"' in shown.stdout


def test_engine_killed_mid_run(cli, vllm_baselined):
    suite, db = vllm_baselined
    # four repeats of the 48 waves: a pass of this tiny model takes under 2 s, so one alone could end before the
    # kill lands on a busy machine (the run finished and the check passed)
    longer = ("--repeats", "4")
    proc = cli.popen("check", suite, *longer)
    wait_for_running_run(db, proc)
    os.kill(engine_child(proc.pid), signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err[-3000:]
    assert "engine process died (killed by SIGKILL)" in err and "--resume continues it" in err
    assert "PASS" not in out and "FAIL" not in out  # no verdict printed
    assert rows(db, "select id, status from runs where id = 2") == [(2, "failed")]
    assert_baseline_intact(cli, suite, db)
    cli("baseline", "accept", "2", "--suite", suite, check=2)  # never promotable
    # the failed run goes on in a new engine (tests/e2e/test_e2e_resume.py compares a resumed run's outputs)
    resumed = cli("check", suite, "--resume", *longer)
    assert resumed.returncode in (0, 1), resumed.stderr[-3000:]
    assert rows(db, "select id, status from runs") == [(1, "complete"), (2, "complete")]


def test_sigterm_mid_run(cli, baselined):
    suite, db = baselined
    proc = cli.popen("check", suite)
    wait_for_running_run(db, proc)
    proc.send_signal(signal.SIGTERM)  # what a CI runner sends on cancel: to the evalgate process only
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err[-3000:]
    assert "interrupted" in err and "PASS" not in out and "FAIL" not in out
    assert rows(db, "select status from runs where id = 2") == [("interrupted",)]
    with pytest.raises(subprocess.CalledProcessError):  # the engine process is gone too
        subprocess.run(["pgrep", "-f", f"spawn_main.*{proc.pid}"], check=True, capture_output=True)
    assert_baseline_intact(cli, suite, db)


def test_ctrl_c_reaches_the_whole_process_group(cli, baselined):
    suite, db = baselined
    proc = cli.popen("check", suite, start_new_session=True)
    wait_for_running_run(db, proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err[-3000:]
    assert "interrupted" in err and "PASS" not in out and "FAIL" not in out
    assert rows(db, "select status from runs where id = 2") == [("interrupted",)]
    assert_baseline_intact(cli, suite, db)


def test_two_writers_on_one_sqlite_file(cli, tmp_path, tiny_model):
    suite = write_suite(tmp_path / "ws", tiny_model, PROMPTS[:24], concurrency=(1, 8), shuffles=0, kind="fake",
                        extra_engine="fake_seconds_per_wave = 0.05")
    first, second = cli.popen("baseline", "create", suite), cli.popen("baseline", "create", suite)
    results = [p.communicate(timeout=600) for p in (first, second)]
    # WAL + busy timeout + single-statement upserts: both complete, neither is refused
    assert [first.returncode, second.returncode] == [0, 0], results
    db = tmp_path / "ws" / "evalgate.sqlite"
    assert rows(db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(db, "select status from runs") == [("complete",), ("complete",)]
    # 24 requests x 3 passes (one hot) x 2 runs, and each baseline's rescoring of its own tokens (pass -1)
    assert rows(db, "select count(*) from outputs") == [(24 * 3 * 2 + 24 * 2,)]
    assert rows(db, "select count(*) from fingerprints") == [(1,)]  # the same identity, stored once
    assert len(rows(db, "select run_id from baselines")) == 1


def test_killed_evalgate_stops_its_engine_and_marks_the_run(cli, baselined):
    """SIGKILL to evalgate alone (the OOM killer's choice, say): the engine process gets SIGTERM from the
    kernel (parent-death signal), marks the run interrupted and exits; no engine is left running."""
    suite, db = baselined
    proc = cli.popen("check", suite)
    wait_for_running_run(db, proc)
    child = engine_child(proc.pid)
    proc.kill()
    proc.communicate(timeout=60)
    deadline = time.time() + 60
    while time.time() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists(), "the engine process outlived evalgate"
    assert rows(db, "select status from runs where id = 2") == [("interrupted",)]
    assert_baseline_intact(cli, suite, db)


def test_run_of_a_killed_process_group_is_shown_abandoned(cli, baselined):
    """SIGKILL to evalgate and its engine at once (a cancelled CI job, a killed container): nobody is left
    to mark the run, so it stays `running` in the database; `runs list` and `runs show` call it
    abandoned (its owner process is gone), and it can never become a baseline."""
    suite, db = baselined
    proc = cli.popen("check", suite, start_new_session=True)
    wait_for_running_run(db, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert rows(db, "select status from runs where id = 2") == [("running",)]
    owner = json.loads(rows(db, "select owner from runs where id = 2")[0][0])
    assert owner["pid"] == proc.pid and owner["host"] == socket.gethostname()
    listed = cli("runs", "list", "--suite", suite, check=0)
    assert "abandoned" in listed.stdout
    shown = cli("runs", "show", "2", "--suite", suite, "--json", check=0)
    assert json.loads(shown.stdout)["status"] == "abandoned"
    refused = cli("baseline", "accept", "2", "--suite", suite, check=2)
    assert "not complete" in refused.stderr
    assert_baseline_intact(cli, suite, db)


def test_a_live_running_run_is_not_abandoned(cli, baselined):
    suite, db = baselined
    proc = cli.popen("check", suite)
    try:
        wait_for_running_run(db, proc)
        shown = cli("runs", "show", "2", "--suite", suite, "--json", check=0)
        assert json.loads(shown.stdout)["status"] == "running"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=120)


@pytest.fixture
def small_filesystem(tmp_path):
    """A real, tiny filesystem (tmpfs) so the database runs out of space for real."""
    mountpoint = tmp_path / "small-fs"
    mountpoint.mkdir()

    def mount(size_bytes: int) -> Path:
        size_kib = -(-size_bytes // 4096) * 4
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(mountpoint)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs to simulate a full disk: {proc.stderr}")
            pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
        return mountpoint

    yield mount
    if subprocess.run(["umount", str(mountpoint)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True)


def test_disk_full_while_storing(cli, baselined, small_filesystem):
    suite, db = baselined
    rows(db, "PRAGMA wal_checkpoint(TRUNCATE)")
    # room for the database as it is plus a little: the next run's outputs cannot fit
    full_db = small_filesystem(db.stat().st_size + 64 * 1024) / "evalgate.sqlite"
    full_db.write_bytes(db.read_bytes())
    proc = cli("check", suite, "--db", full_db)
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "could not write to the database" in proc.stderr and "full" in proc.stderr
    assert "PASS" not in proc.stdout and "FAIL" not in proc.stdout
    # the previous baseline is still readable, from the full filesystem itself
    assert rows(full_db, "PRAGMA integrity_check") == [("ok",)]
    assert rows(full_db, "select run_id from baselines") == [(1,)]
    assert rows(full_db, "select status from runs where id = 1") == [("complete",)]
    assert rows(full_db, "select count(*) from outputs where run_id = 1 and pass_index >= 0") == [(len(PROMPTS),)]
    assert all(status != "complete" for (status,) in rows(full_db, "select status from runs where id != 1"))
    shown = cli("runs", "show", "1", "--db", full_db, "--json", check=0)
    assert '"status": "complete"' in shown.stdout


def test_truncated_database_is_refused_untouched(cli, baselined):
    suite, db = baselined
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    for companion in ("-wal", "-shm"):
        Path(f"{db}{companion}").unlink(missing_ok=True)
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    proc = cli("check", suite)
    # the file, not the engine: a usage error (exit 2) naming it, before any engine starts
    assert proc.returncode == 2, proc.stderr
    assert "not an evalgate database" in proc.stderr and str(db) in proc.stderr and "fix:" in proc.stderr
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
