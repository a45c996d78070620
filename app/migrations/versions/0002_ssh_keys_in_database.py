"""Jobs' SSH key pairs and hosts' pinned keys move into the database (`app.hostkeys`).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # A home made by create_all with these tables already in it is adopted at 0001: skip what is there.
    present = set(sa.inspect(op.get_bind()).get_table_names())
    if "job_ssh_keys" not in present:
        op.create_table(
            "job_ssh_keys",
            sa.Column("job_id", sa.String(), nullable=False),
            sa.Column("public_key", sa.String(), nullable=False),
            sa.Column("private_key", sa.String(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("job_id"),
        )
    if "host_key_pins" not in present:
        op.create_table(
            "host_key_pins",
            sa.Column("pin_id", sa.String(), nullable=False),
            sa.Column("key_line", sa.String(), nullable=False),
            sa.Column("pinned_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("pin_id"),
        )


def downgrade() -> None:
    op.drop_table("host_key_pins")
    op.drop_table("job_ssh_keys")
