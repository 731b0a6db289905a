"""baselines: a receipt, for a baseline adopted from a check judged against another hardware class's baseline
(`evalgate baseline adopt`): the run and class it was judged against, its counts per class, the envelope and
the tolerances (evalgate/judgement/hardware.py). NULL for a baseline created or accepted on its own class.

Revision ID: 0011
Revises: 0010
"""
import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("baselines") as batch:
        batch.add_column(sa.Column("receipt", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("baselines") as batch:
        batch.drop_column("receipt")
