"""A research run's state in the fleet's database, and the files exported from it.

A run's `research_tick` may run on any worker, on any machine, each with its own
`TUNEHARNESS_HOME`; only the database is shared. So the run lives in two tables:

- `research_runs`: the validated research file (JSON), the policy's state (JSON), the best config,
  the tick chain's number, the writer's lease and the state's sequence number, the stopped flag.
- `research_experiments`: one row per experiment with exactly the fields of an
  `experiments.jsonl` line, unique on (run, experiment): a repeated tick never records one twice.
  Rows are never updated or deleted (the database refuses it, as it does for the ledger).

One writer at a time: a writer takes the run's lease in a short transaction under the run's
database lock (`app.db.write_transaction`: an advisory lock on PostgreSQL, the write lock on
SQLite), applies its effects with the lock released (they write to the same database), and saves
the state only if the sequence number is still the one it read (compare-and-set). A writer that
died releases the run when its lease runs out.

`experiments.jsonl`, `best.json` and `board.md` under `TUNEHARNESS_HOME/research/<run>/` are an
export, regenerated whole from the tables (atomic writes) on the machine that ticks, shows or
prints the board.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import CheckConstraint, Connection, Engine, UniqueConstraint, event, func, select, text
from sqlalchemy.exc import IntegrityError
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import TuneharnessError, UserError
from app.research import EXPERIMENT_FIELDS, render_board

__all__ = [
    "EXPERIMENTS_GUARD_PG",
    "EXPERIMENTS_GUARD_SQLITE",
    "LEASE_S",
    "WAIT_S",
    "ResearchBusy",
    "ResearchConflict",
    "ResearchExperimentRow",
    "ResearchRunRow",
    "ResearchRunStore",
    "research_runs",
]

# A writer that has not released the run after this long is taken to have died.
LEASE_S = 300.0
# How long a writer waits for another one's lease before giving up.
WAIT_S = 120.0

_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# The keys of an experiments.jsonl line stored as JSON text (their values may be lists, maps or either type).
_JSON_FIELDS = (
    "old",
    "new",
    "parent",
    "config",
    "seeds",
    "metric_per_seed",
    "jobs",
    "hosts",
    "gpu_models",
    "tflops",
    "steps",
)


class ResearchBusy(UserError):
    """Another writer holds the run's lease."""


class ResearchConflict(TuneharnessError):
    """The run's state moved on under this writer (its lease ran out and another took over)."""


class ResearchRunRow(SQLModel, table=True):
    __tablename__ = "research_runs"

    run_id: str = Field(primary_key=True)
    spec_json: str  # the validated research file (app.research.ResearchFile.to_dict)
    state_json: str | None = None  # the policy's state (app.policy.research.dump_state); None before the start
    best_json: str | None = None  # best.json
    seq: int = 0  # bumped by every saved state: the compare-and-set of the one-writer rule
    tick_seq: int = 0  # the number the next research_tick of the chain must carry
    ticked_at: float | None = None  # when the chain last claimed a tick
    writer: str | None = None  # the lease holder's token
    writer_until: float | None = None
    stopped: bool = False
    created_at: float
    updated_at: float


class ResearchExperimentRow(SQLModel, table=True):
    __tablename__ = "research_experiments"
    __table_args__ = (
        CheckConstraint("usd IS NULL OR (usd >= 0.0 AND usd <= 1e15)", name="money_finite_research_experiments_usd"),
        UniqueConstraint("run", "exp", name="uq_research_experiments_run_exp"),
    )

    id: int | None = Field(default=None, primary_key=True)  # the order experiments were recorded in
    run: str
    exp: str
    iteration: int
    axis: str | None = None
    old_json: str
    new_json: str
    parent_json: str
    config_json: str
    seeds_json: str
    metric: str
    metric_per_seed_json: str
    mean: float | None = None
    best_mean: float | None = None
    noise: float | None = None
    verdict: str
    why: str
    status: str
    jobs_json: str
    hosts_json: str
    gpu_models_json: str
    tflops_json: str
    wall_s: float
    steps_json: str
    usd: float
    recorded_at: float


_R = ResearchRunRow.__table__  # type: ignore[attr-defined]
_E = ResearchExperimentRow.__table__  # type: ignore[attr-defined]

