"""The artifact store a fleet's workers share is recorded in the database (`app.fleetstore`).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    # A home made by create_all with this table already in it is adopted at 0001: skip what is there.
    if "fleet_artifact_store" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "fleet_artifact_store",
            sa.Column("name", sa.String(), nullable=False),
            sa.Column("token", sa.String(), nullable=False),
            sa.Column("location", sa.String(), nullable=False),
            sa.Column("recorded_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("name"),
        )


def downgrade() -> None:
    op.drop_table("fleet_artifact_store")
