"""Opening a store: engine setup, the "is this an evalgate database?" check, and automatic migrations.

SQLite is the default (WAL + busy timeout so concurrent evalgate processes queue instead of failing); any
SQLAlchemy URL works (PostgreSQL for teams sharing one store across CI runners). Opening runs pending
Alembic migrations (after a backup copy of an existing SQLite file) and refuses a database written by a
newer evalgate.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DatabaseError, OperationalError

from ..errors import ConfigError, StoreError
from .location import BUSY_TIMEOUT_MS, SCHEMA_HEAD, sqlite_path
from .portable import server_json_dumps, server_json_loads

# PostgreSQL: one advisory lock (per database) serialises evalgate's identify-and-migrate across processes.
PG_MIGRATION_LOCK = 0x6576_616C_6761_7465  # "evalgate"
# Tables every evalgate schema revision has: a database with none of them is some other application's.
EVALGATE_TABLES = {"runs", "outputs"}


def migrations_dir() -> Path:
    """migrations/ ships inside the wheel as evalgate/migrations; a source checkout has it at the top."""
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "migrations", here.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError("evalgate's migrations are missing from this installation", fix="reinstall evalgate")


def _alembic_config(connection=None):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.attributes["connection"] = connection
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def display_url(url: str) -> str:
    """The URL for messages: a password in it is shown as ***."""
    try:
        parsed = make_url(url)
        return parsed.render_as_string(hide_password=True) if parsed.password is not None else url
    except Exception:
        return url


def _check_sqlite_file(path: Path) -> None:
    """Only path-level checks: the file's content is identified through SQLite itself (_identify). Never
    open() the database file here: closing any descriptor of it drops every SQLite lock this process holds
    on it (POSIX locks are per process), and another process may then delete the -wal file under us."""
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not an evalgate database", fix="point --db at a file")
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)


def make_engine(url: str) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        _check_sqlite_file(path)
        engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_MS / 1000})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            cur.execute("PRAGMA foreign_keys=ON")
            # In WAL mode NORMAL keeps every transaction atomic and the file uncorruptible; only a power
            # loss (not a crash of evalgate) can lose the last commits. FULL syncs every commit: 20 ms each here.
            cur.execute("PRAGMA synchronous=NORMAL")
            # A pass of 5,000 outputs writes about 12 MB: at SQLite's default (1,000 pages) every pass's commit
            # would copy the log into the file and sync it. The log is copied when it passes 4,096 pages (64 MiB
            # at evalgate's page size), and when the last connection closes.
            cur.execute("PRAGMA wal_autocheckpoint=4096")
            # A new file's pages hold 16 KiB: a payload (about 3 KB for 64 tokens with their top-5) fills
            # most of a 4 KiB page alone; five share a 16 KiB one (measured: 14 bytes a token instead of 16,
            # and 20% faster writes; benchmarks/store_speed.py). An existing file keeps its page size.
            cur.execute("PRAGMA page_size=16384")
            # journal_mode=WAL is persistent and rewrites the file header: migrate() sets it only once the
            # file is known to be an evalgate database, so a refused file is left byte-identical.
            cur.close()

        return engine
    try:
        kwargs = {}
        if make_url(url).get_backend_name() in ("postgresql", "mysql", "mariadb"):
            # their json types refuse NaN/Infinity, which a broken model's logprobs can put in a verdict
            kwargs = {"json_serializer": server_json_dumps, "json_deserializer": server_json_loads}
        return create_engine(url, pool_pre_ping=True, **kwargs)
    except Exception as exc:  # bad URL, missing driver
        raise ConfigError(f"database URL {display_url(url)!r}: {exc}",
                          fix="use a SQLAlchemy URL such as sqlite:///baselines/evalgate.sqlite") from None


def schema_version(engine: Engine) -> str | None:
    """The database's Alembic revision, read in one query; None when it has none (or cannot be read)."""
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    except DatabaseError:  # no such table, not a database, a server refusing us: migrate() says which
        return None


