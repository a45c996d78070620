"""The idle watchdog opens a host handed over to another job with the key that is on the host."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import bootstrap
from app.db import init_db, make_engine
from app.market import Instance, SSHEndpoint
from app.rentals import Rentals
from app.services.guardrails import sweep_idle
from providers.sim import SimMarket, VirtualClock
from tests.service.guardrails.conftest import host, make_market, rent
from workers.guardrails import _ssh_util


class ReachableOver:
    """The simulated market, with each instance's SSH endpoint pointing at a real sshd on loopback."""

    def __init__(self, market: SimMarket, endpoint: SSHEndpoint) -> None:
        self.market, self.endpoint, self.name = market, endpoint, "sim"

    def __getattr__(self, item: str) -> Any:
        return getattr(self.market, item)

    def status(self, instance_id: str) -> Instance:
        return dataclasses.replace(self.market.status(instance_id), ssh=self.endpoint, ssh_fallback=None)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TUNEHARNESS_HOME", str(tmp_path / "home"))
    bootstrap.settings.cache_clear()
    yield tmp_path / "home"
    bootstrap.settings.cache_clear()


def test_a_handed_over_host_is_read_with_the_key_of_the_job_it_was_launched_for(
    sshd_factory: Any, tmp_path: Path, home: Path
) -> None:
    """Job a's host, handed over to job b, answers nvidia-smi over SSH with a's key: its 87% counts."""
    opener = bootstrap.job_keypair("a")
    bootstrap.job_keypair("b")  # the new owner has a key of its own, which the host does not know
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\nprintf '87'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    server = sshd_factory(opener.public_key, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 10.0)
    clock = VirtualClock()
    market = make_market([host(1, hangs_at_s=0)], clock)  # the vendor reports 0%
    r = rent(rentals, market, clock, "a")
    reservation = rentals.budget.reserve("default", 1.0, job="b", now=clock.now())
    assert rentals.transfer(
        r.id, from_job="a", to_job="b", reservations=[reservation], now=clock.now(), reason="held host adopted"
    )
    clock.advance(300)
    markets: Any = {"sim": ReachableOver(market, server.endpoint)}
    sweep_idle(rentals, markets, now=clock.now(), grace_s=1800, ssh_util=_ssh_util)
    assert rentals.get(r.id).last_gpu_util == 87.0  # type: ignore[union-attr]
