"""Opening a store: engine setup, the "is this an evalgate database?" check, and automatic migrations.

SQLite is the default (WAL + busy timeout so concurrent evalgate processes queue instead of failing); any
SQLAlchemy URL works (PostgreSQL for teams sharing one store across CI runners). Opening runs pending
Alembic migrations (after a backup copy of an existing SQLite file) and refuses a database written by a
newer evalgate.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, OperationalError

from ..errors import ConfigError, StoreError

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000
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


def sqlite_path(url: str) -> Path | None:
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///"):])
    return None


def _check_sqlite_file(path: Path) -> None:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return
    if path.is_dir():
        raise ConfigError(f"{path} is a directory, not an evalgate database", fix="point --db at a file")
    with path.open("rb") as f:
        header = f.read(len(SQLITE_MAGIC))
    if path.stat().st_size and header != SQLITE_MAGIC:
        raise ConfigError(
            f"{path}: this file is not an evalgate database (not SQLite)",
            fix="point the suite's database (or --db) at an evalgate database, or at a new path",
        )


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
            # journal_mode=WAL is persistent and rewrites the file header: migrate() sets it only once the
            # file is known to be an evalgate database, so a refused file is left byte-identical.
            cur.close()

        return engine
    try:
        return create_engine(url, pool_pre_ping=True)
    except Exception as exc:  # bad URL, missing driver
        raise ConfigError(f"database URL {url!r}: {exc}", fix="use a SQLAlchemy URL such as sqlite:///baselines/evalgate.sqlite") from None


def migrate(engine: Engine, url: str) -> None:
    """Bring the schema to head; refuse foreign or newer databases; back up SQLite files before upgrading."""
    from alembic import command
    from alembic.script import ScriptDirectory

    where = str(sqlite_path(url) or url)
    script = ScriptDirectory.from_config(_alembic_config())
    head = script.get_current_head()
    try:
        current = _identify(engine, script, where, head)
    except ConfigError:
        engine.dispose()  # close the file: a refused database keeps no -wal/-shm companions either
        raise
    path = sqlite_path(url)
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
                fix="upgrade evalgate (pip install -U evalgate-vllm), or use another database",
            ) from None
    return current
