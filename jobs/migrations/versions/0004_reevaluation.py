"""jobs: re-evaluations (the source job a row evaluates again, and which of its evaluations), and
which of a job's evaluations failed (``jobs.reevaluation``)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # no foreign key on source_job_id: a re-evaluation's record outlives a deleted source (as a
    # ``model: job:N`` reference does), and SQLite adds a constraint only by rebuilding the table
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("source_job_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("source_evaluations", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("failed_evaluations", sa.JSON(), nullable=True))
        batch_op.create_index(batch_op.f("ix_jobs_source_job_id"), ["source_job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_jobs_source_job_id"))
        batch_op.drop_column("failed_evaluations")
        batch_op.drop_column("source_evaluations")
        batch_op.drop_column("source_job_id")
