"""jobs: the worker queue a job was routed to (``jobs.routing``), and when its progress last moved
(``jobs.watchdog``)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # both nullable: a job queued before this revision waits in the default queue, and a job running
    # through the upgrade is judged by its next progress write (the watchdog skips a NULL)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("queue", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("progress_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("progress_at")
        batch_op.drop_column("queue")
