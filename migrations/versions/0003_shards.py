"""shards: runs.shard ("i/n") and runs.shard_group, so n CI jobs can each run part of a suite and merge

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("shard", sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column("shard_group", sa.String(length=200), nullable=True))
        batch_op.create_index(batch_op.f("ix_runs_shard_group"), ["shard_group"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_runs_shard_group"))
        batch_op.drop_column("shard_group")
        batch_op.drop_column("shard")
