"""Alembic migrations of the state store, run by the store itself when it opens."""
