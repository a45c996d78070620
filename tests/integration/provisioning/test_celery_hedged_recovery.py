"""Through real Celery, Redis, the shared sim marketplace (scaled time) and real SSH: a job with
`standby_hosts: 0` loses its host; the recovery's own create lands on a slow host and hedge standby
jobs start beside it; the first verified host takes the job, the other verified hosts are held,
and beat's `sweep_holds` releases them once their hold ends (destroyed: they never held work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.recovery_fleet import hosts, recovery_fleet
from tests.support.services import wait_until

SWEEP = """
from workers.celery_app import app
import workers.provisioning  # noqa: F401  (registers the task)
print(app.send_task("tuneharness.maintenance.sweep_holds", queue="maintenance").id)
"""


@pytest.mark.long
def test_a_hedged_recovery_takes_the_first_verified_host_and_the_sweep_releases_the_extras(
    th_env: dict[str, str], tmp_path: Path
) -> None:
    """submit (standby_hosts: 0) -> training on m-0 -> host destroyed -> the recovery rents slow m-1
    and starts hedges (`standby_wanted`) -> the first verified host trains the job -> the extras
    are held (`host_held`) -> after the hold, `sweep_holds` releases them (stopped if they held
    work, destroyed otherwise), and only the training host is left running."""
    trace = hosts(9, truth_of={1: {"pull_mbps": 30}})  # m-1, next cheapest after m-0, pulls slowly
    # scale 60: the 10-min hold of the extras is 10 s of wall time
    with recovery_fleet(th_env, tmp_path, trace, name="hedge", scale=60.0, standby_hosts=0) as fleet:
        ledger = fleet.ledger
        assert wait_until(lambda: len(ledger("training_handed_over")) == 1, timeout_s=120, interval_s=1.0), fleet.log()
        first = ledger("training_handed_over")[0]
        assert first["machine"] == "m-0"

        fleet.lose_host(first["instance"])
        assert len(ledger("host_lost")) == 1

        assert wait_until(lambda: len(ledger("training_handed_over")) == 2, timeout_s=120, interval_s=1.0), fleet.log()
        rows = ledger()
        wanted = [r for r in rows if r["kind"] == "standby_wanted"]
        assert len(wanted) == 1 and wanted[0]["payload"]["purpose"] == "hedge" and wanted[0]["payload"]["count"] >= 2
        second = [r for r in rows if r["kind"] == "training_handed_over"][1]
        assert second["machine"] not in ("m-0", "m-1")  # a hedge's host, verified before the slow one
        adopted = [r for r in rows if r["kind"] == "host_adopted"]
        # a hedge's host: with no pool to fill it was held for any compatible job, and the recovery took it
        assert [a["instance"] for a in adopted] == [second["instance"]]
        assert ".standby-" in adopted[0]["payload"]["released_by"]
        assert len([r for r in rows if r["kind"] == "attempt_handed_over"]) == 1  # the slow m-1 went on as standby

        def running() -> set[str]:
            rows = ledger()
            created = {r["instance"] for r in rows if r["kind"] == "instance_created"}
            ended = {r["instance"] for r in rows if r["kind"] in ("instance_destroyed", "instance_stopped")}
            return created - ended - {first["instance"]}

        def swept() -> bool:
            """Beat's job, every 2 s here: sweep until only the training host runs."""
            fleet.python(SWEEP)
            return running() == {second["instance"]}

        assert wait_until(swept, timeout_s=90, interval_s=2.0), fleet.log()
        rows = ledger()
        held = {r["instance"]: r for r in rows if r["kind"] == "host_held"}
        released = {r["instance"]: r for r in rows if r["kind"] == "host_released"}
        assert len(held) >= 2 and "m-1" in {r["machine"] for r in held.values()}  # the hedges and the slow attempt
        assert second["instance"] in held  # it waited, held, until the recovery adopted it
        extras = set(held) - {second["instance"]}
        assert set(released) == extras
        for inst in extras:
            want = "stopped" if held[inst]["payload"]["held_work"] else "destroyed"
            assert released[inst]["payload"]["action"] == want and released[inst]["reason"] == "hold expired"
            assert any(r["kind"] == f"instance_{want}" and r["instance"] == inst for r in rows)
        assert fleet.phase() == "training"
