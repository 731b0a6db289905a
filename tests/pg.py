"""A throwaway PostgreSQL server for the tests (pytest plugin, loaded by conftest's `pytest_plugins`).

Off unless `EVALGATE_TEST_POSTGRES=1`: then one server is started per test session from Debian's
`postgresql` binaries (/usr/lib/postgresql/<version>/bin), in a temporary directory, listening on
127.0.0.1 on a free port with trust authentication, and it is always stopped (and its directory removed)
when the session ends. Each test that asks gets a fresh, empty database.

Without the variable, PostgreSQL-only tests are skipped with the reason. In CI (`CI=true`) with the
variable set, missing binaries or a missing driver fail those tests instead: a CI that asked for
PostgreSQL must not pass by skipping it.

PostgreSQL refuses to run as root: as root, initdb and the server run as the `postgres` user (created by
the Debian package) through `runuser`, in a directory that user owns. A watchdog process stops the server
even if the test process is killed. EVALGATE_TEST_PG_BINDIR points at another installation's binaries.

Fixtures: `pg_server` (session; `.create_database(hint)` returns a fresh database's SQLAlchemy URL,
`.url(name)`), `pg_url` (a fresh database for one test). conftest.py builds the backend-parametrized
`store_url` / `db_url` fixtures on these.
"""

from __future__ import annotations

import atexit
import glob
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

ENV_FLAG = "EVALGATE_TEST_POSTGRES"
ENV_BINDIR = "EVALGATE_TEST_PG_BINDIR"  # optional: the directory with initdb, pg_ctl and postgres
PG_USER = "evalgate"  # the server's superuser, trust auth on loopback only
INSTALL_HINT = "apt-get install -y postgresql (Debian/Ubuntu), then set EVALGATE_TEST_POSTGRES=1"


def postgres_enabled() -> bool:
    return os.environ.get(ENV_FLAG, "").strip().lower() in ("1", "true", "yes", "on")


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def find_bindir() -> Path | None:
    """$EVALGATE_TEST_PG_BINDIR if set (and nothing else); else the newest Debian PostgreSQL bindir with
    initdb, pg_ctl and postgres; else the one of initdb on PATH."""

    def version(p: str) -> tuple:
        return tuple(int(x) for x in re.findall(r"\d+", Path(p).parent.parent.name)) or (0,)

    if os.environ.get(ENV_BINDIR):
        candidates = [str(Path(os.environ[ENV_BINDIR]) / "initdb")]
    else:
        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=version, reverse=True)
        on_path = shutil.which("initdb")
        if on_path:
            candidates.append(str(Path(on_path).resolve()))
    for initdb in candidates:
        bindir = Path(initdb).parent
        if all(os.access(bindir / tool, os.X_OK) for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


# Stops the server when the test session's process ends however it ends (SIGTERM, SIGKILL, a crash): it
# waits for EOF on a pipe only that process holds, then stops the server (if still up) and removes its files.
WATCHDOG = r"""
import os, shutil, subprocess, sys
stop, root = sys.argv[1:-1], sys.argv[-1]
sys.stdin.buffer.read()
if os.path.exists(os.path.join(root, "data", "postmaster.pid")):
    subprocess.run(stop, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
shutil.rmtree(root, ignore_errors=True)
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One initdb'd cluster in a temporary directory, run by `postgres` when we are root."""

    def __init__(self, bindir: Path):
        self.bindir = bindir
        self.as_root = os.geteuid() == 0
        # As root the directory must be reachable by `postgres`: /tmp is, a private TMPDIR may not be.
        self.root = Path(tempfile.mkdtemp(prefix="evalgate-pg-", dir="/tmp" if self.as_root else None))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port: int | None = None
        self._counter = 0
        self._lock = threading.Lock()
        self._running = False
        self._watchdog: subprocess.Popen | None = None
        if self.as_root:
            import pwd

            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, but there is no `postgres` user to run the server as "
                                   f"({INSTALL_HINT})") from None
            os.chown(self.root, pw.pw_uid, pw.pw_gid)

    def _cmd(self, *args: str) -> list[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        return ["runuser", "-u", "postgres", "--", *cmd] if self.as_root else cmd

    def _run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=self.root,
                              env={**os.environ, "LC_ALL": "C", "LANG": "C"})

    def _check(self, proc: subprocess.CompletedProcess, what: str) -> None:
        if proc.returncode != 0:
            log = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"PostgreSQL {what} failed (exit {proc.returncode})\n{proc.stdout[-3000:]}\n"
                               f"{proc.stderr[-3000:]}\n--- server log\n{log}")

    def start(self) -> None:
        stop = self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop")
        self._watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, *stop, str(self.root)],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)
        self._check(self._run("initdb", "-D", str(self.data), "-U", PG_USER, "--auth=trust", "--encoding=UTF8",
                              "--locale=C", "--no-sync"), "initdb")
        last = None
        for _ in range(5):  # the free port can be taken between picking it and the server binding it
            self.port = _free_port()
            options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                       "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300")
            last = self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t", "60",
                             "start")
            if last.returncode == 0:
                self._running = True
                return
            if "already in use" not in self.log.read_text(errors="replace"):
                break
        self._check(last, "server start")

    def stop(self) -> None:
        """Idempotent; always removes the directory."""
        with self._lock:
            if self._running:
                self._running = False
                proc = self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")
                if proc.returncode != 0:
                    self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
            shutil.rmtree(self.root, ignore_errors=True)
            if self._watchdog is not None:
                self._watchdog.stdin.close()  # nothing left for it to do: it exits
                try:
                    self._watchdog.wait(30)
                except subprocess.TimeoutExpired:
                    pass
                self._watchdog = None

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, hint: str = "db") -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        with self._lock:
            self._counter += 1
            name = f"t{self._counter:04d}_{re.sub(r'[^a-z0-9]+', '_', hint.lower())}"[:63].rstrip("_")
        with psycopg.connect(host="127.0.0.1", port=self.port, user=PG_USER, dbname="postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _unavailable(reason: str) -> None:
    """Skip, or in CI with PostgreSQL requested, fail loudly."""
    if in_ci():
        pytest.fail(f"{ENV_FLAG}=1 in CI, but {reason} ({INSTALL_HINT})", pytrace=False)
    pytest.skip(f"PostgreSQL tests: {reason} ({INSTALL_HINT})")


@pytest.fixture(scope="session")
def pg_server():
    """The session's PostgreSQL server (skips unless EVALGATE_TEST_POSTGRES=1)."""
    if not postgres_enabled():
        pytest.skip(f"PostgreSQL tests are off: set {ENV_FLAG}=1 to run them against a throwaway local server "
                    "(needs Debian's postgresql package)")
    bindir = find_bindir()
    if bindir is None:
        where = (f"in {ENV_BINDIR}={os.environ[ENV_BINDIR]}" if os.environ.get(ENV_BINDIR)
                 else "/usr/lib/postgresql/*/bin/initdb, or initdb on PATH")
        _unavailable(f"no PostgreSQL server binaries found ({where})")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("the psycopg driver is not installed (pip install 'psycopg[binary]')")
    try:
        server = PostgresServer(bindir)
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    atexit.register(server.stop)  # belt and braces: the finalizer below is the normal path
    try:
        started = time.monotonic()
        server.start()
        print(f"\nPostgreSQL {bindir.parent.name} on 127.0.0.1:{server.port} "
              f"(started in {time.monotonic() - started:.1f}s)")
        yield server
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server, request) -> str:
    """A fresh, empty database on the session's server, as a SQLAlchemy URL."""
    return pg_server.create_database(request.node.name)
