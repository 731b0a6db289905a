"""requests: the rendered prompt of a chat request (the template's output, as the engine saw it), so a check
can show where a rendered prompt moved ("Today Date: 01 Mar 2026" -> "02 Mar 2026"). NULL for a plain prompt
(its text is `prompt`) and for requests stored before 0012.

Revision ID: 0012
Revises: 0011
"""
import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("rendered", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("rendered")