# research_experiments is append-only: the database refuses UPDATE and DELETE (the migration installs the
# same statements; a database made at the newest revision gets them from these hooks).
EXPERIMENTS_GUARD_SQLITE = (
    """CREATE TRIGGER research_experiments_no_update BEFORE UPDATE ON research_experiments
       BEGIN SELECT RAISE(ABORT, 'research_experiments is append-only: UPDATE rejected'); END""",
    """CREATE TRIGGER research_experiments_no_delete BEFORE DELETE ON research_experiments
       BEGIN SELECT RAISE(ABORT, 'research_experiments is append-only: DELETE rejected'); END""",
)
EXPERIMENTS_GUARD_PG = (
    """CREATE OR REPLACE FUNCTION tuneharness_research_experiments_reject() RETURNS trigger AS $$
       BEGIN RAISE EXCEPTION 'research_experiments is append-only: % rejected', TG_OP; END
       $$ LANGUAGE plpgsql""",
    """CREATE TRIGGER research_experiments_no_update BEFORE UPDATE OR DELETE ON research_experiments
       FOR EACH ROW EXECUTE FUNCTION tuneharness_research_experiments_reject()""",
)


@event.listens_for(_E, "after_create")
def _install_experiments_guard(_table: Any, connection: Connection, **_kw: Any) -> None:
    guard = EXPERIMENTS_GUARD_PG if connection.dialect.name == "postgresql" else EXPERIMENTS_GUARD_SQLITE
    for stmt in guard:
        connection.execute(text(stmt))


def _unknown(run_id: str) -> UserError:
    return UserError(f"no research run {run_id!r}. Fix: pick one from `tuneharness research board`")


