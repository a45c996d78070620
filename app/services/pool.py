"""Held verified hosts and standby jobs, durable: the real-time side of hold-and-batch, warm
standby and hedged recovery (the policy's `Hold`, `Adopt`, `WantStandby`, `hand_over`).

Two tables:

- `held_hosts`: one row per time a verified host was kept running for the next job instead of
  being stopped (`state` held -> adopted | released). The rental itself stays in `rentals`
  (its id, label and kill-time do not change), so the reaper, the reconciler and the budget
  monitor keep covering it; a job that adopts another job's host has the rental transferred to it
  (`Rentals.transfer`: its own reservation first, then its job and reservations change).
  `claim` is the only way out of `held` into `adopted`: a conditional UPDATE
  (`WHERE state = 'held'`) inside a write transaction, so two jobs never adopt the same host; the
  loser sees `None` and looks again. `unclaim` puts it back when the adopter's budget refuses.
- `standby_jobs`: provisioning jobs that rent a host for another job's recoveries (`owner`):
  `<owner>.standby-<n>`, keyed so a redelivered task never starts the same one twice. Their
  rentals are made under the owner's name (attempts from `n * STANDBY_ATTEMPT_BASE`), so the
  owner's budget reserves them, its SSH key opens them, and receipts attribute them to it.
- `job_pools`: how many standby hosts a job asked for (`needs.standby_hosts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.policy.fleet import RiskSpan
from app.policy.retry import HeldHost

__all__ = [
    "STANDBY_ATTEMPT_BASE",
    "Held",
    "HeldHostRow",
    "JobPoolRow",
    "Pool",
    "PullRateRow",
    "RiskSpanRow",
    "StandbyJob",
    "StandbyJobRow",
]

# A standby job's rentals are attempts n*1000+1, n*1000+2, ... of its owner (the owner's own
# attempts stay below 1000: the create cap is 25).
STANDBY_ATTEMPT_BASE = 1000
_LOCK = "tuneharness.held_hosts"


class HeldHostRow(SQLModel, table=True):
    """A verified host kept running for the next compatible job (or for a job's recoveries)."""

    __tablename__ = "held_hosts"

    id: str = Field(primary_key=True)  # "<instance>@<job that released it>"
    provider: str
    instance_id: str = Field(index=True)
    machine_id: str
    rental_id: str
    owner: str = Field(index=True)  # the rental's job when held (an adopter from another job takes the rental over)
    released_by: str  # the job (or standby job) whose decision held it
    gpu_name: str
    gpu_ram_gb: float
    num_gpus: int
    dph_total: float
    verified_at: float
    hold_until: float
    standby: bool = False  # kept for the owner's recoveries only
    held_work: bool = False  # trained a job already: automation may only stop it
    state: str = Field(index=True)  # held | adopted | released
    adopted_by: str | None = None
    ended_at: float | None = None
    end_reason: str | None = None


class StandbyJobRow(SQLModel, table=True):
    """A provisioning job that rents a verified host for `owner`'s recoveries."""

    __tablename__ = "standby_jobs"

    job_id: str = Field(primary_key=True)  # "<owner>.standby-<n>"
    owner: str = Field(index=True)
    n: int
    purpose: str  # pool (standby_hosts) | hedge (WantStandby) | hand_over (a recovery's own attempt)
    key: str = Field(unique=True)  # "<owner>:<purpose>:<what asked>": a redelivered task adds none
    created_at: float


class RiskSpanRow(SQLModel, table=True):
    """A verified host exposed to being lost (training, or waiting as standby) from its verification
    to its end: the record the standby pool's size is judged on (`app.policy.fleet.exposure`)."""

    __tablename__ = "risk_spans"

    id: str = Field(primary_key=True)  # "<provider>:<instance>"
    owner: str = Field(index=True)
    created_at: float
    verified_at: float
    ended_at: float | None = None
    lost: bool = False


class PullRateRow(SQLModel, table=True):
    """A pull rate watched on the marketplace (a finished boot's, or a killed pull's): the median
    says how long a fresh rental's pull would take (progress-aware hedging)."""

    __tablename__ = "pull_rates"

    id: str = Field(primary_key=True)  # "<provider>:<instance>"
    rate_gb_per_s: float
    at: float


class JobPoolRow(SQLModel, table=True):
    """How many verified standby hosts a job keeps while it runs."""

    __tablename__ = "job_pools"

    job_id: str = Field(primary_key=True)
    standby_hosts: int = 0


_H = HeldHostRow.__table__  # type: ignore[attr-defined]
_S = StandbyJobRow.__table__  # type: ignore[attr-defined]
_P = JobPoolRow.__table__  # type: ignore[attr-defined]
_R = RiskSpanRow.__table__  # type: ignore[attr-defined]
_U = PullRateRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class Held:
    id: str
    provider: str
    instance_id: str
    machine_id: str
    rental_id: str
    owner: str
    released_by: str
    gpu_name: str
    gpu_ram_gb: float
    num_gpus: int
    dph_total: float
    verified_at: float
    hold_until: float
    standby: bool
    held_work: bool
    state: str
    adopted_by: str | None
    ended_at: float | None
    end_reason: str | None

    def policy_view(self) -> HeldHost:
        """What the pure policy sees of it."""
        return HeldHost(
            instance_id=self.instance_id,
            machine_id=self.machine_id,
            provider=self.provider,
            gpu_name=self.gpu_name,
            gpu_ram_gb=self.gpu_ram_gb,
            num_gpus=self.num_gpus,
            dph_total=self.dph_total,
            held_since=self.verified_at,
            hold_until=self.hold_until,
            standby=self.standby,
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class StandbyJob:
    job_id: str
    owner: str
    n: int
    purpose: str


def _held(r: Any) -> Held:
    return Held(
        r.id,
        r.provider,
        r.instance_id,
        r.machine_id,
        r.rental_id,
        r.owner,
        r.released_by,
        r.gpu_name,
        float(r.gpu_ram_gb),
        int(r.num_gpus),
        float(r.dph_total),
        float(r.verified_at),
        float(r.hold_until),
        bool(r.standby),
        bool(r.held_work),
        r.state,
        r.adopted_by,
        r.ended_at,
        r.end_reason,
    )


class Pool:
    """The three tables above, on one database; every state change under one write lock."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- held hosts ---------------------------------------------------------------------------
    def hold(
        self, *, host: HeldHost, rental_id: str, owner: str, released_by: str, held_work: bool, hold_until: float
    ) -> Held | None:
        """Record a held host (idempotent per instance and releasing job); None if already recorded."""
        row_id = f"{host.instance_id}@{released_by}"
        with write_transaction(self.engine, lock=_LOCK) as conn:
            if conn.execute(select(_H.c.id).where(_H.c.id == row_id)).first() is not None:
                return None
            conn.execute(
                _H.insert().values(
                    id=row_id,
                    provider=host.provider,
                    instance_id=host.instance_id,
                    machine_id=host.machine_id,
                    rental_id=rental_id,
                    owner=owner,
                    released_by=released_by,
                    gpu_name=host.gpu_name,
                    gpu_ram_gb=host.gpu_ram_gb,
                    num_gpus=host.num_gpus,
                    dph_total=host.dph_total,
                    verified_at=host.held_since,
                    hold_until=hold_until,
                    standby=host.standby,
                    held_work=held_work,
                    state="held",
                )
            )
        return self.get(row_id)

    def get(self, row_id: str) -> Held | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_H).where(_H.c.id == row_id)).first()
        return None if r is None else _held(r)

    def held(self, *, owner: str | None = None, states: Sequence[str] = ("held",)) -> list[Held]:
        q = select(_H).where(_H.c.state.in_(list(states))).order_by(_H.c.verified_at, _H.c.id)
        if owner is not None:
            q = q.where(_H.c.owner == owner)
        with read_connection(self.engine) as conn:
            return [_held(r) for r in conn.execute(q)]

    def claim(self, instance_id: str, *, job_id: str, now: float, once_since: float | None = None) -> Held | None:
        """Take the held host for `job_id`: exactly one caller wins; None for everyone else.

        `once_since`: refuse (None) if `job_id` already adopted a host at or after that time. A
        recovering job passes its loss time, so that two of its steps running at once (two
        standby hosts verified at the same moment each offer theirs) adopt one host between them.
        """
        with write_transaction(self.engine, lock=_LOCK) as conn:
            r = conn.execute(select(_H).where(_H.c.instance_id == instance_id, _H.c.state == "held")).first()
            if r is None or float(r.hold_until) <= now:
                return None
            if (
                once_since is not None
                and conn.execute(
                    select(_H.c.id).where(
                        _H.c.adopted_by == job_id, _H.c.state == "adopted", _H.c.ended_at >= once_since
                    )
                ).first()
                is not None
            ):
                return None
            moved = conn.execute(
                _H.update()
                .where(_H.c.id == r.id, _H.c.state == "held")
                .values(state="adopted", adopted_by=job_id, ended_at=now, end_reason=f"adopted by {job_id}")
            )
            if moved.rowcount != 1:
                return None
        return self.get(str(r.id))

    def adopted_since(self, job_id: str, since: float) -> Held | None:
        """The host `job_id` adopted at or after `since`, if any."""
        with read_connection(self.engine) as conn:
            r = conn.execute(
                select(_H).where(_H.c.adopted_by == job_id, _H.c.state == "adopted", _H.c.ended_at >= since)
            ).first()
        return None if r is None else self.get(str(r.id))

    def unclaim(self, row_id: str, *, job_id: str) -> bool:
        """Put a host `job_id` claimed back on hold (its budget refused the adoption)."""
        with write_transaction(self.engine, lock=_LOCK) as conn:
            moved = conn.execute(
                _H.update()
                .where(_H.c.id == row_id, _H.c.state == "adopted", _H.c.adopted_by == job_id)
                .values(state="held", adopted_by=None, ended_at=None, end_reason=None)
            )
            return bool(moved.rowcount == 1)

    def end(self, row_id: str, *, reason: str, now: float, from_states: Sequence[str] = ("held",)) -> bool:
        """Mark a held host released (the caller then stops or destroys it); True for the one caller that moved it."""
        with write_transaction(self.engine, lock=_LOCK) as conn:
            moved = conn.execute(
                _H.update()
                .where(_H.c.id == row_id, _H.c.state.in_(list(from_states)))
                .values(state="released", ended_at=now, end_reason=reason)
            )
            return bool(moved.rowcount == 1)

    def renew(self, row_id: str, *, hold_until: float, standby: bool | None = None) -> bool:
        """A new end for a host still held (and, if given, whether it now waits as standby)."""
        values: dict[str, Any] = {"hold_until": hold_until}
        if standby is not None:
            values["standby"] = standby
        with write_transaction(self.engine, lock=_LOCK) as conn:
            moved = conn.execute(_H.update().where(_H.c.id == row_id, _H.c.state == "held").values(**values))
            return bool(moved.rowcount == 1)

    def held_until(self) -> dict[tuple[str, str], float]:
        """(provider, instance) -> hold_until of every host held now (the idle watchdog leaves them be)."""
        return {(h.provider, h.instance_id): h.hold_until for h in self.held()}

    # -- standby jobs -------------------------------------------------------------------------
    def new_standby(self, owner: str, *, purpose: str, key: str, now: float) -> tuple[StandbyJob, bool]:
        """The standby job for `key` (made now if new); True when it was made by this call."""
        with write_transaction(self.engine, lock=f"{_LOCK}.standby.{owner}") as conn:
            r = conn.execute(select(_S).where(_S.c.key == key)).first()
            if r is not None:
                return StandbyJob(r.job_id, r.owner, int(r.n), r.purpose), False
            n = (
                int(conn.execute(select(func.coalesce(func.max(_S.c.n), 0)).where(_S.c.owner == owner)).scalar_one())
                + 1
            )
            job_id = f"{owner}.standby-{n}"
            conn.execute(_S.insert().values(job_id=job_id, owner=owner, n=n, purpose=purpose, key=key, created_at=now))
        return StandbyJob(job_id, owner, n, purpose), True

    def standby_job(self, job_id: str) -> StandbyJob | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_S).where(_S.c.job_id == job_id)).first()
        return None if r is None else StandbyJob(r.job_id, r.owner, int(r.n), r.purpose)

    def standby_jobs(self, owner: str | None = None) -> list[StandbyJob]:
        q = select(_S).order_by(_S.c.owner, _S.c.n)
        if owner is not None:
            q = q.where(_S.c.owner == owner)
        with read_connection(self.engine) as conn:
            return [StandbyJob(r.job_id, r.owner, int(r.n), r.purpose) for r in conn.execute(q)]

    # -- pools ----------------------------------------------------------------------------------
    def set_pool(self, job_id: str, standby_hosts: int) -> None:
        with write_transaction(self.engine, lock=f"{_LOCK}.pool") as conn:
            if conn.execute(select(_P.c.job_id).where(_P.c.job_id == job_id)).first() is None:
                conn.execute(_P.insert().values(job_id=job_id, standby_hosts=standby_hosts))
            else:
                conn.execute(_P.update().where(_P.c.job_id == job_id).values(standby_hosts=standby_hosts))

    def pool_size(self, job_id: str) -> int:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_P.c.standby_hosts).where(_P.c.job_id == job_id)).first()
        return 0 if r is None else int(r.standby_hosts)

    def pools(self) -> dict[str, int]:
        with read_connection(self.engine) as conn:
            return {r.job_id: int(r.standby_hosts) for r in conn.execute(select(_P)) if int(r.standby_hosts) > 0}

    # -- the loss record --------------------------------------------------------------------------
    def at_risk(self, provider: str, instance_id: str, *, owner: str, created_at: float, now: float) -> None:
        """A verified host is now exposed to being lost (idempotent while its span is open)."""
        key = f"{provider}:{instance_id}"
        with write_transaction(self.engine, lock=f"{_LOCK}.risk") as conn:
            if conn.execute(select(_R.c.id).where(_R.c.id == key)).first() is None:
                conn.execute(_R.insert().values(id=key, owner=owner, created_at=created_at, verified_at=now))

    def off_risk(self, provider: str, instance_id: str, *, lost: bool, now: float) -> None:
        """The host's exposure ended (`lost`: it was lost or hung)."""
        with write_transaction(self.engine, lock=f"{_LOCK}.risk") as conn:
            conn.execute(
                _R.update()
                .where(_R.c.id == f"{provider}:{instance_id}", _R.c.ended_at.is_(None))
                .values(ended_at=now, lost=lost)
            )

    def spans(self) -> list[RiskSpan]:
        with read_connection(self.engine) as conn:
            return [
                RiskSpan(
                    created_at=float(r.created_at),
                    verified_at=float(r.verified_at),
                    ended_at=None if r.ended_at is None else float(r.ended_at),
                    lost=bool(r.lost),
                    owner=r.owner,
                )
                for r in conn.execute(select(_R))
            ]

    # -- pull rates -------------------------------------------------------------------------------
    def note_pull_rate(self, provider: str, instance_id: str, rate_gb_per_s: float, *, now: float) -> None:
        """Remember one pull's rate (once per instance)."""
        key = f"{provider}:{instance_id}"
        with write_transaction(self.engine, lock=f"{_LOCK}.pulls") as conn:
            if conn.execute(select(_U.c.id).where(_U.c.id == key)).first() is None:
                conn.execute(_U.insert().values(id=key, rate_gb_per_s=rate_gb_per_s, at=now))

    def pull_rates(self) -> list[float]:
        with read_connection(self.engine) as conn:
            return [float(r) for r in conn.execute(select(_U.c.rate_gb_per_s).order_by(_U.c.at)).scalars()]
