"""artifacts: keys in the store (``jobs.store``) in place of a host's absolute paths

``/srv/liar/artifacts/job-7/attempt-1/checkpoint/model.safetensors`` becomes
``artifacts/job-7/attempt-1/checkpoint/model.safetensors``: the path relative to the data folder, which
is what the default store (the data folder itself) names it, so every earlier job's files stay where
they are and downloadable. A path that does not lie in an ``artifacts/job-N/`` folder is left as it
was (nothing this project wrote); serving refuses it as outside its job's folder.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 09:00:00
"""

import re

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_KEY = re.compile(r"^(?:.*[/\\])?(artifacts[/\\]job-\d+(?:[/\\].*)?)$")
artifacts = sa.table("artifacts", sa.column("id", sa.Integer), sa.column("path", sa.Text))


def upgrade() -> None:
    bind = op.get_bind()
    for row_id, path in bind.execute(sa.select(artifacts.c.id, artifacts.c.path)).all():
        match = _KEY.match(path or "") if (path or "").startswith(("/", "\\")) or ":" in (path or "")[:3] else None
        if match:
            key = match.group(1).replace("\\", "/")
            bind.execute(sa.update(artifacts).where(artifacts.c.id == row_id).values(path=key))


def downgrade() -> None:
    pass  # a key cannot become a host's path again without the data folder it was under; keys keep working
