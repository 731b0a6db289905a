"""cost_results: `evalgate cost` measurements per candidate engine configuration (throughput, latency,
memory, invariance), beside the candidate's run of kind `cost`

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "cost_results",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("session", sa.String(length=64), nullable=False),
        sa.Column("suite_name", sa.String(length=200), nullable=False),
        sa.Column("candidate", sa.String(length=200), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("invariant", sa.Boolean(), nullable=True),
        sa.Column("differing_requests", sa.Integer(), nullable=True),
        sa.Column("requests", sa.Integer(), nullable=True),
        sa.Column("highest_concurrency", sa.Integer(), nullable=True),
        sa.Column("tokens_per_second", sa.Float(), nullable=True),
        sa.Column("peak_rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("engine_load_seconds", sa.Float(), nullable=True),
        sa.Column("figures", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("session", "candidate"),
    )
    op.create_index(op.f("ix_cost_results_session"), "cost_results", ["session"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_cost_results_session"), table_name="cost_results")
    op.drop_table("cost_results")
