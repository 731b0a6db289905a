"""lm-eval suites: requests.request_type, and per-document metric values (sample_scores) so a check can
name the requests that moved a task metric

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests", schema=None) as batch_op:
        # generate (plain prompt) | generate_until | loglikelihood | loglikelihood_rolling
        batch_op.add_column(sa.Column("request_type", sa.String(length=40), nullable=False, server_default="generate"))
    op.create_table(
        "sample_scores",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("doc_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("request_keys", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "task", "doc_id", "metric"),
    )


def downgrade() -> None:
    op.drop_table("sample_scores")
    with op.batch_alter_table("requests", schema=None) as batch_op:
        batch_op.drop_column("request_type")
