"""Alembic environment. evalgate runs migrations itself when it opens a database (evalgate/store/db.py),
handing over its own connection; `alembic` on the command line is not needed."""

from alembic import context

from evalgate.store.models import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # `alembic -x url=...` for maintainers
        from sqlalchemy import create_engine

        connection = create_engine(context.get_x_argument(as_dictionary=True)["url"]).connect()
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
