"""Celery app and tasks: thin shells that load state, call policy, apply decisions via ports."""
