"""runs.owner and runs.engine_log: the process that owns a run (so a run left `running` by a killed
process is shown as abandoned) and the engine's log file

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("owner", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("engine_log", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("engine_log")
        batch.drop_column("owner")
