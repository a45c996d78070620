"""The schema of the last release made without migrations (every table, its indexes, the ledger's
append-only triggers and the money CHECKs).

A database it finds empty gets all of it. A home made before migrations (tables from create_all, no
alembic_version) is adopted here: a table it lacks is created, an index it lacks is added, and tables
made before the money CHECKs existed get an equivalent guard (PostgreSQL: the constraint, NOT VALID
first so old rows never block a start; SQLite, which cannot add a constraint, BEFORE INSERT/UPDATE
triggers). Everything here is frozen as that release had it: later changes are later revisions.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

log = logging.getLogger(__name__)

_META = sa.MetaData()

sa.Table(
    "alert_outbox",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("key", sa.String(), nullable=False),
    sa.Column("created_at", sa.String(), nullable=False),
    sa.Column("kind", sa.String(), nullable=False),
    sa.Column("summary", sa.String(), nullable=False),
    sa.Column("job", sa.String(), nullable=True),
    sa.Column("details", sa.String(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("last_error", sa.String(), nullable=True),
    sa.Column("next_attempt_at", sa.String(), nullable=False),
    sa.Column("claimed_until", sa.String(), nullable=True),
    sa.Column("delivered_at", sa.String(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("key"),
    sa.Index("ix_alert_outbox_created_at", "created_at"),
    sa.Index("ix_alert_outbox_delivered_at", "delivered_at"),
    sa.Index("ix_alert_outbox_kind", "kind"),
    sa.Index("ix_alert_outbox_next_attempt_at", "next_attempt_at"),
)
sa.Table(
    "budget_caps",
    _META,
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("cap_usd", sa.Float(), nullable=False),
    sa.Column("unit", sa.String(), nullable=False),
    sa.Column("period", sa.String(), nullable=False),
    sa.Column("updated_at", sa.String(), nullable=False),
    sa.CheckConstraint(
        "cap_usd IS NULL OR (cap_usd >= 0.0 AND cap_usd <= 1000000000000000.0)", name="money_finite_budget_caps_cap_usd"
    ),
    sa.PrimaryKeyConstraint("name"),
)
sa.Table(
    "budget_reservations",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("budget", sa.String(), nullable=False),
    sa.Column("job", sa.String(), nullable=True),
    sa.Column("amount_usd", sa.Float(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("idempotency_key", sa.String(), nullable=False),
    sa.Column("created_at", sa.String(), nullable=False),
    sa.Column("created_ts", sa.Float(), nullable=False),
    sa.CheckConstraint(
        "amount_usd IS NULL OR (amount_usd >= 0.0 AND amount_usd <= 1000000000000000.0)",
        name="money_finite_budget_reservations_amount_usd",
    ),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("idempotency_key"),
    sa.Index("ix_budget_reservations_budget", "budget"),
    sa.Index("ix_budget_reservations_job", "job"),
    sa.Index("ix_budget_reservations_state", "state"),
)
sa.Table(
    "gpu_speed",
    _META,
    sa.Column("gpu_model", sa.String(), nullable=False),
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("machine_id", sa.String(), nullable=False),
    sa.Column("tflops_json", sa.String(), nullable=False),
    sa.Column("measured_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("gpu_model", "provider", "machine_id"),
)
sa.Table(
    "held_hosts",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("instance_id", sa.String(), nullable=False),
    sa.Column("machine_id", sa.String(), nullable=False),
    sa.Column("rental_id", sa.String(), nullable=False),
    sa.Column("owner", sa.String(), nullable=False),
    sa.Column("released_by", sa.String(), nullable=False),
    sa.Column("gpu_name", sa.String(), nullable=False),
    sa.Column("gpu_ram_gb", sa.Float(), nullable=False),
    sa.Column("num_gpus", sa.Integer(), nullable=False),
    sa.Column("dph_total", sa.Float(), nullable=False),
    sa.Column("verified_at", sa.Float(), nullable=False),
    sa.Column("hold_until", sa.Float(), nullable=False),
    sa.Column("standby", sa.Boolean(), nullable=False),
    sa.Column("held_work", sa.Boolean(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("adopted_by", sa.String(), nullable=True),
    sa.Column("ended_at", sa.Float(), nullable=True),
    sa.Column("end_reason", sa.String(), nullable=True),
    sa.PrimaryKeyConstraint("id"),
    sa.Index("ix_held_hosts_instance_id", "instance_id"),
    sa.Index("ix_held_hosts_owner", "owner"),
    sa.Index("ix_held_hosts_state", "state"),
)
sa.Table(
    "host_transfers",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("instance_id", sa.String(), nullable=False),
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("bytes_done", sa.Integer(), nullable=False),
    sa.Column("bytes_total", sa.Integer(), nullable=False),
    sa.Column("bytes_moved", sa.Integer(), nullable=False),
    sa.Column("rate_bytes_per_s", sa.Float(), nullable=True),
    sa.Column("current", sa.String(), nullable=True),
    sa.Column("runner", sa.String(), nullable=True),
    sa.Column("lease_until", sa.Float(), nullable=False),
    sa.Column("started_at", sa.Float(), nullable=True),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.Column("resume_step", sa.Integer(), nullable=False),
    sa.Column("error", sa.String(), nullable=True),
    sa.Column("failures", sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
    sa.Index("ix_host_transfers_job_id", "job_id"),
)
sa.Table(
    "job_evaluations",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("trial_path", sa.String(), nullable=False),
    sa.Column("trial_hash", sa.String(), nullable=False),
    sa.Column("decision", sa.String(), nullable=False),
    sa.Column("reasons_json", sa.String(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Table(
    "job_pools",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("standby_hosts", sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Table(
    "jobs",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("phase", sa.String(), nullable=False),
    sa.Column("spec_json", sa.String(), nullable=False),
    sa.Column("budget_usd", sa.Float(), nullable=True),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.Column("detail", sa.String(), nullable=False),
    sa.CheckConstraint(
        "budget_usd IS NULL OR (budget_usd >= 0.0 AND budget_usd <= 1000000000000000.0)",
        name="money_finite_jobs_budget_usd",
    ),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Table(
    "ledger_events",
    _META,
    sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
    sa.Column("at", sa.String(), nullable=False),
    sa.Column("kind", sa.String(), nullable=False),
    sa.Column("job", sa.String(), nullable=True),
    sa.Column("instance", sa.String(), nullable=True),
    sa.Column("provider", sa.String(), nullable=True),
    sa.Column("machine", sa.String(), nullable=True),
    sa.Column("rate_usd_per_hour", sa.Float(), nullable=True),
    sa.Column("amount_usd", sa.Float(), nullable=True),
    sa.Column("reason", sa.String(), nullable=False),
    sa.Column("payload", sa.String(), nullable=False),
    sa.Column("idempotency_key", sa.String(), nullable=False),
    sa.Column("prev_hash", sa.String(), nullable=False),
    sa.Column("row_hash", sa.String(), nullable=False),
    sa.CheckConstraint(
        "amount_usd IS NULL OR (amount_usd >= -1000000000000000.0 AND amount_usd <= 1000000000000000.0)",
        name="money_finite_ledger_events_amount_usd",
    ),
    sa.CheckConstraint(
        "rate_usd_per_hour IS NULL OR (rate_usd_per_hour >= 0.0 AND rate_usd_per_hour <= 1000000000000000.0)",
        name="money_finite_ledger_events_rate_usd_per_hour",
    ),
    sa.PrimaryKeyConstraint("seq"),
    sa.UniqueConstraint("idempotency_key"),
    sa.Index("ix_ledger_events_at", "at"),
    sa.Index("ix_ledger_events_job", "job"),
    sa.Index("ix_ledger_events_kind", "kind"),
)
sa.Table(
    "machine_reputation",
    _META,
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("machine_id", sa.String(), nullable=False),
    sa.Column("creates", sa.Integer(), nullable=False),
    sa.Column("booted", sa.Integer(), nullable=False),
    sa.Column("preflight_passed", sa.Integer(), nullable=False),
    sa.Column("slices_finished", sa.Integer(), nullable=False),
    sa.Column("failures_json", sa.String(), nullable=False),
    sa.Column("quarantined_until", sa.Float(), nullable=True),
    sa.Column("quarantine_permanent", sa.Boolean(), nullable=False),
    sa.Column("quarantine_reason", sa.String(), nullable=True),
    sa.Column("last_seen_at", sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint("provider", "machine_id"),
)
sa.Table(
    "orphan_sightings",
    _META,
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("instance_id", sa.String(), nullable=False),
    sa.Column("first_seen_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("provider", "instance_id"),
)
sa.Table(
    "periodic_runs",
    _META,
    sa.Column("name", sa.String(), nullable=False),
    sa.Column("last_success_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("name"),
)
sa.Table(
    "provisioning_state",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("state_json", sa.String(), nullable=False),
    sa.Column("version", sa.Integer(), nullable=False),
    sa.Column("wake_at", sa.Float(), nullable=True),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Table(
    "pull_rates",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("rate_gb_per_s", sa.Float(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
)
sa.Table(
    "rental_sends",
    _META,
    sa.Column("rental_id", sa.String(), nullable=False),
    sa.Column("sent_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("rental_id"),
)
sa.Table(
    "rental_traffic",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("rental_id", sa.String(), nullable=False),
    sa.Column("job", sa.String(), nullable=False),
    sa.Column("nbytes", sa.Integer(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
    sa.Index("ix_rental_traffic_rental_id", "rental_id"),
)
sa.Table(
    "rental_transfers",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("rental_id", sa.String(), nullable=False),
    sa.Column("from_job", sa.String(), nullable=False),
    sa.Column("to_job", sa.String(), nullable=False),
    sa.Column("at", sa.Float(), nullable=False),
    sa.Column("rate_usd_per_hour", sa.Float(), nullable=True),
    sa.Column("settled_usd", sa.Float(), nullable=False),
    sa.Column("old_reservations", sa.String(), nullable=False),
    sa.Column("new_reservations", sa.String(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
    sa.Index("ix_rental_transfers_rental_id", "rental_id"),
)
sa.Table(
    "rentals",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("job", sa.String(), nullable=False),
    sa.Column("attempt", sa.Integer(), nullable=False),
    sa.Column("provider", sa.String(), nullable=False),
    sa.Column("offer_id", sa.String(), nullable=False),
    sa.Column("machine_id", sa.String(), nullable=True),
    sa.Column("label", sa.String(), nullable=False),
    sa.Column("instance_id", sa.String(), nullable=True),
    sa.Column("rate_usd_per_hour", sa.Float(), nullable=True),
    sa.Column("disk_gb", sa.Float(), nullable=False),
    sa.Column("storage_per_gb_month", sa.Float(), nullable=True),
    sa.Column("reservation_id", sa.String(), nullable=True),
    sa.Column("other_reservations", sa.String(), nullable=False),
    sa.Column("state", sa.String(), nullable=False),
    sa.Column("held_work", sa.Boolean(), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("accepted_at", sa.Float(), nullable=True),
    sa.Column("kill_at", sa.Float(), nullable=False),
    sa.Column("stopped_at", sa.Float(), nullable=True),
    sa.Column("ended_at", sa.Float(), nullable=True),
    sa.Column("idle_since", sa.Float(), nullable=True),
    sa.Column("last_gpu_util", sa.Float(), nullable=True),
    sa.Column("offer_json", sa.String(), nullable=False),
    sa.Column("spec_json", sa.String(), nullable=False),
    sa.CheckConstraint(
        "rate_usd_per_hour IS NULL OR (rate_usd_per_hour >= 0.0 AND rate_usd_per_hour <= 1000000000000000.0)",
        name="money_finite_rentals_rate_usd_per_hour",
    ),
    sa.PrimaryKeyConstraint("id"),
    sa.UniqueConstraint("label"),
    sa.Index("ix_rentals_instance_id", "instance_id"),
    sa.Index("ix_rentals_job", "job"),
    sa.Index("ix_rentals_state", "state"),
)
sa.Table(
    "risk_spans",
    _META,
    sa.Column("id", sa.String(), nullable=False),
    sa.Column("owner", sa.String(), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.Column("verified_at", sa.Float(), nullable=False),
    sa.Column("ended_at", sa.Float(), nullable=True),
    sa.Column("lost", sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint("id"),
    sa.Index("ix_risk_spans_owner", "owner"),
)
sa.Table(
    "standby_jobs",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("owner", sa.String(), nullable=False),
    sa.Column("n", sa.Integer(), nullable=False),
    sa.Column("purpose", sa.String(), nullable=False),
    sa.Column("key", sa.String(), nullable=False),
    sa.Column("created_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("job_id"),
    sa.UniqueConstraint("key"),
    sa.Index("ix_standby_jobs_owner", "owner"),
)
sa.Table(
    "step_leases",
    _META,
    sa.Column("key", sa.String(), nullable=False),
    sa.Column("holder", sa.String(), nullable=False),
    sa.Column("expires_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("key"),
)
sa.Table(
    "supervision",
    _META,
    sa.Column("job_id", sa.String(), nullable=False),
    sa.Column("seq", sa.Integer(), nullable=False),
    sa.Column("state_json", sa.String(), nullable=False),
    sa.Column("updated_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("job_id"),
)
sa.Table(
    "task_deliveries",
    _META,
    sa.Column("key", sa.String(), nullable=False),
    sa.Column("task", sa.String(), nullable=False),
    sa.Column("count", sa.Integer(), nullable=False),
    sa.Column("first_at", sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint("key"),
)


SQLITE_LEDGER_TRIGGERS = [
    """CREATE TRIGGER IF NOT EXISTS ledger_no_update BEFORE UPDATE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: UPDATE rejected'); END""",
    """CREATE TRIGGER IF NOT EXISTS ledger_no_delete BEFORE DELETE ON ledger_events
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: DELETE rejected'); END""",
    """CREATE TRIGGER IF NOT EXISTS ledger_no_replace BEFORE INSERT ON ledger_events
       WHEN EXISTS (SELECT 1 FROM ledger_events
                    WHERE seq = NEW.seq OR idempotency_key = NEW.idempotency_key)
       BEGIN SELECT RAISE(ABORT, 'ledger is append-only: insert over an existing row rejected'); END""",
]

