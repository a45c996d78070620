"""Campaign simulator behaviour on small hand-made traces: referee, recoveries, hangs, budget."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from providers.sim.campaign import run_campaign
from providers.sim.trace import parse_trace

ROOT = Path(__file__).resolve().parents[3]


def trace(hosts: list[dict[str, Any]], **workload: Any) -> Any:
    w = {"jobs": 1, "image_gb": 2, "model_gb": 1, "train_seconds": 600, "checkpoint_every_s": 120, "disk_gb": 20}
    w.update(workload)
    return parse_trace({"format": "tuneharness-market-trace/1", "name": "t", "workload": w, "hosts": hosts})


def host(mid: str, dph: float, **truth: Any) -> dict[str, Any]:
    t = {"pull_mbps": 400, "status_every_s": 10}
    t.update(truth)
    return {
        "machine_id": mid,
        "offer": {
            "gpu_name": "RTX 3090",
            "num_gpus": 1,
            "gpu_ram_gb": 24,
            "dph": dph,
            "storage_per_gb_month": 0.15,
            "inet_down_mbps": 800,
            "reliability": 0.995,
        },
        "truth": t,
    }


def test_referee_counts_duds_from_truth_not_from_the_policy() -> None:
    """Three duds and one healthy host: three dead hosts, the job trained on the healthy one."""
    t = trace(
        [
            host("m-frozen", 0.10, freeze_at_s=25),
            host("m-fatal", 0.11, fatal_at_s=20, fatal_status="OCI runtime create failed"),
            host("m-stale", 0.12, computes=False),
            host("m-good", 0.14),
        ]
    )
    res = run_campaign(t, policy="guarded")
    r = res.receipt
    assert (r["creates"], r["dead_hosts"], r["jobs_completed"], r["good_hosts_destroyed"]) == (4, 3, 1, 0)
    assert r["train_gpu_seconds"] == 600.0
    destroyed = {e["machine"]: e["reason"] for e in res.ledger if e["kind"] == "destroyed"}
    assert destroyed == {"m-frozen": "boot_frozen", "m-fatal": "boot_fatal", "m-stale": "no_compute"}


def test_lost_host_is_recovered_from_the_last_checkpoint() -> None:
    """A host that dies mid-run: detected within 60 s, the job resumes elsewhere and completes."""
    t = trace([host("m-dies", 0.10, dies_at_s=60 + 300), host("m-good", 0.14)])
    res = run_campaign(t, policy="guarded")
    r = res.receipt
    assert r["jobs_completed"] == 1 and len(r["recoveries"]) == 1
    rec = r["recoveries"][0]
    assert rec["machine_id"] == "m-dies" and rec["cause"] == "lost"
    assert 350.0 <= rec["lost_at_s"] <= 360.0
    stopped = next(e for e in res.ledger if e["kind"] == "stopped" and e["instance"] == "sim-1")
    assert stopped["t_s"] - 360.0 <= 60.0
    resumed = [e for e in res.ledger if e["kind"] == "training_started"][-1]
    assert resumed["resume_from_work_s"] == 240.0
    assert r["recovery_median_s"] == rec["resumed_at_s"] - rec["lost_at_s"]
    assert r["good_hosts_destroyed"] == 0


def test_hang_is_stopped_and_costs_little_idle_time() -> None:
    """A hung trainer is stopped (never destroyed) and its idle GPU time is small and billed."""
    t = trace([host("m-hang", 0.10, hangs_at_s=200), host("m-good", 0.14)])
    res = run_campaign(t, policy="guarded")
    r = res.receipt
    assert r["jobs_completed"] == 1
    assert 0 < r["idle_gpu_seconds_billed"] <= 120 + 30 + 30
    assert r["recoveries"][0]["cause"] == "hang"
    assert not any(e["kind"] == "destroyed" and e["machine"] == "m-hang" for e in res.ledger)


def test_naive_pays_105_minutes_for_a_stale_driver() -> None:
    """The naive renter trains on a host that cannot compute and notices 105 minutes later."""
    t = trace([host("m-stale", 0.10, computes=False), host("m-good", 0.14)])
    r = run_campaign(t, policy="naive").receipt
    assert r["dead_hosts"] == 1 and r["dead_host_mean_lifetime_s"] > 105 * 60
    assert r["idle_gpu_seconds_billed"] >= 105 * 60


def test_budget_too_small_stops_at_the_cap() -> None:
    """A budget that fits no attempt creates nothing and names the unfinished jobs."""
    t = trace([host("m-good", 0.14)], jobs=2, budget_usd=0.001)
    res = run_campaign(t, policy="guarded")
    assert res.receipt["creates"] == 0 and res.receipt["budget_exceeded"] is False
    assert res.receipt["jobs_failed"] == 2 and set(res.unfinished) == {"job-1", "job-2"}


def test_jobs_override_and_parallel_hosts() -> None:
    """--jobs N runs N independent jobs, each on its own host, in parallel."""
    t = trace([host(f"m-{i}", 0.10 + i / 100) for i in range(4)])
    r = run_campaign(t, policy="guarded", jobs=3).receipt
    assert r["jobs_completed"] == 3 and r["creates"] == 3
    assert r["sim_seconds"] < 2 * (60 + 15 + 600)


def test_cli_replays_a_100_host_campaign_in_under_10_seconds(tmp_path: Path) -> None:
    """`tuneharness sim campaign --json` on the 100-host trace, process start included, takes < 10 s."""
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli.main",
            "sim",
            "campaign",
            "--trace",
            "marketplace",
            "--policy",
            "guarded",
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert elapsed < 10.0
    import json

    receipt = json.loads(out.stdout)
    assert receipt["policy"] == "guarded" and receipt["jobs_completed"] == 5


def test_cli_refuses_an_unknown_policy_in_one_line(tmp_path: Path) -> None:
    """A wrong --policy is one line on stderr and exit 2."""
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "sim", "campaign", "--trace", "smoke", "--policy", "yolo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Fix:" in out.stderr


def test_a_verified_host_is_held_and_batched_onto_the_next_job() -> None:
    """With one healthy host, the second job waits for it and runs on it without another create."""
    t = trace([host("m-good", 0.10), host("m-stale", 0.12, computes=False)], jobs=2)
    res = run_campaign(t, policy="guarded")
    r = res.receipt
    assert r["jobs_completed"] == 2 and r["creates"] == 2 and r["good_hosts_destroyed"] == 0
    adopted = [e for e in res.ledger if e["kind"] == "host_adopted"]
    assert len(adopted) == 1 and adopted[0]["machine"] == "m-good"


def test_cli_standby_hosts_flag_reaches_the_receipt(tmp_path: Path) -> None:
    """`--standby-hosts 1` keeps a verified host for recoveries, and the receipt shows it and its cost."""
    import json

    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli.main",
            "sim",
            "campaign",
            "--trace",
            "recovery",
            "--standby-hosts",
            "1",
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    receipt = json.loads(out.stdout)
    assert receipt["standby_hosts"] == 1 and receipt["standby_cost_usd"] > 0
    assert receipt["recovery_median_s"] is not None and receipt["recovery_median_s"] <= 90
