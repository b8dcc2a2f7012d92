"""artifacts: one row per checkpoint file (name), sizes past 2 GiB (BIGINT); jobs: stage timings

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 07:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("name", sa.Text(), nullable=True))
        batch_op.alter_column("size", existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("timings", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("timings")
    with op.batch_alter_table("artifacts", schema=None) as batch_op:
        batch_op.alter_column("size", existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False)
        batch_op.drop_column("name")
