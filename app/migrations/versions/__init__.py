"""Revision files, one per schema change, oldest first (Alembic loads them by path)."""
