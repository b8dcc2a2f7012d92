"""jobs: how many of a job's attempts ended in a polite stop (``stops``)

A worker stopped by SIGTERM saves a checkpoint at its next block boundary and hands the job back
(``jobs.stopping``); that attempt is not the job's failure, so ``LIAR_MAX_ATTEMPTS`` counts a job's
attempts less its stops. Before this revision the reaper counted every attempt: a job stopped once
and then lost with its worker was failed instead of run again. Jobs from before start at 0.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stops", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("stops")
