"""`tuneharness market offers|instances`, `stop` and `destroy`: the real entry point in a subprocess,
pointed at the fake vendors through VAST_API_URL / RUNPOD_API_URL, with a private TUNEHARNESS_HOME."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import make_engine
from app.ledger import Ledger, LedgerRow
from app.market import LaunchSpec, OfferQuery
from providers.fakes import FakeRunPod, FakeVast
from providers.runpod import RunPodMarket
from providers.vast import VastMarket

REPO = Path(__file__).resolve().parents[3]
SPEC = LaunchSpec(image="img", disk_gb=20, label="th-job-1", ssh_public_key="ssh-ed25519 AAAA k")


@pytest.fixture
def env(tmp_path: Path, fake_vast: FakeVast, fake_runpod: FakeRunPod) -> dict[str, str]:
    """A user's environment: keys and URLs for both fakes, zero backoff, a brand-new home."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_"))}
    return {
        **base,
        "PYTHONPATH": str(REPO),
        "TUNEHARNESS_HOME": str(tmp_path / "home"),
        "TUNEHARNESS_PROVIDER_BACKOFF_S": "0",
        "TUNEHARNESS_PROVIDER_RETRIES": "3",
        "VAST_API_KEY": fake_vast.api_key,
        "VAST_API_URL": fake_vast.url,
        "RUNPOD_API_KEY": fake_runpod.api_key,
        "RUNPOD_API_URL": fake_runpod.url,
    }


