"""Alembic environment: migrates the database named by LIYAGENT_DATABASE_URL (or -x url=...)."""

from alembic import context
from sqlalchemy import create_engine, pool

from store.db import database_url_from_env
from store.schema import metadata

url = (
    context.config.attributes.get("url")
    or context.get_x_argument(as_dictionary=True).get("url")
    or database_url_from_env()
)
target_metadata = metadata

if context.is_offline_mode():
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = create_engine(url, poolclass=pool.NullPool, hide_parameters=True)
    with engine.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