def migrate(engine: Engine, url: str) -> None:
    """Bring the schema to head; refuse foreign or newer databases; back up SQLite files before upgrading.
    A database at head is only asked its version: Alembic is imported when there is something to do."""
    if schema_version(engine) == SCHEMA_HEAD:
        if sqlite_path(url) is not None:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")  # a no-op for evalgate's own files
        return
    from alembic import command
    from alembic.script import ScriptDirectory

    where = str(sqlite_path(url) or display_url(url))
    script = ScriptDirectory.from_config(_alembic_config())
    head = script.get_current_head()
    path = sqlite_path(url)
    # Identify and migrate under one lock: a process must never see another's half-created schema.
    with _migration_lock(path), _server_migration_lock(engine, where):
        try:
            current = _identify(engine, script, where, head)
        except ConfigError:
            engine.dispose()  # close the file: a refused database keeps no -wal/-shm companions either
            raise
        if path is not None:
            with engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode=WAL")
        if current == head:
            return
        if current is not None and path is not None and path.exists():
            _backup_sqlite(path, path.with_name(f"{path.name}.backup-{current}"))
        try:
            with engine.begin() as conn:
                command.upgrade(_alembic_config(conn), "head")
        except OperationalError as exc:
            raise StoreError(f"{where}: could not migrate the database: {exc.orig}") from None


@contextmanager
def _migration_lock(path: Path | None):
    """Serialise migrations of one SQLite file across processes (two evalgate runs starting on a new
    database at once would otherwise both create the tables). flock on the directory: no lock file left."""
    if path is None:
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def _server_migration_lock(engine: Engine, where: str):
    """PostgreSQL: the same serialisation for CI runners sharing one database, through a session-level
    advisory lock (released when this process's connection ends, even if it dies)."""
    if engine.dialect.name != "postgresql":
        yield
        return
    try:
        conn = engine.connect()
        conn.exec_driver_sql(f"SELECT pg_advisory_lock({PG_MIGRATION_LOCK})")
        conn.commit()
    except DatabaseError as exc:
        raise _server_error(exc, where) from None
    try:
        yield
    finally:
        try:
            conn.exec_driver_sql(f"SELECT pg_advisory_unlock({PG_MIGRATION_LOCK})")
            conn.commit()
        except DatabaseError:
            conn.invalidate()  # closing the connection releases the lock
        finally:
            conn.close()


def _server_error(exc: DatabaseError, where: str) -> ConfigError | StoreError:
    """A database server that cannot be used: a missing database or refused login is the URL's fault
    (configuration, exit 2); anything else (server down, network) is infrastructure (exit 3)."""
    msg = str(exc.orig).strip()
    code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    if code == "3D000" or ("database \"" in msg and "does not exist" in msg):
        return ConfigError(f"{where}: the database does not exist ({msg})",
                           fix="create it first (e.g. `createdb NAME`): evalgate creates its tables, not the database")
    if (code or "").startswith("28") or any(s in msg for s in ("authentication failed", "role \"", "pg_hba.conf")):
        return ConfigError(f"{where}: the server refused the login ({msg})",
                           fix="check the user and password in the database URL")
    return StoreError(f"{where}: could not use the database server ({msg})",
                      fix="check that the server is up and reachable at the URL's host and port")


def _backup_sqlite(path: Path, backup: Path) -> None:
    """A consistent copy through SQLite's backup API: a plain file copy would miss transactions that are
    committed but still in the -wal file (another process has the database open, or one crashed)."""
    backup.unlink(missing_ok=True)
    src = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        dst = sqlite3.connect(backup)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def _identify(engine: Engine, script, where: str, head: str) -> str | None:
    """The database's schema revision (None: empty); ConfigError for foreign or newer databases. Read-only."""
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            tables = set(inspect(conn).get_table_names())
            current = MigrationContext.configure(conn).get_current_revision()
    except DatabaseError as exc:
        if engine.dialect.name != "sqlite":  # a server: unreachable, or refusing us, not a foreign file
            raise _server_error(exc, where) from None
        raise ConfigError(
            f"{where}: this file is not an evalgate database ({exc.orig})",
            fix="point the suite's database (or --db) at an evalgate database, or at a new path",
        ) from None
    if current is None and tables - {"alembic_version"}:
        raise ConfigError(
            f"{where}: this database is not an evalgate database (it has tables {', '.join(sorted(tables))})",
            fix="use a separate database for evalgate",
        )
    if current is not None:
        try:
            script.get_revision(current)
        except Exception:
            if not EVALGATE_TABLES & tables:  # another application's Alembic-managed database
                raise ConfigError(
                    f"{where}: this database is not an evalgate database (schema revision {current}, "
                    f"tables {', '.join(sorted(tables))})",
                    fix="use a separate database for evalgate",
                ) from None
            raise ConfigError(
                f"{where}: written by a newer evalgate (schema revision {current}; this evalgate knows up to {head})",
                fix="upgrade evalgate (README.md \"Install into your own project\"), or use another database",
            ) from None
    return current
