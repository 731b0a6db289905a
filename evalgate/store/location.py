"""Where a store is and which schema it must have, without importing SQLAlchemy: what `store/listing.py`
needs to read a SQLite file at the newest schema directly (store/db.py opens every other database)."""

from __future__ import annotations

from pathlib import Path

# How long a SQLite reader or writer waits for another process's lock before failing.
BUSY_TIMEOUT_MS = 60_000
# The newest migration in migrations/versions/ (tests/unit/test_migrations.py holds it equal to Alembic's
# head): a database at it is opened with one query, without importing Alembic (0.3 s of every command).
SCHEMA_HEAD = "0013"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for any other database (or SQLite in memory)."""
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        return Path(url[len("sqlite:///"):])
    return None
