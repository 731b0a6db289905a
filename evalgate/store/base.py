"""The connection every part of the store shares: the engine (migrated on open), sessions, one transaction
per write whose storage failures are exit-3 errors, and the bulk statements of the hot paths.

The hot paths (a pass's outputs and payloads, a run's requests, reading a run's digests) run as plain SQL
through the driver: SQLAlchemy's per-row parameter handling costs more than the database itself there
(about 10 µs a row against 4, measured on 15,000 output rows). Each column's own bind processing (JSON,
NUL-safe text) is still applied, so what is stored is what the ORM would store.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import LargeBinary, Table, select
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ..errors import StoreError
from .db import display_url, make_engine, migrate

CHUNK = 500  # keys per IN (...) query


def chunked(keys: list | None) -> list[list | None]:
    """`keys` `CHUNK` at a time, one IN (...) query each; None (every row) stays one query."""
    return [None] if keys is None else [keys[i : i + CHUNK] for i in range(0, len(keys), CHUNK)]


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

    def placeholders(self, count: int) -> str:
        """`count` parameter markers in the driver's own style (sqlite3: ?, psycopg: %s)."""
        style = self.database.dialect.paramstyle
        if style == "qmark":
            return ", ".join("?" * count)
        if style in ("format", "pyformat"):
            return ", ".join(["%s"] * count)
        if style == "numeric":
            return ", ".join(f":{i}" for i in range(1, count + 1))
        raise StoreError(f"{self.url}: the database driver's parameter style {style!r} is not supported")

    def select_rows(self, s: Session, sql: str, params: tuple) -> list[tuple]:
        """The rows of a plain SELECT (parameters marked by `placeholders`), fetched by the driver at once."""
        cursor = s.connection().connection.cursor()
        try:
            cursor.execute(sql, params)
            return cursor.fetchall()
        finally:
            cursor.close()

    def iter_rows(self, s: Session, sql: str, params: tuple, size: int = 10_000) -> Iterator[tuple]:
        """The rows of a plain SELECT, handed over `size` at a time: what a caller keeps of a large result is
        built as the rows come, never beside every row the driver returned."""
        cursor = s.connection().connection.cursor()
        try:
            cursor.execute(sql, params)
            while batch := cursor.fetchmany(size):
                yield from batch
        finally:
            cursor.close()

    def insert_rows(self, s: Session, table: Table, columns: tuple[str, ...], rows: list[tuple], *,
                    new_only: str | None = None) -> None:
        """INSERT `rows` (tuples in `columns` order) in one executemany, each value through its column's
        bind processing. `new_only`: the primary key column of a content-addressed table; rows whose key is
        stored already are not sent (read first: re-sending a pass's payloads costs more than asking)."""
        if new_only is not None and rows:
            at, column = columns.index(new_only), table.c[new_only]
            keys, stored = [row[at] for row in rows], set()
            for chunk in chunked(keys):
                stored.update(s.scalars(select(column).where(column.in_(chunk))))
            rows = [row for row in rows if row[at] not in stored]
        if not rows:
            return
        # bytes go to the driver as they are: a binary column's processor only wraps them (sqlite3.Binary)
        processors = [(i, processor) for i, name in enumerate(columns) if not isinstance(table.c[name].type, LargeBinary)
                      and (processor := table.c[name].type.bind_processor(self.database.dialect))]
        if processors:
            rows = [_processed(row, processors) for row in rows]
        sql = f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({self.placeholders(len(columns))})"
        if new_only is not None and self.upsert_insert:
            sql += f" ON CONFLICT ({new_only}) DO NOTHING"  # another process may store the same content meanwhile
        s.connection().exec_driver_sql(sql, rows)


def _processed(row: tuple, processors: list) -> tuple:
    values = list(row)
    for i, processor in processors:
        values[i] = processor(values[i])
    return tuple(values)
