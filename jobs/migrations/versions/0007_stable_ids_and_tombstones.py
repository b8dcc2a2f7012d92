"""jobs: ids never given twice, and a deleted job's tombstone (``deleted_at``, ``deleted_by``)

SQLite gave a new row the largest id + 1, so once the newest job was deleted its id went to the next
one: a shared ``?job=N`` link, a ``jobs/N/files/…`` address or a ``model: job:N`` recipe then named
another run. Here the table is rebuilt as ``AUTOINCREMENT`` (every column, index and row kept; the
foreign keys of metrics, artifacts and job_logs name the table, so they hold) and ``sqlite_sequence``
is seeded with the highest job id anything still names: a row's, a re-evaluation's source, a
``model: job:N``. A PostgreSQL sequence never goes back, but rows inserted with explicit ids (a
restore, a copy) leave it behind them: it is moved up to the same floor, never down.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 09:00:00
"""

import json
import re

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_REFERENCE = re.compile(r"\s*job:\s*(\d+)\s*")


def _highest_named(bind) -> int:
    """The highest job id the database names anywhere (0 when none)."""
    highest = 0
    for column in ("id", "source_job_id"):
        highest = max(highest, bind.scalar(sa.text(f"SELECT MAX({column}) FROM jobs")) or 0)
    for table in ("metrics", "artifacts", "job_logs"):
        highest = max(highest, bind.scalar(sa.text(f"SELECT MAX(job_id) FROM {table}")) or 0)
    for (recipe,) in bind.execute(sa.text("SELECT recipe FROM jobs")):
        data = json.loads(recipe) if isinstance(recipe, str) else recipe
        model = data.get("model") if isinstance(data, dict) else None
        match = _REFERENCE.fullmatch(model) if isinstance(model, str) else None
        highest = max(highest, int(match.group(1)) if match else 0)
    return highest


def upgrade() -> None:
    bind = op.get_bind()
    sqlite = bind.dialect.name == "sqlite"
    # SQLite: the whole table copied into one declared AUTOINCREMENT (batch mode reflects its columns
    # and indexes, and makes the new table under a temporary name before it takes the old one's)
    options = {"recreate": "always", "table_kwargs": {"sqlite_autoincrement": True}} if sqlite else {}
    with op.batch_alter_table("jobs", schema=None, **options) as batch_op:
        batch_op.add_column(sa.Column("deleted_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("deleted_by", sa.String(length=255), nullable=True))
    floor = _highest_named(bind)
    if sqlite:
        bind.execute(sa.text("DELETE FROM sqlite_sequence WHERE name = 'jobs'"))
        bind.execute(sa.text("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', :seq)"), {"seq": floor})
    elif bind.dialect.name == "postgresql" and floor:
        sequence = bind.scalar(sa.text("SELECT pg_get_serial_sequence('jobs', 'id')"))
        if sequence:
            last, called = bind.execute(sa.text(f"SELECT last_value, is_called FROM {sequence}")).one()
            if floor >= last or not called:  # the next id goes past the floor; a sequence ahead stays
                bind.execute(sa.text("SELECT setval(:s, :v, true)"), {"s": sequence, "v": max(floor, last)})


def downgrade() -> None:
    # code before this revision knows no tombstone: a deleted job goes as it went then (its metrics and
    # log with it); the ids stay as they are (AUTOINCREMENT harms nothing older code does)
    for table in ("metrics", "artifacts", "job_logs"):  # SQLite's migrations run without its cascades
        op.execute(f"DELETE FROM {table} WHERE job_id IN (SELECT id FROM jobs WHERE status = 'DELETED')")
    op.execute("DELETE FROM jobs WHERE status = 'DELETED'")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("deleted_by")
        batch_op.drop_column("deleted_at")
