"""outputs.cached_tokens: the engine's count of prompt tokens served from its prefix cache, per output
(so a `hot` pass is proven hot, not assumed)

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outputs") as batch:
        batch.add_column(sa.Column("cached_tokens", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outputs") as batch:
        batch.drop_column("cached_tokens")