def tuneharness(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `tuneharness ARGS` with no terminal on stdin."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def ledger_rows(env: dict[str, str]) -> list[LedgerRow]:
    path = Path(env["TUNEHARNESS_HOME"]) / "tuneharness.db"
    if not path.exists():
        return []
    return Ledger(make_engine(f"sqlite:///{path}")).rows()


def test_offers_json_sorted_by_expected_cost(env: dict[str, str]) -> None:
    """Pricing 10 h, 100 GB disk and 200 GB download reorders Vast's offers away from plain $/h."""
    done = tuneharness(
        env,
        "market",
        "offers",
        "--provider",
        "vast",
        "--hours",
        "10",
        "--disk-gb",
        "100",
        "--download-gb",
        "200",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    # 5003 is cheapest per hour (0.09) but its storage (0.40) and traffic (0.02/GB) price it last but one
    assert [r["offer_id"] for r in rows] == ["5001", "5002", "5003", "5004"]
    costs = [r["expected_cost_usd"] for r in rows]
    assert costs == sorted(costs)
    first = rows[0]
    assert first["expected_cost_usd"] == pytest.approx(0.11 * 10 + 0.15 * 100 * 10 / 720 + 0.002 * 200)
    required = {
        "provider",
        "offer_id",
        "machine_id",
        "gpu_name",
        "num_gpus",
        "gpu_ram_gb",
        "dph_total",
        "storage_per_gb_month",
        "inet_down_per_gb",
        "reliability",
        "expected_cost_usd",
    }
    assert required <= set(first)
    assert (first["provider"], first["machine_id"], first["gpu_ram_gb"], first["price_unknown"]) == (
        "vast",
        "41",
        24.58,
        [],
    )


def test_offers_flag_unknown_prices(env: dict[str, str]) -> None:
    """RunPod publishes no storage or traffic price: they count 0 and are listed in price_unknown."""
    done = tuneharness(
        env, "market", "offers", "--provider", "runpod", "--gpu", "RTX 3090", "--disk-gb", "50", "--json"
    )
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert row["expected_cost_usd"] == pytest.approx(0.22)
    assert row["price_unknown"] == ["storage_per_gb_month", "inet_down_per_gb"]


def test_offers_table_and_filters(env: dict[str, str], fake_vast: FakeVast) -> None:
    """Without --json a table is printed; --gpu and --min-gpu-ram-gb reach the vendor's filters."""
    done = tuneharness(env, "market", "offers", "--provider", "vast", "--gpu", "A100 SXM4", "--min-gpu-ram-gb", "40")
    assert done.returncode == 0, done.stderr
    assert "5004" in done.stdout and "5001" not in done.stdout
    body = fake_vast.calls_to("/bundles/")[0].body
    assert body["gpu_name"] == {"eq": "A100 SXM4"} and body["gpu_ram"] == {"gte": 40000.0}


def test_offers_from_the_simulated_marketplace(env: dict[str, str]) -> None:
    """`--provider sim` lists the simulated marketplace's offers through the same command."""
    done = tuneharness(env, "market", "offers", "--provider", "sim", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert rows and all(r["provider"] == "sim" for r in rows)


@pytest.mark.parametrize(("provider", "variable"), [("vast", "VAST_API_KEY"), ("runpod", "RUNPOD_API_KEY")])
def test_a_missing_key_is_one_line_and_exit_2(env: dict[str, str], provider: str, variable: str) -> None:
    """Without the provider's key the command names the variable on one line and exits 2."""
    del env[variable]
    done = tuneharness(env, "market", "offers", "--provider", provider)
    assert done.returncode == 2
    assert variable in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_a_refused_key_exits_2_without_showing_it(env: dict[str, str]) -> None:
    """A wrong key: one line naming VAST_API_KEY, exit 2, the key nowhere in the output."""
    env["VAST_API_KEY"] = "sk-wrong-key-4242"
    done = tuneharness(env, "market", "instances", "--provider", "vast")
    assert done.returncode == 2
    assert "VAST_API_KEY" in done.stderr and "sk-wrong-key-4242" not in done.stderr + done.stdout


def test_a_busy_vendor_exits_1_after_bounded_retries(env: dict[str, str], fake_vast: FakeVast) -> None:
    """A vendor answering 503 forever: TUNEHARNESS_PROVIDER_RETRIES calls, then one error line, exit 1."""
    fake_vast.inject(503, "Service Unavailable", times=100)
    done = tuneharness(env, "market", "offers", "--provider", "vast")
    assert done.returncode == 1
    assert "gave up after 3 tries" in done.stderr and len(fake_vast.calls) == 3


def test_instances_json(env: dict[str, str], fake_vast: FakeVast) -> None:
    """`market instances --json` lists id, machine, label, state, status line and $/h."""
    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url)
    instance_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    fake_vast.boot(instance_id, status_msg="success, running img")
    done = tuneharness(env, "market", "instances", "--provider", "vast", "--json")
    assert done.returncode == 0, done.stderr
    (row,) = json.loads(done.stdout)
    assert (
        row["instance_id"],
        row["machine_id"],
        row["label"],
        row["state"],
        row["status_line"],
        row["dph_total"],
    ) == (instance_id, "43", "th-job-1", "running", "success, running img", 0.09)


def test_stop_is_a_ledger_event_with_reason_operator(env: dict[str, str], fake_vast: FakeVast) -> None:
    """`tuneharness stop` stops the instance and appends instance_stopped with rate, machine and reason."""
    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url)
    instance_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    fake_vast.boot(instance_id)
    done = tuneharness(env, "stop", "--provider", "vast", "--instance", instance_id)
    assert done.returncode == 0, done.stderr
    assert fake_vast.instances[instance_id]["intended_status"] == "stopped"
    (row,) = ledger_rows(env)
    assert (row.kind, row.provider, row.instance, row.machine, row.reason) == (
        "instance_stopped",
        "vast",
        instance_id,
        "43",
        "operator",
    )
    assert row.rate_usd_per_hour == 0.09 and row.at
    assert row.payload["label"] == "th-job-1" and row.payload["state_before"] == "running"


def test_a_failed_stop_is_written_down_too(env: dict[str, str], fake_vast: FakeVast) -> None:
    """When the vendor refuses the stop, the attempt is an instance_stop_failed event and the command exits 1."""
    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url)
    instance_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    fake_vast.inject(
        500,
        {"success": False, "error": "internal", "msg": "host unreachable"},
        match=f"/instances/{instance_id}/",
        method="PUT",
    )
    done = tuneharness(env, "stop", "--provider", "vast", "--instance", instance_id)
    assert done.returncode == 1
    assert "host unreachable" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    (row,) = ledger_rows(env)
    assert (row.kind, row.instance, row.reason) == ("instance_stop_failed", instance_id, "operator")
    assert "host unreachable" in row.payload["error"]
    assert fake_vast.instances[instance_id]["intended_status"] == "running"