PG_LEDGER_TRIGGERS = [
    """CREATE OR REPLACE FUNCTION tuneharness_ledger_reject() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'ledger is append-only: % rejected', TG_OP; END
       $$ LANGUAGE plpgsql""",
    "DROP TRIGGER IF EXISTS ledger_no_update ON ledger_events",
    """CREATE TRIGGER ledger_no_update BEFORE UPDATE OR DELETE ON ledger_events
       FOR EACH ROW EXECUTE FUNCTION tuneharness_ledger_reject()""",
    "DROP TRIGGER IF EXISTS ledger_no_truncate ON ledger_events",
    """CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger_events
       FOR EACH STATEMENT EXECUTE FUNCTION tuneharness_ledger_reject()""",
    "ALTER TABLE ledger_events ENABLE ALWAYS TRIGGER ledger_no_update",
    "ALTER TABLE ledger_events ENABLE ALWAYS TRIGGER ledger_no_truncate",
]

_MONEY_LIMIT = 1e15
_MONEY_COLUMNS = (
    ("budget_caps", "cap_usd", 0.0),
    ("budget_reservations", "amount_usd", 0.0),
    ("jobs", "budget_usd", 0.0),
    ("ledger_events", "amount_usd", -_MONEY_LIMIT),
    ("ledger_events", "rate_usd_per_hour", 0.0),
    ("rentals", "rate_usd_per_hour", 0.0),
)


