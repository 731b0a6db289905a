"""runs: the report in a column of its own. A run's Report was kept inside `runs.schedule["report"]`, a column
meant for runtime knobs and pass timings; it moves to `runs.report`, whole, and `schedule` keeps the rest.
Runs judged before reports were stored (a `judged` entry, or none) keep NULL: reading their report judges
them again once (evalgate/judgement/judging.py `stored_report`).

Revision ID: 0013
Revises: 0012
"""
import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

RUNS = sa.table("runs", sa.column("id", sa.Integer()), sa.column("schedule", sa.JSON()), sa.column("report", sa.JSON()))


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("report", sa.JSON(), nullable=True))
    conn = op.get_bind()
    for run_id, schedule in conn.execute(sa.select(RUNS.c.id, RUNS.c.schedule)).all():
        if isinstance(schedule, dict) and schedule.get("report") is not None:
            rest = {key: value for key, value in schedule.items() if key != "report"}
            conn.execute(RUNS.update().where(RUNS.c.id == run_id).values(schedule=rest, report=schedule["report"]))


def downgrade() -> None:
    conn = op.get_bind()
    for run_id, schedule, report in conn.execute(sa.select(RUNS.c.id, RUNS.c.schedule, RUNS.c.report)).all():
        if report is not None:
            conn.execute(RUNS.update().where(RUNS.c.id == run_id).values(schedule={**(schedule or {}), "report": report}))
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("report")