def test_stopping_a_gone_instance_exits_2(env: dict[str, str]) -> None:
    """An id the vendor does not know: one line, exit 2, nothing in the ledger."""
    done = tuneharness(env, "stop", "--provider", "runpod", "--instance", "nosuchpod")
    assert done.returncode == 2 and "gone" in done.stderr
    assert ledger_rows(env) == []


def test_destroy_without_a_terminal_or_yes_destroys_nothing(env: dict[str, str], fake_runpod: FakeRunPod) -> None:
    """No --yes and no terminal to ask on: exit 2, no call to the vendor, no ledger event."""
    market = RunPodMarket(api_key=fake_runpod.api_key, api_url=fake_runpod.url)
    pod_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    fake_runpod.clear_calls()
    done = tuneharness(env, "destroy", "--provider", "runpod", "--instance", pod_id)
    assert done.returncode == 2 and "--yes" in done.stderr
    assert fake_runpod.calls == [] and pod_id in fake_runpod.pods
    assert ledger_rows(env) == []


def test_destroy_with_yes_is_a_ledger_event(env: dict[str, str], fake_runpod: FakeRunPod) -> None:
    """`destroy --yes` terminates the pod and appends instance_destroyed with rate and reason operator
    (a RunPod pod names no machine)."""
    market = RunPodMarket(api_key=fake_runpod.api_key, api_url=fake_runpod.url)
    pod_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    done = tuneharness(env, "destroy", "--provider", "runpod", "--instance", pod_id, "--yes")
    assert done.returncode == 0, done.stderr
    terminate = [c for c in fake_runpod.calls_to(f"/v2/pods/{pod_id}/action") if c.body == {"action": "terminate"}]
    assert pod_id not in fake_runpod.pods and terminate
    (row,) = ledger_rows(env)
    assert (row.kind, row.provider, row.instance, row.machine, row.reason) == (
        "instance_destroyed",
        "runpod",
        pod_id,
        None,
        "operator",
    )
    assert row.rate_usd_per_hour == pytest.approx(0.22)
    assert row.payload["already_gone"] is False


def test_unknown_provider_is_refused(env: dict[str, str]) -> None:
    """A provider outside vast/runpod/sim is a usage error naming the choices (exit 2)."""
    done = tuneharness(env, "market", "offers", "--provider", "lambda")
    assert done.returncode == 2 and "vast" in done.stderr and "runpod" in done.stderr


@pytest.mark.parametrize(("answer", "destroyed"), [("n", False), ("y", True)])
def test_destroy_asks_on_a_terminal(env: dict[str, str], fake_vast: FakeVast, answer: str, destroyed: bool) -> None:
    """On a terminal, destroy asks: "n" leaves the instance and the ledger alone, "y" destroys and records it."""
    import pty

    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url)
    instance_id = market.create(market.search_offers(OfferQuery())[0], SPEC)
    leader, follower = pty.openpty()
    try:
        os.write(leader, f"{answer}\n".encode())
        done = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "destroy", "-p", "vast", "-i", instance_id],
            env=env,
            cwd=REPO,
            text=True,
            capture_output=True,
            stdin=follower,
            timeout=60,
        )
    finally:
        os.close(follower)
        os.close(leader)
    assert "Everything on its disk is lost" in done.stdout
    assert (done.returncode == 0) is destroyed
    assert (instance_id not in fake_vast.instances) is destroyed
    assert [r.kind for r in ledger_rows(env)] == (["instance_destroyed"] if destroyed else [])
