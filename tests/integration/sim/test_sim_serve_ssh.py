"""A sim host answers over real SSH: `tuneharness sim serve` + SimClientMarket + SSHHostShell."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.market import LaunchSpec, OfferQuery
from app.ssh import FileHostKeyPin, HostUnreachable, SSHHostShell, generate_keypair
from providers.sim.client import SimClientMarket
from providers.sim.observe import preflight_report
from providers.sim.trace import TRACE_FORMAT, HostTruth
from tests.support.services import wait_until

ROOT = Path(__file__).resolve().parents[3]
SCALE = 60.0  # 3 GB at 400 Mb/s = 60 s pull = 1 wall second

TRACE = {
    "format": TRACE_FORMAT,
    "name": "ssh-it",
    "workload": {"image_gb": 2, "model_gb": 1, "disk_gb": 20},
    "hosts": [
        {
            "machine_id": "m-good",
            "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.20},
            "truth": {"pull_mbps": 400},
        },
        {
            "machine_id": "m-stale",
            "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.10},
            "truth": {"pull_mbps": 400, "computes": False, "actual_gpu_ram_gb": 20},
        },
        {
            "machine_id": "m-dies",
            "offer": {"gpu_name": "RTX 4090", "gpu_ram_gb": 24, "dph": 0.30},
            "truth": {"pull_mbps": 400, "dies_at_s": 300},
        },
    ],
}


def same_observation(seen: dict[str, Any], predicted: dict[str, Any]) -> bool:
    """The real preflight on a sim host reports what the campaign simulator's hook predicts."""
    keys = ("ok", "cuda_initialised", "gpu_name", "vram_gb", "matmul_finite", "tflops_bf16", "error")
    return {k: seen.get(k) for k in keys} == {k: predicted.get(k) for k in keys}


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[tuple[SimClientMarket, Path]]:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps(TRACE), encoding="utf-8")
    url_file = tmp_path / "url"
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli.main",
            "sim",
            "serve",
            "--trace",
            str(trace),
            "--scale",
            str(SCALE),
            "--root",
            str(tmp_path / "sim"),
            "--url-file",
            str(url_file),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert wait_until(lambda: url_file.exists() or proc.poll() is not None, timeout_s=30)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        market = SimClientMarket(url_file.read_text().strip())
        yield market, tmp_path / "sim"
        market.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)


