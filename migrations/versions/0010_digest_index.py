"""outputs: the index on (run_id, request_key) becomes a covering index of what a judgement reads first
(run_id, request_key, pass_index, digest, cached_tokens), so loading a run's digests never visits a table
row (evalgate/store/loaded.py)

Revision ID: 0010
Revises: 0009
"""
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_outputs_digests", "outputs", ["run_id", "request_key", "pass_index", "digest", "cached_tokens"])
    op.drop_index("ix_outputs_run_key", table_name="outputs")


def downgrade() -> None:
    op.create_index("ix_outputs_run_key", "outputs", ["run_id", "request_key"])
    op.drop_index("ix_outputs_digests", table_name="outputs")
