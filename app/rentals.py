"""Our own record of every instance we rent, and the create protocol that never leaks one.

A create is four steps, each safe to crash after:

1. reserve the budget (idempotent per job and attempt);
2. write the *intent*: a row with the label (job, attempt and kill-time inside it) before the
   provider hears of it;
3. ask the provider; a retried create first looks for its label at the provider and adopts
   what it finds instead of creating again;
4. record the instance id and the ledger event `instance_created`.

A crash between 3 and 4 leaves an intent without an id and an instance carrying its label; the
reconciler joins the two (adopts the instance, then stops it if nobody claims it). Nothing here
destroys an instance that held work: `destroy(by="automation")` refuses unless the instance
never held the job's work (money invariant 3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Connection, Engine, func, select
from sqlmodel import Field, SQLModel

from app.budget import Budget, Reservation, in_chunks
from app.db import money_check, read_connection, write_transaction
from app.errors import TuneharnessError, UserError
from app.ledger import Event, Ledger
from app.market import OFFER_FIELDS, CreateUnconfirmed, LaunchSpec, Market, Offer
from app.policy.guardrails import LABEL_PREFIX, label_for, parse_label
from app.services.leases import StepLeases

__all__ = [
    "LABEL_PREFIX",
    "DestroyRefused",
    "Rental",
    "RentalRow",
    "RentalTrafficRow",
    "RentalTransferRow",
    "Rentals",
    "Transfer",
    "billed_usd",
    "label_for",
    "parse_label",
]

FaultHook = Callable[[str], None]

MAX_EXTEND_S = 7 * 24 * 3600.0  # one deliberate extension of a kill-time: a week at most

RentalState = Literal["intent", "active", "stopped", "destroyed", "lost", "abandoned"]


def _no_fault(_step: str) -> None:
    return None


class DestroyRefused(TuneharnessError):
    """Automation asked to destroy an instance that held the job's work: only the operator may."""


class RentalRow(SQLModel, table=True):
    __tablename__ = "rentals"
    __table_args__ = (money_check("rentals", "rate_usd_per_hour"),)

    id: str = Field(primary_key=True)  # "<job>:<attempt>"
    job: str = Field(index=True)
    attempt: int
    provider: str
    offer_id: str
    machine_id: str | None = None
    label: str = Field(unique=True)
    instance_id: str | None = Field(default=None, index=True)
    rate_usd_per_hour: float | None = None
    disk_gb: float = 0.0
    storage_per_gb_month: float | None = None
    reservation_id: str | None = None
    other_reservations: str = ""  # comma-separated: the period and GPU-minute caps' reservations
    state: str = Field(index=True)
    held_work: bool = False
    created_at: float
    accepted_at: float | None = None
    kill_at: float
    stopped_at: float | None = None
    ended_at: float | None = None
    idle_since: float | None = None
    last_gpu_util: float | None = None
    offer_json: str = "{}"
    spec_json: str = "{}"  # the launch spec: image, disk, env, onstart, public key (never a secret)


class RentalTransferRow(SQLModel, table=True):
    """A rental changed hands: a held host adopted by another job is that job's from `at` on."""

    __tablename__ = "rental_transfers"

    id: str = Field(primary_key=True)  # "<rental>@<to_job>"
    rental_id: str = Field(index=True)
    from_job: str
    to_job: str
    at: float
    rate_usd_per_hour: float | None = None
    settled_usd: float = 0.0  # what the rental had billed `from_job` when it changed hands
    old_reservations: str = ""  # comma-separated: `from_job`'s, settled at `at`
    new_reservations: str = ""  # comma-separated: `to_job`'s, committed before the transfer


class RentalTrafficRow(SQLModel, table=True):
    """Bytes moved onto or off a rental's host (job files pushed, a model the host fetched): billed
    at the offer's traffic price. One row per move, keyed so that a repeated record counts once."""

    __tablename__ = "rental_traffic"

    id: str = Field(primary_key=True)  # "<rental>:<key>"
    rental_id: str = Field(index=True)
    job: str
    nbytes: int
    at: float


class RentalSendRow(SQLModel, table=True):
    """A create sent to the vendor for a rental, written just before the call: a rental with a send
    and no instance may exist at the vendor (the answer was lost, or the process died while it
    waited), so it is looked for by its label and never created a second time."""

    __tablename__ = "rental_sends"

    rental_id: str = Field(primary_key=True)
    sent_at: float


@dataclass(frozen=True, slots=True)
class Transfer:
    rental_id: str
    from_job: str
    to_job: str
    at: float
    rate_usd_per_hour: float | None
    settled_usd: float


@dataclass(frozen=True, slots=True)
class Rental:
    id: str
    job: str
    attempt: int
    provider: str
    offer_id: str
    machine_id: str | None
    label: str
    instance_id: str | None
    rate_usd_per_hour: float | None
    disk_gb: float
    storage_per_gb_month: float | None
    reservation_id: str | None
    state: str
    held_work: bool
    created_at: float
    accepted_at: float | None
    kill_at: float
    stopped_at: float | None
    ended_at: float | None
    idle_since: float | None
    last_gpu_util: float | None

    @property
    def billing_gpu(self) -> bool:
        return self.state in ("intent", "active")

    @property
    def opened_by(self) -> str:
        """The job the host was launched for: its public key is the one on the host. The rental id
        (`<job>:<attempt>`) never changes, also when the rental is transferred to another job."""
        return self.id.rsplit(":", 1)[0]


