"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: a job with
`standby_hosts: 1` keeps a verified standby host (its refill hedged: the other chains' verified
hosts are held too, for any compatible job); when its training host vanishes, the supervisor's
loss path re-queues it and the recovery adopts a verified held host (no create, no pull, no
preflight for the recovery itself)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.recovery_fleet import hosts, recovery_fleet
from tests.support.services import wait_until


@pytest.mark.long
def test_a_recovery_adopts_the_verified_standby_host(th_env: dict[str, str], tmp_path: Path) -> None:
    """submit (standby_hosts: 1) -> training + one held standby host -> host destroyed -> the
    supervisor's poll re-queues -> watch_boot adopts the standby host, under the job's own budget."""
    with recovery_fleet(th_env, tmp_path, hosts(4), name="standby", scale=10.0, standby_hosts=1) as fleet:
        ledger, job_id = fleet.ledger, fleet.job_id

        def held() -> list[dict[str, Any]]:
            return [h for h in json.loads(fleet.cli("hosts", "held", "--json").stdout) if h["standby"]]

        assert wait_until(lambda: len(ledger("training_handed_over")) == 1, timeout_s=240, interval_s=2.0), fleet.log()
        first = ledger("training_handed_over")[0]
        assert wait_until(lambda: len(held()) == 1, timeout_s=240, interval_s=2.0), fleet.log()
        (standby,) = held()
        assert standby["owner"] == job_id and standby["machine_id"] != first["machine"]
        # the standby host was rented under the job's name: its label, its budget
        created = {r["instance"]: r for r in ledger("instance_created")}
        assert standby["instance_id"] in created
        assert created[standby["instance_id"]]["payload"]["attempt"] > 1000

        assert fleet.lose_host(first["instance"])["next"] == "provision"
        assert len(ledger("host_lost")) == 1

        assert wait_until(lambda: len(ledger("training_handed_over")) == 2, timeout_s=120, interval_s=1.0), fleet.log()
        second = ledger("training_handed_over")[1]
        adopted = ledger("host_adopted")
        assert len(adopted) == 1 and adopted[0]["instance"] == second["instance"]
        # a verified host that was held when the recovery came: the standby host or a hedge of its refill
        assert second["instance"] in {r["instance"] for r in ledger("host_held") if r["seq"] < adopted[0]["seq"]}
        lost_seq = ledger("host_lost")[0]["seq"]
        # nothing was rented for the recovery itself (only for the standby pool's refill)
        assert all(r["payload"].get("standby_job") for r in ledger("offer_chosen") if r["seq"] > lost_seq)
        assert fleet.phase() == "training"
        receipt = json.loads(fleet.cli("receipt", "--json").stdout)
        assert set(receipt["by_job"]) == {job_id}
