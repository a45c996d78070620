"""A standby job whose worker died after its create was recorded, and before its state was saved,
is not cancelled over the host it rented: the next step finds that rental and carries on with it
(boot, preflight, hold), instead of leaving an active rental that no step watches until its
kill-time (hours, for a standby host)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.rentals import Rental, Rentals
from support.nemesis import Killed
from tests.service.provisioning.test_held_hosts import Fleet


def test_a_standby_create_recorded_by_a_killed_step_is_not_left_unwatched(tmp_path: Path) -> None:
    """Given a standby job killed after its create's ledger row, when its message is redelivered
    and its pool no longer wants a host, then the rental it made is its attempt (not abandoned to
    the reaper)."""
    f = Fleet(tmp_path)
    f.train("job-a", standby_hosts=1)
    standby = sorted(job for job in f.pending if job != "job-a")[0]  # the pool's refill chains

    def dies_after_ledger(rental_id: str, **kw: Any) -> Rental:
        def hook(step: str) -> None:
            if step == "after_ledger":
                raise Killed(step)

        return Rentals.execute(f.svc.rentals, rental_id, fault=hook, **kw)

    f.svc.rentals.execute = dies_after_ledger  # type: ignore[method-assign]
    with pytest.raises(Killed):
        f.svc.step(standby)
    del f.svc.rentals.execute
    [rental] = [r for r in f.svc.rentals.all(job="job-a", states=("active",)) if r.attempt > 1000]

    f.svc.pool.set_pool("job-a", 0)  # the redelivery finds the pool wanting nothing
    f.svc.step(standby)
    loaded = f.svc.state(standby)
    assert loaded is not None
    job = loaded[0]
    assert job.attempt is not None and job.attempt.instance_id == rental.instance_id, job


def test_a_pool_released_over_a_killed_standby_create_ends_its_host(tmp_path: Path) -> None:
    """Given a standby job killed after its create's ledger row (the host recorded, the job still
    queued), when the owner's pool is released (the job ended), then that host is ended too."""
    f = Fleet(tmp_path)
    f.train("job-a", standby_hosts=1)
    standby = sorted(job for job in f.pending if job != "job-a")[0]

    def dies_after_ledger(rental_id: str, **kw: Any) -> Rental:
        def hook(step: str) -> None:
            if step == "after_ledger":
                raise Killed(step)

        return Rentals.execute(f.svc.rentals, rental_id, fault=hook, **kw)

    f.svc.rentals.execute = dies_after_ledger  # type: ignore[method-assign]
    with pytest.raises(Killed):
        f.svc.step(standby)
    del f.svc.rentals.execute
    [rental] = [r for r in f.svc.rentals.all(job="job-a", states=("active",)) if r.attempt > 1000]

    f.svc.release_pool("job-a", reason="job done")
    after = f.svc.rentals.get(rental.id)
    assert after is not None and after.state in ("destroyed", "stopped"), after
