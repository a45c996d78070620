"""The idle watchdog reads nvidia-smi over real SSH where the host answers, and trusts the busier figure."""

from __future__ import annotations

import os
from pathlib import Path

from app.db import init_db, make_engine
from app.market import Instance
from app.rentals import Rentals
from app.services.guardrails import gpu_util_over_ssh, sweep_idle
from app.ssh import SSHHostShell, generate_keypair
from providers.sim import VirtualClock
from tests.service.guardrails.conftest import host, make_market, rent


def _fake_nvidia_smi(directory: Path, output: str) -> Path:
    """A stand-in nvidia-smi on the host's PATH that prints one utilisation per GPU."""
    directory.mkdir(parents=True, exist_ok=True)
    exe = directory / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nprintf '{output}'\n")
    exe.chmod(0o755)
    return directory


def test_gpu_util_is_read_over_ssh_and_missing_tools_read_as_unknown(sshd_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two GPUs at 3% and 91% read as 91; a host without nvidia-smi reads as unknown."""
    keys = generate_keypair(tmp_path / "keys")
    bin_dir = _fake_nvidia_smi(tmp_path / "bin", "3\\n91\\n")
    busy = sshd_factory(keys.public_key, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}, name="busy")
    bare = sshd_factory(keys.public_key, env={"PATH": "/usr/bin:/bin"}, name="bare")
    with_tool = SSHHostShell(busy.endpoint, keys.private_key_path)
    without = SSHHostShell(bare.endpoint, keys.private_key_path)
    try:
        assert gpu_util_over_ssh(with_tool) == 91.0
        assert gpu_util_over_ssh(without) is None
    finally:
        with_tool.close()
        without.close()


def test_a_vendor_zero_does_not_stop_a_gpu_that_nvidia_smi_sees_busy(sshd_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The vendor reports 0% (a hung host in the sim), nvidia-smi over SSH says 87%: not idle."""
    keys = generate_keypair(tmp_path / "keys")
    server = sshd_factory(
        keys.public_key, env={"PATH": f"{_fake_nvidia_smi(tmp_path / 'bin', '87')}:{os.environ['PATH']}"}
    )
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    rentals = Rentals(engine)
    rentals.budget.set_cap("default", 10.0)
    clock = VirtualClock()
    market = make_market([host(1, hangs_at_s=0)], clock)
    r = rent(rentals, market, clock, "j")

    def ssh_util(rental, inst: Instance) -> float | None:  # type: ignore[no-untyped-def]
        shell = SSHHostShell(server.endpoint, keys.private_key_path)
        try:
            return gpu_util_over_ssh(shell)
        finally:
            shell.close()

    for _ in range(8):
        clock.advance(300)
        sweep_idle(rentals, {"sim": market}, now=clock.now(), grace_s=1800, ssh_util=ssh_util)
    assert market.status(r.instance_id or "").state == "running"
    assert rentals.get(r.id).last_gpu_util == 87.0  # type: ignore[union-attr]