def test_sim_host_runs_commands_over_ssh_then_refuses_after_destroy_and_death(
    tmp_path: Path, sim_server: tuple[SimClientMarket, Path]
) -> None:
    """Running sim hosts answer over SSH with their truth injected; destroy and death close SSH."""
    market, _ = sim_server
    keys = generate_keypair(tmp_path / "keys")
    offers = {o.machine_id: o for o in market.search_offers(OfferQuery())}
    assert list(offers) == ["m-stale", "m-good", "m-dies"]  # cheapest first

    def rent(machine_id: str) -> str:
        spec = LaunchSpec(image="img:1", disk_gb=20, label=f"job-7/{machine_id}", ssh_public_key=keys.public_key)
        return market.create(offers[machine_id], spec)

    good, stale, dies = rent("m-good"), rent("m-stale"), rent("m-dies")

    def market_truth(iid: str) -> HostTruth:
        return HostTruth(**{k: v for k, v in market.referee_truth(iid).items()})

    assert {i.instance_id for i in market.list_instances("job-7/")} == {good, stale, dies}
    assert market.status(good).state == "loading"

    # death at 300 sim-s: the server stops that host's sshd on time, without anyone polling
    assert wait_until(lambda: market.status(dies).state == "running", timeout_s=20)
    dies_ssh = market.status(dies).ssh
    assert dies_ssh is not None and port_open(dies_ssh.port)
    assert wait_until(lambda: not port_open(dies_ssh.port), timeout_s=20)
    assert market.status(dies).state == "gone"
    with pytest.raises(HostUnreachable):
        SSHHostShell(dies_ssh, keys.private_key_path, connect_timeout_s=3).run("true")

    assert wait_until(lambda: market.status(good).state == "running", timeout_s=20)

    inst = market.status(good)
    assert inst.ssh is not None and inst.status_line == "running img:1"
    pin = FileHostKeyPin(tmp_path / "pins" / f"{good}.hostkey")
    with SSHHostShell(inst.ssh, keys.private_key_path, pin=pin) as shell:
        r = shell.run('cat "$TUNEHARNESS_SIM_TRUTH"; pwd', timeout_s=20)
        truth = json.loads(r.stdout[: r.stdout.rindex("}") + 1])
        assert (truth["computes"], truth["actual_gpu_name"], truth["instance_id"]) == (True, "RTX 3090", good)
        assert r.stdout.strip().endswith("/sandbox")
        preflight = shell.run("python -m trainer preflight", timeout_s=60)
        assert preflight.exit_code == 0, preflight.stderr
        assert same_observation(
            json.loads(preflight.stdout.strip().splitlines()[-1]), preflight_report(market_truth(good))
        )
    assert pin.get() is not None

    assert wait_until(lambda: market.status(stale).state == "running", timeout_s=20)
    stale_ssh = market.status(stale).ssh
    assert stale_ssh is not None
    with SSHHostShell(stale_ssh, keys.private_key_path) as shell:
        truth = json.loads(shell.run('cat "$TUNEHARNESS_SIM_TRUTH"').stdout)
        assert (truth["computes"], truth["actual_gpu_ram_gb"]) == (False, 20)
        assert "CUDA driver version is insufficient" in truth["cuda_error"]
        preflight = shell.run("python -m trainer preflight", timeout_s=60)
        assert preflight.exit_code == 1
        assert same_observation(
            json.loads(preflight.stdout.strip().splitlines()[-1]), preflight_report(market_truth(stale))
        )

    # destroy: SSH refused at once, the machine is listed again
    market.destroy(good)
    assert not port_open(inst.ssh.port)
    assert market.status(good).state == "gone"
    with pytest.raises(HostUnreachable):
        SSHHostShell(inst.ssh, keys.private_key_path, pin=pin, connect_timeout_s=3).run("true")
    assert {"m-good", "m-dies"} <= {o.machine_id for o in market.search_offers(OfferQuery())}

    bills = {b["instance_id"]: b for b in market.referee_bills()}
    assert bills[dies]["end_reason"] == "died" and bills[good]["end_reason"] == "destroyed"
    assert bills[dies]["gpu_seconds"] == pytest.approx(300, abs=1e-6)
    assert bills[good]["gpu_usd"] > 0


def test_stop_closes_ssh_and_start_brings_the_same_host_back(
    tmp_path: Path, sim_server: tuple[SimClientMarket, Path]
) -> None:
    """Stop refuses SSH; start brings back the same machine (same pinned host key)."""
    market, _ = sim_server
    keys = generate_keypair(tmp_path / "keys")
    offer = next(o for o in market.search_offers(OfferQuery()) if o.machine_id == "m-good")
    iid = market.create(offer, LaunchSpec(image="img:1", disk_gb=20, label="job-8", ssh_public_key=keys.public_key))
    assert wait_until(lambda: market.status(iid).state == "running", timeout_s=20)
    pin = FileHostKeyPin(tmp_path / "pin")
    first = market.status(iid).ssh
    assert first is not None
    SSHHostShell(first, keys.private_key_path, pin=pin).run("echo kept > kept.txt")
    market.stop(iid)
    assert market.status(iid).state == "stopped" and not port_open(first.port)
    market.start(iid)
    assert wait_until(lambda: market.status(iid).state == "running", timeout_s=20)
    again = market.status(iid).ssh
    assert again is not None
    with SSHHostShell(again, keys.private_key_path, pin=pin) as shell:
        assert shell.run("cat kept.txt").stdout == "kept\n"
    market.destroy(iid)


def test_sim_serve_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    """A bad trace or scale is one line on stderr and exit code 2, no traceback."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**TRACE, "hosts": [{"machine_id": "m", "offer": {"gpu_name": "x", "dph": 1}}]}))
    for args, named in ((["--trace", str(bad)], "hosts[0].offer.gpu_ram_gb"), (["--scale", "0"], "--scale")):
        r = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "sim", "serve", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "TUNEHARNESS_HOME": str(tmp_path)},
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert named in r.stderr
