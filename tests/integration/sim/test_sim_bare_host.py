"""A sim host on a bare image (torch only) over real SSH: the preflight refuses it as `stack_missing`
unless the bootstrap installs the trainer's stack, for real, from a wheelhouse; then the trainer trains."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import bootstrap
from app.hoststack import ACTIVATE_STACK, bootstrap_command, parse_bootstrap
from app.market import LaunchSpec, OfferQuery
from app.policy.preflight import TRAINER_STACK, judge_preflight
from app.ssh import SSHHostShell
from providers.sim.client import SimClientMarket
from providers.sim.images import wheelhouse
from providers.sim.server import SimServer
from providers.sim.trace import TRACE_FORMAT, parse_trace
from tests.support.services import wait_until
from trainer.testing import write_causal_job

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
JOB = "job-bare"
TRACE = parse_trace(
    {
        "format": TRACE_FORMAT,
        "name": "bare",
        "workload": {"image_gb": 0.01, "model_gb": 0.01, "disk_gb": 10},
        "hosts": [
            {
                "machine_id": "m-bare",
                "offer": {"gpu_name": "RTX 4090", "gpu_ram_gb": 24, "dph": 0.3},
                "truth": {"pull_mbps": 1000, "image": "bare"},
            }
        ],
    }
)


@pytest.fixture(scope="module")
def wheels() -> Path:
    """The lock's wheels, downloaded once into the simulator's cache (skipped where no index answers)."""
    try:
        return wheelhouse()
    except RuntimeError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def bare_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wheels: Path
) -> Iterator[tuple[SimClientMarket, str, SSHHostShell]]:
    """A running bare sim host rented for JOB, and an SSH shell on it with the job's key."""
    monkeypatch.setenv("TUNEHARNESS_HOME", str(tmp_path / "home"))
    bootstrap.settings.cache_clear()
    server = SimServer(TRACE, scale=1.0, root=tmp_path / "sim", wheelhouse=wheels)
    market = SimClientMarket(server.start())
    try:
        key = bootstrap.job_keypair(JOB)
        offer = market.search_offers(OfferQuery())[0]
        iid = market.create(
            offer, LaunchSpec(image="pytorch/pytorch", disk_gb=10, label=f"{JOB}/1", ssh_public_key=key.public_key)
        )
        assert wait_until(lambda: market.status(iid).state == "running", timeout_s=30)
        with bootstrap.host_shell(market.status(iid), JOB) as shell:
            yield market, iid, shell
    finally:
        market.close()
        server.close()
        bootstrap.settings.cache_clear()


def verdict(market: SimClientMarket, iid: str) -> tuple[str | None, dict[str, str]]:
    res = bootstrap.ssh_preflight(market, JOB, iid)
    assert res.report is not None, res.detail
    v = judge_preflight(res.report, offered_gpu_name="RTX 4090", offered_gpu_ram_gb=24)
    return v.failure, dict(res.report.stack)


def test_without_the_bootstrap_a_bare_host_fails_the_preflight_as_stack_missing(
    bare_host: tuple[SimClientMarket, str, SSHHostShell], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With TUNEHARNESS_BOOTSTRAP=0 the host's Python has torch only: `stack_missing`, before any training."""
    market, iid, shell = bare_host
    monkeypatch.setenv("TUNEHARNESS_BOOTSTRAP", "0")
    failure, stack = verdict(market, iid)
    assert failure == "stack_missing" and list(stack) == ["torch"]
    assert shell.run('python3 -c "import transformers"', timeout_s=60).exit_code != 0


def test_the_bootstrap_installs_the_stack_from_the_wheelhouse_and_the_trainer_trains(
    bare_host: tuple[SimClientMarket, str, SSHHostShell], tmp_path: Path
) -> None:
    """The preflight's bootstrap installs the lock for real; the preflight passes; a second bootstrap
    is served from the cache; `trainer run` with the stack on PYTHONPATH trains a tiny model."""
    market, iid, shell = bare_host
    failure, stack = verdict(market, iid)
    assert failure is None and set(stack) == set(TRAINER_STACK)
    active = shell.run('cat "$HOME/.cache/tuneharness/active"', timeout_s=20).stdout.strip()
    assert "/stack-" in active

    again = shell.run(bootstrap_command(timeout_s=60), timeout_s=90)
    outcome = parse_bootstrap(again.stdout, again.stderr, again.exit_code)
    assert (outcome.ok, outcome.cached, outcome.installed) == (True, True, ())

    from trainer.tiny import write_tiny_causal_lm

    model = write_tiny_causal_lm(tmp_path / "tiny")
    job = write_causal_job(tmp_path / "job", base_model=model, max_steps=3, checkpoint_every=3)
    run = shell.run(ACTIVATE_STACK + f"cd {REPO} && python3 -m trainer run --job-dir {job}", timeout_s=300)
    assert run.exit_code == 0, run.stdout[-2000:] + run.stderr[-2000:]
    status = json.loads((job / "status.json").read_text())
    assert (status["phase"], status["step"]) == ("finished", 3)
