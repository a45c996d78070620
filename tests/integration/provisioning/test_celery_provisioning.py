"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: three lying
hosts are caught and the job lands on the healthy one, every decision in the ledger with evidence."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.jobfiles import sim_needs_section, train_section
from tests.support.recovery_fleet import sim_fleet
from tests.support.services import wait_until

SCALE = 10.0  # the smoke trace's 60 s pull takes 6 wall seconds

JOB = "name: smoke-job\n" + train_section("none") + sim_needs_section()


def test_frozen_fatal_and_stale_hosts_are_caught_and_the_job_lands_on_the_healthy_one(
    th_env: dict[str, str],
    tmp_path: Path,
) -> None:
    """submit -> provision -> watch_boot -> preflight over SSH: three duds destroyed and quarantined, one hand-over."""
    with sim_fleet(th_env, tmp_path, trace="smoke", scale=SCALE, name="prov", job_text=JOB) as fleet:
        cli = fleet.cli

        def settled() -> bool:
            return fleet.phase() in ("training", "failed")

        assert wait_until(settled, timeout_s=240, interval_s=2.0), fleet.log()
        assert fleet.phase() == "training", fleet.log()

        rows = json.loads(cli("ledger", "show", "--json", "--job", fleet.job_id).stdout)
        destroyed = {r["machine"]: r for r in rows if r["kind"] == "instance_destroyed"}
        assert set(destroyed) == {"m-frozen", "m-fatal", "m-stale"}
        failed = {r["machine"]: r["reason"] for r in rows if r["kind"] == "host_failed"}
        assert failed == {"m-frozen": "boot_frozen", "m-fatal": "boot_fatal", "m-stale": "no_compute"}
        assert all(r["payload"].get("evidence") for r in rows if r["kind"] in ("instance_destroyed", "host_failed"))
        handed = [r for r in rows if r["kind"] == "training_handed_over"]
        assert len(handed) == 1 and handed[0]["machine"] == "m-good"
        hosts = {h["machine_id"]: h for h in json.loads(cli("hosts", "--json").stdout)}
        assert all(hosts[m]["quarantined"] for m in ("m-frozen", "m-fatal", "m-stale"))
        assert hosts["m-good"]["preflight_passed"] == 1 and not hosts["m-good"]["quarantined"]