def _fsync_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")  # two writers on one home never share it
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _row_to_line(row: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in EXPERIMENT_FIELDS:
        out[key] = json.loads(getattr(row, f"{key}_json")) if key in _JSON_FIELDS else getattr(row, key)
    return out


def _line_to_values(record: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key in EXPERIMENT_FIELDS:
        if key in _JSON_FIELDS:
            values[f"{key}_json"] = json.dumps(record[key])
        else:
            values[key] = record[key]
    return values


def research_runs(engine: Engine) -> list[str]:
    """Every run's id, oldest first."""
    with read_connection(engine) as conn:
        return [str(r) for r in conn.execute(select(_R.c.run_id).order_by(_R.c.created_at, _R.c.run_id)).scalars()]


class ResearchRunStore:
    """One run's rows, and the directory its files are exported to on this machine."""

    def __init__(self, engine: Engine, root: Path, run_id: str, *, clock: Any = time.time) -> None:
        if not _RUN_ID.match(run_id):
            raise _unknown(run_id)
        self.engine, self.run_id, self.dir, self.clock = engine, run_id, root / run_id, clock
        self._lock = f"tuneharness.research.{run_id}"

    def _row(self) -> Any:
        with read_connection(self.engine) as conn:
            return conn.execute(select(_R).where(_R.c.run_id == self.run_id)).first()

    def exists(self) -> bool:
        return self._row() is not None

    def create(self, spec: Mapping[str, Any]) -> None:
        now = self.clock()
        with write_transaction(self.engine, lock=self._lock) as conn:
            conn.execute(
                _R.insert().values(
                    run_id=self.run_id, spec_json=json.dumps(dict(spec), sort_keys=True), created_at=now, updated_at=now
                )
            )

    def spec(self) -> dict[str, Any]:
        row = self._row()
        if row is None:
            raise _unknown(self.run_id)
        return dict(json.loads(row.spec_json))

    def load(self) -> tuple[dict[str, Any] | None, int]:
        """The saved state (None before the run started) and its sequence number."""
        row = self._row()
        if row is None:
            raise _unknown(self.run_id)
        return (None if row.state_json is None else dict(json.loads(row.state_json))), int(row.seq)

    def state(self) -> dict[str, Any] | None:
        return self.load()[0]

    def stopped(self) -> bool:
        row = self._row()
        return bool(row is not None and row.stopped)

    def save_state(
        self, state: Mapping[str, Any], *, expect_seq: int | None = None, stopped: bool | None = None
    ) -> int:
        """Write the state; with `expect_seq`, only if no other writer saved one since (else ResearchConflict).
        Returns the new sequence number."""
        with write_transaction(self.engine, lock=self._lock) as conn:
            row = conn.execute(select(_R.c.seq).where(_R.c.run_id == self.run_id)).first()
            if row is None:
                raise _unknown(self.run_id)
            if expect_seq is not None and int(row.seq) != expect_seq:
                raise ResearchConflict(
                    f"research run {self.run_id}: state {row.seq} was saved by another writer (expected {expect_seq})"
                )
            seq = int(row.seq) + 1
            values: dict[str, Any] = {
                "state_json": json.dumps(dict(state), sort_keys=True),
                "seq": seq,
                "updated_at": self.clock(),
            }
            if stopped is not None:
                values["stopped"] = stopped
            conn.execute(_R.update().where(_R.c.run_id == self.run_id).values(**values))
        return seq

    # -- the one-writer rule ---------------------------------------------------------------------------
    def _take(self, token: str) -> bool:
        now = self.clock()
        with write_transaction(self.engine, lock=self._lock) as conn:
            row = conn.execute(select(_R.c.writer, _R.c.writer_until).where(_R.c.run_id == self.run_id)).first()
            if row is None:
                raise _unknown(self.run_id)
            if row.writer is not None and row.writer_until is not None and row.writer_until > now:
                return False
            conn.execute(_R.update().where(_R.c.run_id == self.run_id).values(writer=token, writer_until=now + LEASE_S))
            return True

    def _release(self, token: str) -> None:
        with write_transaction(self.engine, lock=self._lock) as conn:
            conn.execute(
                _R.update()
                .where(_R.c.run_id == self.run_id, _R.c.writer == token)
                .values(writer=None, writer_until=None)
            )

    @contextmanager
    def locked(self, *, wait_s: float = WAIT_S) -> Iterator[None]:
        """Hold the run's lease: one writer at a time (a tick on any machine, a stop)."""
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait_s
        while not self._take(token):
            if time.monotonic() >= deadline:
                raise ResearchBusy(
                    f"research run {self.run_id} is held by another writer (a tick or a stop). "
                    "Fix: run the command again in a minute"
                )
            time.sleep(0.2)
        try:
            yield
        finally:
            self._release(token)

    # -- the tick chain -------------------------------------------------------------------------------
    def claim_tick(self, seq: int) -> bool:
        """Move the chain's number on from `seq`; False when the number is not `seq` (a duplicate tick)."""
        with write_transaction(self.engine, lock=self._lock) as conn:
            row = conn.execute(select(_R.c.tick_seq).where(_R.c.run_id == self.run_id)).first()
            if row is None:
                raise _unknown(self.run_id)
            if int(row.tick_seq) != seq:
                return False
            conn.execute(_R.update().where(_R.c.run_id == self.run_id).values(tick_seq=seq + 1, ticked_at=self.clock()))
            return True

    def tick_seq(self) -> int:
        row = self._row()
        return 0 if row is None else int(row.tick_seq)

    def tick_age_s(self) -> float | None:
        row = self._row()
        return None if row is None or row.ticked_at is None else self.clock() - float(row.ticked_at)

    # -- experiments and the best ---------------------------------------------------------------------
    def experiments(self) -> list[dict[str, Any]]:
        """Every recorded experiment, in the order they were recorded."""
        with read_connection(self.engine) as conn:
            rows = conn.execute(select(_E).where(_E.c.run == self.run_id).order_by(_E.c.id)).all()
        return [_row_to_line(r) for r in rows]

    def append(self, record: Mapping[str, Any]) -> bool:
        """Record one experiment unless it is there already; True when written."""
        if record["run"] != self.run_id:
            raise ValueError(f"experiment of run {record['run']} recorded under {self.run_id}")
        with write_transaction(self.engine, lock=self._lock) as conn:
            found = conn.execute(select(func.count()).where(_E.c.run == self.run_id, _E.c.exp == record["exp"]))
            if found.scalar_one():
                return False
            try:
                conn.execute(_E.insert().values(**_line_to_values(record), recorded_at=self.clock()))
            except IntegrityError:  # pragma: no cover - the unique key, if a writer slipped past the lock
                return False
        return True

    def best(self) -> dict[str, Any] | None:
        row = self._row()
        return None if row is None or row.best_json is None else dict(json.loads(row.best_json))

    def write_best(self, best: Mapping[str, Any]) -> None:
        with write_transaction(self.engine, lock=self._lock) as conn:
            conn.execute(
                _R.update()
                .where(_R.c.run_id == self.run_id)
                .values(best_json=json.dumps(dict(best), sort_keys=True), updated_at=self.clock())
            )

    # -- the files ------------------------------------------------------------------------------------
    def export(self) -> Path:
        """Write experiments.jsonl (the whole history, in order), best.json and board.md from the database
        into this machine's run directory, each atomically; returns the directory."""
        state, _ = self.load()
        lines = self.experiments()
        self.dir.mkdir(parents=True, exist_ok=True)
        _fsync_write(self.dir / "experiments.jsonl", "".join(json.dumps(r) + "\n" for r in lines).encode())
        best = self.best()
        if best is not None:
            _fsync_write(self.dir / "best.json", json.dumps(best, indent=1, sort_keys=True).encode())
        _fsync_write(self.dir / "board.md", render_board(self.run_id, lines, state).encode())
        return self.dir
