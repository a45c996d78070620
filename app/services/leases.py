"""Step leases: at most one provisioning step of a job applies side effects at a time.

A provisioning step loads a job's state, decides, applies what it decided (rents, stops, claims a
held host) and only then saves, checking the version it loaded. Two steps of one job at once (a
redelivered task, a boot watcher beside a preflight result, a standby host offered to a recovery
that is ticking on its own) would both apply side effects before either saved: two rentals for one
replacement, two adoptions for one recovery. The lease closes that class: a step takes the job's
lease before it applies anything, re-reads the state under it, and gives the lease back after its
save. A second step waits for it (steps are short: database writes and a provider call or two).

The lease is a row (`step_leases`) written in a short write transaction, so it works across worker
processes and machines on PostgreSQL and across processes on SQLite. It expires (`ttl_s`, wall
clock) so a worker killed inside a step does not block the job for ever, and while a step holds it a
renewer thread extends it every `ttl_s / 3` (only while the row is still this holder's), so a slow
step (a provider call retrying for minutes) never outlives its lease and lets a second step in.
Within one thread the lease is re-entrant: a step that steps the same job again (never today) does
not wait for itself.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, delete, select
from sqlmodel import Field, SQLModel

from app.db import write_transaction

__all__ = ["StepLeaseRow", "StepLeases"]

DEFAULT_TTL_S = 120.0  # far longer than any step; only a crashed holder's lease lives this long
DEFAULT_WAIT_S = 30.0


class StepLeaseRow(SQLModel, table=True):
    """Who is stepping a job right now, until when (wall-clock seconds since the epoch)."""

    __tablename__ = "step_leases"

    key: str = Field(primary_key=True)
    holder: str
    expires_at: float


_T = StepLeaseRow.__table__  # type: ignore[attr-defined]


class StepLeases:
    def __init__(
        self,
        engine: Engine,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        wait_s: float = DEFAULT_WAIT_S,
        poll_s: float = 0.02,
        now: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.engine = engine
        self.ttl_s = ttl_s
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._now = now
        self._sleep = sleep
        self._mine = threading.local()

    def _held_here(self) -> dict[str, int]:
        held: dict[str, int] | None = getattr(self._mine, "held", None)
        if held is None:
            held = self._mine.held = {}
        return held

    def try_acquire(self, key: str) -> str | None:
        """Take the lease if it is free or expired: the holder's token, or None."""
        token = uuid.uuid4().hex
        now = self._now()
        with write_transaction(self.engine, lock=f"tuneharness.step_lease.{key}") as conn:
            row = conn.execute(select(_T.c.holder, _T.c.expires_at).where(_T.c.key == key)).first()
            if row is not None and float(row.expires_at) > now:
                return None
            if row is not None:
                conn.execute(delete(_T).where(_T.c.key == key))
            conn.execute(_T.insert().values(key=key, holder=token, expires_at=now + self.ttl_s))
        return token

    def renew(self, key: str, token: str) -> bool:
        """Push the lease's expiry `ttl_s` past now; False if it is no longer this holder's."""
        with write_transaction(self.engine, lock=f"tuneharness.step_lease.{key}") as conn:
            moved = conn.execute(
                _T.update().where(_T.c.key == key, _T.c.holder == token).values(expires_at=self._now() + self.ttl_s)
            ).rowcount
        return bool(moved)

    def _renew_while_held(self, key: str, token: str, done: threading.Event) -> None:
        while not done.wait(self.ttl_s / 3.0):
            try:
                if not self.renew(key, token):
                    return
            except Exception:  # the database blipped: the lease still has two thirds of its life
                continue

    def release(self, key: str, token: str) -> None:
        """Give the lease back (only if it is still this holder's: an expired one may be someone else's)."""
        with write_transaction(self.engine, lock=f"tuneharness.step_lease.{key}") as conn:
            conn.execute(delete(_T).where(_T.c.key == key, _T.c.holder == token))

    def holder(self, key: str) -> str | None:
        with self.engine.connect() as conn:
            row = conn.execute(select(_T.c.holder, _T.c.expires_at).where(_T.c.key == key)).first()
        return None if row is None or float(row.expires_at) <= self._now() else str(row.holder)

    @contextmanager
    def held(self, key: str, *, wait_s: float | None = None) -> Iterator[bool]:
        """Hold `key`'s lease for the block: yields True once held, False if another holder kept it
        past `wait_s` (the caller then must not apply anything)."""
        here = self._held_here()
        if here.get(key):
            here[key] += 1
            try:
                yield True
            finally:
                here[key] -= 1
            return
        deadline = self._now() + (self.wait_s if wait_s is None else wait_s)
        token = self.try_acquire(key)
        while token is None and self._now() < deadline:
            self._sleep(self.poll_s)
            token = self.try_acquire(key)
        if token is None:
            yield False
            return
        here[key] = 1
        done = threading.Event()
        renewer = threading.Thread(
            target=self._renew_while_held, args=(key, token, done), name=f"lease-{key}", daemon=True
        )
        renewer.start()
        try:
            yield True
        finally:
            done.set()
            renewer.join()
            del here[key]
            self.release(key, token)
