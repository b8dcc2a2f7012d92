"""Alembic environment: runs migrations online against the URL set by jobs.db.upgrade."""

from alembic import context
from sqlalchemy import create_engine

from jobs.db import Base

config = context.config
url = config.get_main_option("sqlalchemy.url")
engine = create_engine(url)
with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
