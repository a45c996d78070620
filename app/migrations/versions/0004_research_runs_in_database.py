"""Research runs and their experiments move into the database (`app.researchstore`).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None

# research_experiments is append-only (the same statements as app.researchstore's, as they were at this revision).
_GUARD_SQLITE = (
    """CREATE TRIGGER research_experiments_no_update BEFORE UPDATE ON research_experiments
       BEGIN SELECT RAISE(ABORT, 'research_experiments is append-only: UPDATE rejected'); END""",
    """CREATE TRIGGER research_experiments_no_delete BEFORE DELETE ON research_experiments
       BEGIN SELECT RAISE(ABORT, 'research_experiments is append-only: DELETE rejected'); END""",
)
_GUARD_PG = (
    """CREATE OR REPLACE FUNCTION tuneharness_research_experiments_reject() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'research_experiments is append-only: % rejected', TG_OP; END
       $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER research_experiments_no_update BEFORE UPDATE OR DELETE ON research_experiments
       FOR EACH ROW EXECUTE FUNCTION tuneharness_research_experiments_reject()""",
)


def upgrade() -> None:
    bind = op.get_bind()
    # A home made by create_all with these tables already in it is adopted at 0001: skip what is there.
    present = set(sa.inspect(bind).get_table_names())
    if "research_experiments" not in present:
        op.create_table(
            "research_experiments",
            sa.Column("id", sa.Integer(), nullable=False),
            sa.Column("run", sa.String(), nullable=False),
            sa.Column("exp", sa.String(), nullable=False),
            sa.Column("iteration", sa.Integer(), nullable=False),
            sa.Column("axis", sa.String(), nullable=True),
            sa.Column("old_json", sa.String(), nullable=False),
            sa.Column("new_json", sa.String(), nullable=False),
            sa.Column("parent_json", sa.String(), nullable=False),
            sa.Column("config_json", sa.String(), nullable=False),
            sa.Column("seeds_json", sa.String(), nullable=False),
            sa.Column("metric", sa.String(), nullable=False),
            sa.Column("metric_per_seed_json", sa.String(), nullable=False),
            sa.Column("mean", sa.Float(), nullable=True),
            sa.Column("best_mean", sa.Float(), nullable=True),
            sa.Column("noise", sa.Float(), nullable=True),
            sa.Column("verdict", sa.String(), nullable=False),
            sa.Column("why", sa.String(), nullable=False),
            sa.Column("status", sa.String(), nullable=False),
            sa.Column("jobs_json", sa.String(), nullable=False),
            sa.Column("hosts_json", sa.String(), nullable=False),
            sa.Column("gpu_models_json", sa.String(), nullable=False),
            sa.Column("tflops_json", sa.String(), nullable=False),
            sa.Column("wall_s", sa.Float(), nullable=False),
            sa.Column("steps_json", sa.String(), nullable=False),
            sa.Column("usd", sa.Float(), nullable=False),
            sa.Column("recorded_at", sa.Float(), nullable=False),
            sa.CheckConstraint(
                "usd IS NULL OR (usd >= 0.0 AND usd <= 1e15)", name="money_finite_research_experiments_usd"
            ),
            sa.PrimaryKeyConstraint("id"),
            sa.UniqueConstraint("run", "exp", name="uq_research_experiments_run_exp"),
        )
        for stmt in _GUARD_PG if bind.dialect.name == "postgresql" else _GUARD_SQLITE:
            op.execute(stmt)
    if "research_runs" not in present:
        op.create_table(
            "research_runs",
            sa.Column("run_id", sa.String(), nullable=False),
            sa.Column("spec_json", sa.String(), nullable=False),
            sa.Column("state_json", sa.String(), nullable=True),
            sa.Column("best_json", sa.String(), nullable=True),
            sa.Column("seq", sa.Integer(), nullable=False),
            sa.Column("tick_seq", sa.Integer(), nullable=False),
            sa.Column("ticked_at", sa.Float(), nullable=True),
            sa.Column("writer", sa.String(), nullable=True),
            sa.Column("writer_until", sa.Float(), nullable=True),
            sa.Column("stopped", sa.Boolean(), nullable=False),
            sa.Column("created_at", sa.Float(), nullable=False),
            sa.Column("updated_at", sa.Float(), nullable=False),
            sa.PrimaryKeyConstraint("run_id"),
        )


def downgrade() -> None:
    op.drop_table("research_runs")
    op.drop_table("research_experiments")