def _money_condition(column: str, lowest: float, *, prefix: str = "") -> str:
    c = f"{prefix}{column}"
    return f"{c} IS NULL OR ({c} >= {lowest!r} AND {c} <= {_MONEY_LIMIT!r})"


def _create_missing(bind: sa.Connection) -> None:
    """Every table that is not there, with its indexes; an index missing from a table that is."""
    inspector = sa.inspect(bind)
    present = set(inspector.get_table_names())
    _META.create_all(bind, checkfirst=True)
    for table in _META.sorted_tables:
        if table.name not in present:
            continue
        have = {ix["name"] for ix in inspector.get_indexes(table.name)}
        for index in table.indexes:
            if index.name not in have:
                index.create(bind)


def _install_ledger_triggers(bind: sa.Connection) -> None:
    for stmt in PG_LEDGER_TRIGGERS if bind.dialect.name == "postgresql" else SQLITE_LEDGER_TRIGGERS:
        bind.execute(sa.text(stmt))


def _install_money_checks(bind: sa.Connection) -> None:
    """The money CHECK on a table made before it existed (the tables created above carry it)."""
    postgres = bind.dialect.name == "postgresql"
    for table, column, lowest in _MONEY_COLUMNS:
        name = f"money_finite_{table}_{column}"
        if postgres:
            exists = bind.execute(
                sa.text("SELECT 1 FROM pg_constraint WHERE conname = :n AND conrelid = to_regclass(:t)"),
                {"n": name, "t": table},
            ).first()
            if exists is not None:
                continue
            cond = _money_condition(column, lowest)
            bind.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({cond}) NOT VALID"))
            try:
                with bind.begin_nested():
                    bind.execute(sa.text(f"ALTER TABLE {table} VALIDATE CONSTRAINT {name}"))
            except sa.exc.DBAPIError:
                log.warning("%s holds rows with non-finite money: %s guards new rows only", table, name)
            continue
        created = bind.execute(
            sa.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"), {"t": table}
        ).scalar()
        if created is None or name in str(created):
            continue
        bad = f"NOT ({_money_condition(column, lowest, prefix='NEW.')})"
        msg = f"money check: {table}.{column} must be a finite amount"
        for op_name, when in (("insert", "INSERT"), ("update", f"UPDATE OF {column}")):
            bind.execute(
                sa.text(
                    f"CREATE TRIGGER IF NOT EXISTS {name}_{op_name} BEFORE {when} ON {table} "
                    f"WHEN {bad} BEGIN SELECT RAISE(ABORT, '{msg}'); END"
                )
            )


def upgrade() -> None:
    bind = op.get_bind()
    _create_missing(bind)
    _install_ledger_triggers(bind)
    _install_money_checks(bind)


def downgrade() -> None:
    raise NotImplementedError("the first revision is the base: there is nothing older to go back to")