_T = RentalRow.__table__  # type: ignore[attr-defined]
_X = RentalTransferRow.__table__  # type: ignore[attr-defined]
_N = RentalTrafficRow.__table__  # type: ignore[attr-defined]
_S = RentalSendRow.__table__  # type: ignore[attr-defined]
BYTES_PER_GB = 1e9


def _row(r: Any) -> Rental:
    return Rental(
        r.id,
        r.job,
        r.attempt,
        r.provider,
        r.offer_id,
        r.machine_id,
        r.label,
        r.instance_id,
        r.rate_usd_per_hour,
        r.disk_gb,
        r.storage_per_gb_month,
        r.reservation_id,
        r.state,
        bool(r.held_work),
        r.created_at,
        r.accepted_at,
        r.kill_at,
        r.stopped_at,
        r.ended_at,
        r.idle_since,
        r.last_gpu_util,
    )


def _offer_json(offer: Offer) -> str:
    return json.dumps(
        {k: getattr(offer, k) for k in OFFER_FIELDS},
        sort_keys=True,
    )


def offer_from_json(text: str) -> Offer:
    return Offer(**json.loads(text))


class Rentals:
    """The registry of rentals plus the create/stop/destroy protocol, on one database."""

    def __init__(self, engine: Engine, *, ledger: Ledger | None = None, budget: Budget | None = None) -> None:
        self.engine = engine
        self.ledger = ledger or Ledger(engine)
        self.budget = budget or Budget(engine, self.ledger)

    # -- reads ------------------------------------------------------------------------------
    def get(self, rental_id: str) -> Rental | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_T).where(_T.c.id == rental_id)).first()
        return None if r is None else _row(r)

    def by_instance(self, provider: str, instance_id: str) -> Rental | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_T).where(_T.c.provider == provider, _T.c.instance_id == instance_id)).first()
        return None if r is None else _row(r)

    def by_label(self, label: str) -> Rental | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_T).where(_T.c.label == label)).first()
        return None if r is None else _row(r)

    def all(self, *, states: Sequence[str] | None = None, job: str | None = None) -> list[Rental]:
        q = select(_T).order_by(_T.c.created_at, _T.c.id)
        if states is not None:
            q = q.where(_T.c.state.in_(list(states)))
        if job is not None:
            q = q.where(_T.c.job == job)
        with read_connection(self.engine) as conn:
            return [_row(r) for r in conn.execute(q)]

    def billing(self, *, job: str | None = None, holding: Collection[str] | None = None) -> list[Rental]:
        """Every rental that bills or may bill: active, stopped, and intents whose create was sent
        (the vendor may have rented it and its answer was lost: it bills from its create, unseen).

        `job`: only that job's. `holding`: only those that may hold one of these reservations (its
        first reservation among them, or any with further reservations; callers match exactly), so
        one job's caps are read without loading the whole fleet."""
        sent = select(_S.c.rental_id)
        q = (
            select(_T)
            .where(_T.c.state.in_(("active", "stopped")) | ((_T.c.state == "intent") & _T.c.id.in_(sent)))
            .order_by(_T.c.created_at, _T.c.id)
        )
        if job is not None:
            q = q.where(_T.c.job == job)
        if holding is not None:
            q = q.where(_T.c.reservation_id.in_(list(holding)) | (func.coalesce(_T.c.other_reservations, "") != ""))
        with read_connection(self.engine) as conn:
            return [_row(r) for r in conn.execute(q)]

    def offer_of(self, rental_id: str) -> Offer:
        with read_connection(self.engine) as conn:
            text = conn.execute(select(_T.c.offer_json).where(_T.c.id == rental_id)).scalar_one()
        return offer_from_json(str(text))

    # -- the create protocol ----------------------------------------------------------------
    def spec_of(self, rental_id: str) -> LaunchSpec:
        with read_connection(self.engine) as conn:
            text = conn.execute(select(_T.c.spec_json).where(_T.c.id == rental_id)).scalar_one()
        raw = json.loads(str(text))
        return LaunchSpec(
            image=raw["image"],
            disk_gb=raw["disk_gb"],
            label=raw.get("label", ""),
            ssh_public_key=raw["ssh_public_key"],
            env=raw.get("env", {}),
            onstart=raw.get("onstart", ""),
        )

    def plan(
        self,
        *,
        job: str,
        attempt: int,
        offer: Offer,
        disk_gb: float,
        ttl_s: float,
        now: float,
        reserve_usd: float,
        budget_name: str,
        spec: LaunchSpec | None = None,
    ) -> Rental:
        """Steps 1 and 2: reserve, then write the intent. Idempotent per (job, attempt)."""
        rental_id = f"{job}:{attempt}"
        existing = self.get(rental_id)
        if existing is not None:
            return existing
        made = self.reserve_for(
            job=job,
            budget_name=budget_name,
            reserve_usd=reserve_usd,
            dph_total=offer.dph_total,
            num_gpus=offer.num_gpus,
            max_s=ttl_s,
            idempotency_key=f"reserve:{rental_id}",
            now=now,
        )
        reservation = made[0]
        others = ",".join(r.id for r in made[1:])
        label = label_for(job, attempt, now + ttl_s)
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            if conn.execute(select(_T.c.id).where(_T.c.id == rental_id)).first() is None:
                conn.execute(
                    _T.insert().values(
                        id=rental_id,
                        job=job,
                        attempt=attempt,
                        provider=offer.provider,
                        offer_id=offer.offer_id,
                        machine_id=offer.machine_id,
                        label=label,
                        rate_usd_per_hour=offer.dph_total,
                        disk_gb=disk_gb,
                        storage_per_gb_month=offer.storage_per_gb_month,
                        reservation_id=reservation.id,
                        other_reservations=others,
                        state="intent",
                        created_at=now,
                        kill_at=now + ttl_s,
                        offer_json=_offer_json(offer),
                        spec_json=json.dumps(
                            {}
                            if spec is None
                            else {
                                "image": spec.image,
                                "disk_gb": spec.disk_gb,
                                "env": dict(spec.env),
                                "onstart": spec.onstart,
                                "ssh_public_key": spec.ssh_public_key,
                            },
                            sort_keys=True,
                        ),
                    )
                )
        got = self.get(rental_id)
        assert got is not None
        return got

    def reserve_for(
        self,
        *,
        job: str,
        budget_name: str,
        reserve_usd: float,
        dph_total: float,
        num_gpus: int,
        max_s: float,
        idempotency_key: str,
        now: float,
    ) -> list[Reservation]:
        """Reserve `reserve_usd` for `job` against its cap, the period caps and the GPU-minute cap,
        all or none (in one locked transaction); the first reservation is the job cap's."""
        items = self.reservation_items(
            budget_name=budget_name, reserve_usd=reserve_usd, dph_total=dph_total, num_gpus=num_gpus, max_s=max_s
        )
        return self.budget.reserve_many(items, job=job, idempotency_key=idempotency_key, now=now)

    def reservation_items(
        self, *, budget_name: str, reserve_usd: float, dph_total: float, num_gpus: int, max_s: float
    ) -> list[tuple[str, float]]:
        """(cap, amount in its unit) that a create reserves: the job's cap, each period cap, and
        the GPU minutes of at most `max_s` (the kill-time). Reads the caps; reserves nothing."""
        caps = set(self.budget.caps())
        items = [(budget_name, reserve_usd)]
        items += [(p, reserve_usd) for p in ("day", "week", "month") if p in caps and p != budget_name]
        if "gpu-minutes-day" in caps:
            hours = reserve_usd / dph_total if dph_total > 0 else max_s / 3600.0
            items.append(("gpu-minutes-day", min(hours, max_s / 3600.0) * 60.0 * max(1, num_gpus)))
        return items

    def execute(
        self,
        rental_id: str,
        *,
        market: Market,
        spec: LaunchSpec | None = None,
        now: float,
        fault: FaultHook = _no_fault,
    ) -> Rental:
        """Steps 3 and 4: create at the provider (or adopt what a crashed try created), record it.

        Exit trap: if anything fails after the provider accepted the create and before the
        rental is recorded, the new instance is stopped before the error propagates.
        """
        rental = self.get(rental_id)
        if rental is None:
            raise UserError(f"no planned rental {rental_id!r}")
        spec = spec or self.spec_of(rental_id)
        fault("after_reservation")
        if rental.instance_id is not None or rental.state != "intent":
            return rental
        found = [i for i in market.list_instances(rental.label) if i.label == rental.label]
        state_now = "active"
        if found:
            instance_id, adopted = found[0].instance_id, True
            if found[0].state in ("stopped", "exited"):
                state_now = "stopped"
        else:
            # Writing the send row is the claim to create: exactly one delivery writes it. Any other
            # (a retry whose create's answer was lost, or a redelivery of the same task running beside
            # this one) finds it written and does not create: at most one create per rental, ever.
            sent_at = self._claim_send(rental_id, now=now)
            if sent_at is not None:
                raise CreateUnconfirmed(
                    f"the create for {rental.label} was sent at {sent_at:.0f} and the instance is not listed yet",
                    provider=rental.provider,
                )
            offer = self.offer_of(rental_id)
            instance_id = market.create(
                offer,
                LaunchSpec(
                    image=spec.image,
                    disk_gb=spec.disk_gb,
                    label=rental.label,
                    ssh_public_key=spec.ssh_public_key,
                    env={**spec.env, "TUNEHARNESS_KILL_AT": str(int(rental.kill_at))},
                    onstart=spec.onstart,
                ),
            )
            adopted = False
        try:
            fault("after_provider_accepted")
            return self._accept(rental, instance_id, now=now, adopted=adopted, fault=fault, state=state_now)
        except Exception:
            current = self.get(rental_id)
            if current is None or current.instance_id is None:
                self._trap_stop(market, rental, instance_id)
            raise

    def _claim_send(self, rental_id: str, *, now: float) -> float | None:
        """Write down that this call sends the create: None when it did, else when the create was
        sent before. Read and write are one locked transaction, so two callers never both claim."""
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            sent_at = conn.execute(select(_S.c.sent_at).where(_S.c.rental_id == rental_id)).scalar()
            if sent_at is not None:
                return float(sent_at)
            conn.execute(_S.insert().values(rental_id=rental_id, sent_at=now))
            return None

    def create_sent_at(self, rental_id: str) -> float | None:
        """When a create was sent for this rental (None: never)."""
        with read_connection(self.engine) as conn:
            at = conn.execute(select(_S.c.sent_at).where(_S.c.rental_id == rental_id)).scalar()
        return None if at is None else float(at)

    def _trap_stop(self, market: Market, rental: Rental, instance_id: str) -> None:
        """Stop an instance whose create could not be recorded; the reconciler adopts it later."""
        try:
            market.stop(instance_id)
        except Exception:  # the reconciler is the backstop
            return
        self.ledger.append(
            Event(
                kind="instance_stopped",
                job=rental.job,
                instance=instance_id,
                provider=rental.provider,
                machine=rental.machine_id,
                rate_usd_per_hour=rental.rate_usd_per_hour,
                reason="exit trap: create failed before hand-over",
                payload={"label": rental.label},
                idempotency_key=f"trap:{rental.id}:{instance_id}",
            )
        )

    def _accept(
        self,
        rental: Rental,
        instance_id: str,
        *,
        now: float,
        adopted: bool,
        fault: FaultHook = _no_fault,
        state: str = "active",
    ) -> Rental:
        return self._record_accepted(rental, instance_id, now=now, adopted=adopted, fault=fault, state=state)[0]

    def _record_accepted(
        self,
        rental: Rental,
        instance_id: str,
        *,
        now: float,
        adopted: bool,
        fault: FaultHook = _no_fault,
        state: str = "active",
    ) -> tuple[Rental, bool]:
        """Record the instance the provider accepted; True when this call recorded it (not another)."""
        wrote = False
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental.id}") as conn:
            current = conn.execute(select(_T).where(_T.c.id == rental.id)).first()
            if current is not None and current.instance_id is None:
                wrote = True
                conn.execute(
                    _T.update()
                    .where(_T.c.id == rental.id)
                    .values(
                        instance_id=instance_id,
                        state=state,
                        accepted_at=now,
                        stopped_at=now if state == "stopped" else None,
                    )
                )
                self.ledger.append(
                    Event(
                        kind="instance_created",
                        job=rental.job,
                        instance=instance_id,
                        provider=rental.provider,
                        machine=rental.machine_id,
                        rate_usd_per_hour=rental.rate_usd_per_hour,
                        reason="adopted after a crashed create" if adopted else "rented for the job",
                        payload={
                            "label": rental.label,
                            "offer_id": rental.offer_id,
                            "attempt": rental.attempt,
                            "kill_at": rental.kill_at,
                            "reservation": rental.reservation_id,
                        },
                        idempotency_key=f"create:{rental.id}",
                    ),
                    conn=conn,
                )
        fault("after_ledger")
        got = self.get(rental.id)
        assert got is not None
        return got, wrote

    def abandon(self, rental_id: str, *, reason: str, now: float) -> bool:
        """The create never happened (offer gone, provider refused): release the reservation."""
        rental = self.get(rental_id)
        if rental is None or rental.instance_id is not None:
            return False
        moved = self.transition(
            rental_id, to="abandoned", from_states=("intent",), kind="create_abandoned", reason=reason, now=now
        )
        if moved:
            for rid in self.reservations_of(rental_id):
                self.budget.release(rid, reason=f"create abandoned: {reason}")
        return moved

    def release_stale_intents(self, markets: Mapping[str, Market], *, now: float, older_than_s: float) -> list[str]:
        """Intents older than `older_than_s` whose label the vendor does not list: nothing was rented
        and no step is resolving them (the job ended, its task was lost), yet they hold a reservation.
        Each is abandoned and its reservation released. One that the vendor does list is left to the
        reconciler, which adopts it; a vendor that cannot be asked leaves its intents as they are."""
        released = []
        for r in self.all(states=("intent",)):
            if now - r.created_at < older_than_s or r.provider not in markets:
                continue
            try:
                listed = [i for i in markets[r.provider].list_instances(r.label) if i.label == r.label]
            except Exception:  # MarketError or worse: ask again next time
                continue
            if not listed and self.abandon(
                r.id, reason=f"stale intent: nothing listed under {r.label} after {now - r.created_at:.0f}s", now=now
            ):
                released.append(r.id)
        return released

    def reservations_of(self, rental_id: str) -> list[str]:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_T.c.reservation_id, _T.c.other_reservations).where(_T.c.id == rental_id)).first()
        if r is None:
            return []
        return [x for x in [r.reservation_id, *str(r.other_reservations or "").split(",")] if x]

    def reservations_of_many(self, rental_ids: Collection[str]) -> dict[str, list[str]]:
        """`reservations_of` for many rentals in one query (per `IN_CHUNK` ids); an unknown id maps to []."""
        out: dict[str, list[str]] = {rid: [] for rid in rental_ids}
        with read_connection(self.engine) as conn:
            for chunk in in_chunks(sorted(out)):
                q = select(_T.c.id, _T.c.reservation_id, _T.c.other_reservations).where(_T.c.id.in_(chunk))
                for r in conn.execute(q):
                    out[str(r.id)] = [x for x in [r.reservation_id, *str(r.other_reservations or "").split(",")] if x]
        return out

    def settle(self, rental_id: str, *, now: float, reason: str) -> None:
        """Replace the rental's reservations by what it billed (dollars; GPU minutes)."""
        rental = self.get(rental_id)
        if rental is None:
            return
        spent = self.spent_usd(rental, now=now)
        gpu_end = rental.stopped_at or rental.ended_at or now
        minutes = max(0.0, gpu_end - self.billed_from(rental)) / 60.0
        for rid in self.reservations_of(rental_id):
            amount = minutes if self.budget.unit_of_reservation(rid) == "gpu_minutes" else spent
            self.budget.settle(rid, amount, reason=reason)

    def adopt(self, rental_id: str, instance_id: str, *, now: float) -> Rental | None:
        """The reconciler found the instance a crashed create left behind: record it. None when the
        rental already has an instance (its own create recorded it meanwhile): nothing adopted."""
        rental = self.get(rental_id)
        if rental is None:
            raise UserError(f"no planned rental {rental_id!r}")
        got, wrote = self._record_accepted(rental, instance_id, now=now, adopted=True)
        return got if wrote else None

    # -- state changes (each one ledger event, exactly once) --------------------------------
    def mark_held_work(self, rental_id: str) -> None:
        """Training started here: from now on only the operator may destroy it."""
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            conn.execute(_T.update().where(_T.c.id == rental_id).values(held_work=True))

    def extend_kill_time(self, rental_id: str, *, by_s: float, reason: str, now: float) -> Rental | None:
        """Move a rental's kill-time `by_s` seconds later, on purpose: one ledger event
        `kill_time_extended` (old and new kill-time, reason). A stopped rental can be extended too:
        a job the reaper paused at its kill-time resumes on the same host once the kill-time lies
        ahead again (app.policy.supervision). None when the rental is gone or destroyed. The label
        keeps the kill-time of the create, and so does the instance's TUNEHARNESS_KILL_AT: the
        reaper reads this row."""
        if not (math.isfinite(by_s) and 0 < by_s <= MAX_EXTEND_S):
            raise UserError(
                f"kill-time extension {by_s / 3600.0:g} h is not in (0, {MAX_EXTEND_S / 3600.0:g}] hours. "
                "Fix: give --hours a positive number of hours, at most a week"
            )
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            r = conn.execute(select(_T).where(_T.c.id == rental_id)).first()
            if r is None or r.state not in ("intent", "active", "stopped"):
                return None
            old, new = float(r.kill_at), float(r.kill_at) + by_s
            conn.execute(_T.update().where(_T.c.id == rental_id).values(kill_at=new))
            self.ledger.append(
                Event(
                    kind="kill_time_extended",
                    job=r.job,
                    instance=r.instance_id,
                    provider=r.provider,
                    machine=r.machine_id,
                    rate_usd_per_hour=r.rate_usd_per_hour,
                    reason=reason,
                    payload={"rental": rental_id, "old_kill_at": old, "new_kill_at": new, "by_s": by_s, "at": now},
                    idempotency_key=f"kill_time_extended:{rental_id}:{int(old)}->{int(new)}",
                ),
                conn=conn,
            )
        return self.get(rental_id)

    def raise_rate(self, rental_id: str, *, rate_usd_per_hour: float, event: Event) -> bool:
        """An accepted price increase: the rental bills `rate_usd_per_hour` from now on, and `event`
        (the acceptance) is written in the same transaction. Spend is then estimated at the new rate
        over the whole current spell, which overstates it a little and never understates it: a
        budget stops early rather than late. False if the rental is unknown or the rate not finite."""
        if not (math.isfinite(rate_usd_per_hour) and rate_usd_per_hour >= 0):
            return False
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            if conn.execute(select(_T.c.id).where(_T.c.id == rental_id)).first() is None:
                return False
            conn.execute(_T.update().where(_T.c.id == rental_id).values(rate_usd_per_hour=rate_usd_per_hour))
            self.ledger.append(event, conn=conn)
        return True

    def note_utilisation(self, rental_id: str, *, gpu_util: float | None, idle_since: float | None) -> None:
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            conn.execute(_T.update().where(_T.c.id == rental_id).values(last_gpu_util=gpu_util, idle_since=idle_since))

    def transition(
        self,
        rental_id: str,
        *,
        to: RentalState,
        from_states: Sequence[str],
        kind: str,
        reason: str,
        now: float,
        evidence: dict[str, Any] | None = None,
        alert: str | None = None,
    ) -> bool:
        """Move a rental between states under its lock; write the ledger event only if it moved.

        Two watchdogs racing over the same instance: one transition, one event.
        """
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            r = conn.execute(select(_T).where(_T.c.id == rental_id)).first()
            if r is None or r.state not in from_states:
                return False
            values: dict[str, Any] = {"state": to}
            if to == "stopped":
                values["stopped_at"] = now
            if to == "active":
                values["stopped_at"] = None
            if to in ("destroyed", "lost", "abandoned"):
                values["ended_at"] = now
                if r.stopped_at is None and r.state == "active":
                    values["stopped_at"] = now
            conn.execute(_T.update().where(_T.c.id == rental_id).values(**values))
            self.ledger.append(
                Event(
                    kind=kind,
                    job=r.job,
                    instance=r.instance_id,
                    provider=r.provider,
                    machine=r.machine_id,
                    rate_usd_per_hour=r.rate_usd_per_hour,
                    reason=reason,
                    payload={"from": r.state, "to": to, **(evidence or {}), **({"alert": alert} if alert else {})},
                    idempotency_key=f"{kind}:{rental_id}:{r.state}->{to}:{int(now * 1000)}",
                ),
                conn=conn,
            )
        return True

    def stop(
        self,
        rental_id: str,
        *,
        market: Market,
        reason: str,
        kind: str,
        now: float,
        evidence: dict[str, Any] | None = None,
    ) -> bool:
        """Automation's strongest move on an instance that held work: stop it (storage still bills).

        Racing sweeps (ten reapers on one tick) send the vendor one stop: the stop is made under the
        rental's stop lease, and a sweep that waited for the lease finds the rental stopped and sends none.
        """
        rental = self.get(rental_id)
        if rental is None or rental.instance_id is None or rental.state != "active":
            return False
        with StepLeases(self.engine).held(f"stop:{rental_id}") as held:
            current = self.get(rental_id) if held else None
            if current is None or current.instance_id is None or current.state != "active":
                return False
            market.stop(current.instance_id)
            return self.transition(
                rental_id, to="stopped", from_states=("active",), kind=kind, reason=reason, now=now, evidence=evidence
            )

    def destroy(
        self,
        rental_id: str,
        *,
        market: Market,
        by: Literal["automation", "operator"],
        reason: str,
        now: float,
        evidence: dict[str, Any] | None = None,
    ) -> bool:
        """Destroy. Automation may do so only for an instance that never held the job's work."""
        rental = self.get(rental_id)
        if rental is None or rental.instance_id is None:
            return False
        if by == "automation" and rental.held_work:
            raise DestroyRefused(
                f"{rental.instance_id} held job {rental.job}'s work: automation may stop it, only "
                "the operator destroys it (tuneharness destroy)"
            )
        if rental.state in ("destroyed", "lost"):
            return False
        market.destroy(rental.instance_id)
        moved = self.transition(
            rental_id,
            to="destroyed",
            from_states=("active", "stopped", "intent"),
            kind="instance_destroyed",
            reason=reason,
            now=now,
            evidence={"by": by, **(evidence or {})},
        )
        if moved:
            self.settle(rental_id, now=now, reason=f"instance destroyed: {reason}")
        return moved

    def spent_usd(self, rental: Rental, *, now: float) -> float:
        """Our estimate of what a rental has billed its current job (GPU while active, storage until
        destroyed, bytes moved to and from it), from its create or from when it was transferred to that job."""
        start = self.billed_from(rental)
        return billed_usd(
            rental,
            start=start,
            end=now,
            traffic_bytes=self.traffic_bytes(rental.id, since=start, until=now),
            traffic_usd_per_gb=self._traffic_price(rental.id),
        )

    def spent_usd_many(
        self, rentals: Sequence[Rental], *, now: float, billed_from: Mapping[str, float] | None = None
    ) -> dict[str, float]:
        """`spent_usd` for many rentals in three queries (per `IN_CHUNK` ids), not three per rental:
        the budget monitor's pass asks this of every live rental. `billed_from`: `billed_from_many`'s
        answer when the caller has it already."""
        starts = self.billed_from_many(rentals) if billed_from is None else billed_from
        ids = sorted({r.id for r in rentals})
        nbytes: dict[str, int] = dict.fromkeys(ids, 0)
        prices: dict[str, float | None] = {}
        with read_connection(self.engine) as conn:
            for chunk in in_chunks(ids):
                for t in conn.execute(
                    select(_N.c.rental_id, _N.c.nbytes, _N.c.at).where(_N.c.rental_id.in_(chunk), _N.c.at <= now)
                ):
                    if float(t.at) >= starts[str(t.rental_id)]:
                        nbytes[str(t.rental_id)] += int(t.nbytes)
                for o in conn.execute(select(_T.c.id, _T.c.offer_json).where(_T.c.id.in_(chunk))):
                    prices[str(o.id)] = _traffic_price_of(o.offer_json)
        return {
            r.id: billed_usd(
                r,
                start=starts[r.id],
                end=now,
                traffic_bytes=nbytes[r.id],
                traffic_usd_per_gb=prices.get(r.id),
            )
            for r in rentals
        }

    # -- traffic: bytes moved to and from a host ---------------------------------------------
    def add_traffic(self, rental_id: str, *, nbytes: int, key: str, now: float) -> bool:
        """Record `nbytes` moved to or from the rental's host; False for a key already recorded."""
        rental = self.get(rental_id)
        if rental is None or nbytes <= 0:
            return False
        row_id = f"{rental_id}:{key}"
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            if conn.execute(select(_N.c.id).where(_N.c.id == row_id)).first() is not None:
                return False
            conn.execute(_N.insert().values(id=row_id, rental_id=rental_id, job=rental.job, nbytes=int(nbytes), at=now))
        return True

    def traffic_bytes(self, rental_id: str, *, since: float | None = None, until: float | None = None) -> int:
        q = select(_N.c.nbytes).where(_N.c.rental_id == rental_id)
        if since is not None:
            q = q.where(_N.c.at >= since)
        if until is not None:
            q = q.where(_N.c.at <= until)
        with read_connection(self.engine) as conn:
            return sum(int(r.nbytes) for r in conn.execute(q))

    def _traffic_price(self, rental_id: str) -> float | None:
        with read_connection(self.engine) as conn:
            text = conn.execute(select(_T.c.offer_json).where(_T.c.id == rental_id)).scalar()
        return _traffic_price_of(text)

    def traffic_usd(self, rental: Rental, *, nbytes: int) -> float:
        """What moving `nbytes` to or from the rental's host costs at its offer's traffic price."""
        return nbytes / BYTES_PER_GB * (self._traffic_price(rental.id) or 0.0)

    # -- transfers: a held host adopted by another job ---------------------------------------
    def transfers(self, rental_id: str | None = None) -> list[Transfer]:
        q = select(_X).order_by(_X.c.at, _X.c.id)
        if rental_id is not None:
            q = q.where(_X.c.rental_id == rental_id)
        with read_connection(self.engine) as conn:
            return [
                Transfer(r.rental_id, r.from_job, r.to_job, float(r.at), r.rate_usd_per_hour, float(r.settled_usd))
                for r in conn.execute(q)
            ]

    def billed_from(self, rental: Rental) -> float:
        """When the rental's current job started paying for it: its create, or its latest transfer."""
        with read_connection(self.engine) as conn:
            at = conn.execute(
                select(_X.c.at).where(_X.c.rental_id == rental.id).order_by(_X.c.at.desc()).limit(1)
            ).scalar()
        return rental.created_at if at is None else float(at)

    def billed_from_many(self, rentals: Sequence[Rental]) -> dict[str, float]:
        """`billed_from` for many rentals in one query (per `IN_CHUNK` ids): each one's latest transfer,
        or its create."""
        latest: dict[str, float] = {}
        with read_connection(self.engine) as conn:
            for chunk in in_chunks(sorted({r.id for r in rentals})):
                q = select(_X.c.rental_id, func.max(_X.c.at)).where(_X.c.rental_id.in_(chunk)).group_by(_X.c.rental_id)
                latest.update({str(rid): float(at) for rid, at in conn.execute(q) if at is not None})
        return {r.id: latest.get(r.id, r.created_at) for r in rentals}

    def transfer(
        self,
        rental_id: str,
        *,
        from_job: str,
        to_job: str,
        reservations: Sequence[Reservation],
        now: float,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> bool:
        """The rental becomes `to_job`'s from `now` on, paid from `reservations` (committed by the
        caller first). In one transaction: `from_job`'s reservations are settled with what the
        rental billed it until now, the rental's job and reservations change, and the ledger gets
        `rental_transferred` (time, rate, both jobs). False if the rental is not `from_job`'s
        running rental any more (the caller releases `reservations`); True again for a repeat."""
        rental = self.get(rental_id)
        if rental is None or not reservations:
            return False
        transfer_id = f"{rental_id}@{to_job}"
        old = self.reservations_of(rental_id)
        units = {rid: self.budget.unit_of_reservation(rid) for rid in old}
        start = self.billed_from(rental)
        traffic = self.traffic_bytes(rental_id, since=start, until=now)
        traffic_price = self._traffic_price(rental_id)
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            if conn.execute(select(_X.c.id).where(_X.c.id == transfer_id)).first() is not None:
                return True
            r = conn.execute(select(_T).where(_T.c.id == rental_id)).first()
            if r is None or r.state != "active" or r.job != from_job or r.instance_id is None:
                return False
            current = _row(r)
            share_usd = billed_usd(
                current, start=start, end=now, traffic_bytes=traffic, traffic_usd_per_gb=traffic_price
            )
            minutes = max(0.0, now - start) / 60.0
            for rid in old:
                self.budget.settle_in(
                    conn,
                    rid,
                    minutes if units[rid] == "gpu_minutes" else share_usd,
                    reason=f"rental transferred to {to_job}",
                )
            new_ids = [x.id for x in reservations]
            conn.execute(
                _T.update()
                .where(_T.c.id == rental_id)
                .values(
                    job=to_job, reservation_id=new_ids[0], other_reservations=",".join(new_ids[1:]), idle_since=None
                )
            )
            _new_spell(conn, transfer_id, r, to_job=to_job, at=now, settled_usd=share_usd, old=old, new=new_ids)
            self.ledger.append(
                Event(
                    kind="rental_transferred",
                    job=to_job,
                    instance=r.instance_id,
                    provider=r.provider,
                    machine=r.machine_id,
                    rate_usd_per_hour=r.rate_usd_per_hour,
                    amount_usd=share_usd,
                    reason=reason,
                    payload={
                        "rental": rental_id,
                        "from_job": from_job,
                        "to_job": to_job,
                        "at": now,
                        "from_billed_usd": share_usd,
                        "settled": old,
                        "reservations": new_ids,
                        **(evidence or {}),
                    },
                    idempotency_key=f"transferred:{transfer_id}",
                ),
                conn=conn,
            )
        return True

    def restart(
        self,
        rental_id: str,
        *,
        market: Market,
        reservations: Sequence[Reservation],
        now: float,
        reason: str,
        evidence: dict[str, Any] | None = None,
    ) -> bool:
        """Start a rental we stopped again (a paused job resumes on its own host), paid from
        `reservations` (committed by the caller first). The stopped spell is closed in one
        transaction: the rental's reservations are settled with what it billed until now (GPU to
        its stop, storage to now) and its billing starts again at `now` (a `rental_transfers` row
        to the same job, as for an adoption), so the pause never bills GPU time; the ledger gets
        `instance_started` (time, rate, the stop it ends). False, with nothing changed, if the
        rental is not stopped (the caller releases `reservations`)."""
        rental = self.get(rental_id)
        if rental is None or rental.state != "stopped" or rental.instance_id is None or not reservations:
            return False
        market.start(rental.instance_id)
        old = self.reservations_of(rental_id)
        units = {rid: self.budget.unit_of_reservation(rid) for rid in old}
        start = self.billed_from(rental)
        traffic = self.traffic_bytes(rental_id, since=start, until=now)
        traffic_price = self._traffic_price(rental_id)
        with write_transaction(self.engine, lock=f"tuneharness.rental.{rental_id}") as conn:
            r = conn.execute(select(_T).where(_T.c.id == rental_id)).first()
            if r is None or r.state != "stopped" or r.instance_id is None:
                return False
            current = _row(r)
            share_usd = billed_usd(
                current, start=start, end=now, traffic_bytes=traffic, traffic_usd_per_gb=traffic_price
            )
            minutes = max(0.0, (current.stopped_at or now) - start) / 60.0
            for rid in old:
                amount = minutes if units[rid] == "gpu_minutes" else share_usd
                self.budget.settle_in(conn, rid, amount, reason=f"rental restarted: {reason}")
            new_ids = [x.id for x in reservations]
            conn.execute(
                _T.update()
                .where(_T.c.id == rental_id)
                .values(
                    state="active",
                    stopped_at=None,
                    idle_since=None,
                    reservation_id=new_ids[0],
                    other_reservations=",".join(new_ids[1:]),
                )
            )
            spell = f"{rental_id}@{r.job}@restart-{int(now * 1000)}"
            _new_spell(conn, spell, r, to_job=r.job, at=now, settled_usd=share_usd, old=old, new=new_ids)
            self.ledger.append(
                Event(
                    kind="instance_started",
                    job=r.job,
                    instance=r.instance_id,
                    provider=r.provider,
                    machine=r.machine_id,
                    rate_usd_per_hour=r.rate_usd_per_hour,
                    amount_usd=share_usd,
                    reason=reason,
                    payload={
                        "from": "stopped",
                        "to": "active",
                        "rental": rental_id,
                        "stopped_at": current.stopped_at,
                        "at": now,
                        "billed_before_usd": share_usd,
                        "settled": old,
                        "reservations": new_ids,
                        **(evidence or {}),
                    },
                    idempotency_key=f"instance_started:{rental_id}:{int(now * 1000)}",
                ),
                conn=conn,
            )
        return True


def _new_spell(
    conn: Connection,
    spell_id: str,
    r: Any,
    *,
    to_job: str,
    at: float,
    settled_usd: float,
    old: Sequence[str],
    new: Sequence[str],
) -> None:
    """Close the rental's billing spell at `at` (what it billed `r.job` until then, settled from `old`)
    and open the next one for `to_job`, paid from `new`: a `rental_transfers` row (a transfer, or a
    restart to the same job)."""
    conn.execute(
        _X.insert().values(
            id=spell_id,
            rental_id=r.id,
            from_job=r.job,
            to_job=to_job,
            at=at,
            rate_usd_per_hour=r.rate_usd_per_hour,
            settled_usd=settled_usd,
            old_reservations=",".join(old),
            new_reservations=",".join(new),
        )
    )


def _traffic_price_of(offer_json: str | None) -> float | None:
    """The traffic price ($/GB) in a rental's stored offer; None when it has none or cannot be read."""
    try:
        price = json.loads(offer_json or "{}").get("inet_down_per_gb")
    except ValueError:
        return None
    return None if price is None else float(price)


def billed_usd(
    rental: Rental,
    *,
    start: float,
    end: float,
    traffic_bytes: int = 0,
    traffic_usd_per_gb: float | None = None,
) -> float:
    """What `rental` billed between `start` and `end`: GPU while it ran, storage until it ended,
    and the `traffic_bytes` moved to and from it in that time at `traffic_usd_per_gb`."""
    gpu_end = min(end, rental.stopped_at or rental.ended_at or end)
    life_end = min(end, rental.ended_at or end)
    gpu = (rental.rate_usd_per_hour or 0.0) * max(0.0, gpu_end - start) / 3600.0
    life_h = max(0.0, life_end - start) / 3600.0
    storage = (rental.storage_per_gb_month or 0.0) * rental.disk_gb * life_h / 720.0
    traffic = max(0, traffic_bytes) / BYTES_PER_GB * (traffic_usd_per_gb or 0.0)
    return gpu + storage + traffic
