"""Opening a store: engine setup, the "is this an evalgate database?" check, and automatic migrations.

SQLite is the default (WAL + busy timeout so concurrent evalgate processes queue instead of failing); any
SQLAlchemy URL works (PostgreSQL for teams sharing one store across CI runners). Opening runs pending
Alembic migrations (after a backup copy of an existing SQLite file) and refuses a database written by a
newer evalgate.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError, OperationalError

from ..errors import ConfigError, StoreError

SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000


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
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        return engine
    try:
        return create_engine(url, pool_pre_ping=True)
    except Exception as exc:  # bad URL, missing driver
        raise ConfigError(f"database URL {url!r}: {exc}", fix="use a SQLAlchemy URL such as sqlite:///baselines/evalgate.sqlite") from None


def migrate(engine: Engine, url: str) -> None:
    """Bring the schema to head; refuse foreign or newer databases; back up SQLite files before upgrading."""
    from alembic import command
    from alembic.runtime.migration import MigrationContext
    from alembic.script import ScriptDirectory

    where = str(sqlite_path(url) or url)
    script = ScriptDirectory.from_config(_alembic_config())
    head = script.get_current_head()
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
            raise ConfigError(
                f"{where}: written by a newer evalgate (schema revision {current}; this evalgate knows up to {head})",
                fix="upgrade evalgate (pip install -U evalgate-vllm), or use another database",
            ) from None
    if current == head:
        return
    path = sqlite_path(url)
    if current is not None and path is not None and path.exists():
        backup = path.with_name(f"{path.name}.backup-{current}")
        shutil.copy2(path, backup)
    try:
        with engine.begin() as conn:
            command.upgrade(_alembic_config(conn), "head")
    except OperationalError as exc:
        raise StoreError(f"{where}: could not migrate the database: {exc.orig}") from None
