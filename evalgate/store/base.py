"""The connection every part of the store shares: the engine (migrated on open), sessions, and one
transaction per write whose storage failures are exit-3 errors."""

from __future__ import annotations

from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StoreError
from .db import display_url, make_engine, migrate


def _upsert_insert(dialect: str):
    """The dialect's INSERT that supports ON CONFLICT, or None (then a read-then-write fallback)."""
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert
    elif dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        return None
    return insert


class StoreBase:
    def __init__(self, url: str):
        self.url = display_url(url)  # for messages: no password
        self.database = make_engine(url)  # the SQLAlchemy engine ("engine" in evalgate is the inference engine)
        migrate(self.database, url)
        # Several evalgate processes may store the same new identity or promote at once: "insert if missing"
        # must be one statement (INSERT ... ON CONFLICT), which SQLite and PostgreSQL both have.
        self.upsert_insert = _upsert_insert(self.database.dialect.name)
        self._session = sessionmaker(self.database, expire_on_commit=False)

    def session(self) -> Session:
        return self._session()

    def write(self, fn):
        """Run fn(session) in one transaction; storage failures (disk full, locked) are exit-3 errors."""
        try:
            with self.session() as s, s.begin():
                return fn(s)
        except OperationalError as exc:
            raise StoreError(f"could not write to the database {self.url}: {exc.orig}") from None
        except SQLAlchemyError as exc:
            raise StoreError(f"database error on {self.url}: {exc}") from None
