"""`tuneharness logs` and `tuneharness jobs show` at the service level: the supervisor harness's fake
hosts (their files in a directory) on the sim market and a virtual clock."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from app.market import Instance
from app.ports import CommandResult
from app.services.joblogs import follow, log_key, read_log
from app.services.lifecycle import Lifecycle
from app.services.supervisor import remote_job_root
from app.services.timeline import job_timeline
from tests.service.jobs.test_lifecycle_cancel_resume import _training_job
from tests.service.provisioning.test_supervisor_service import JOB, FakeHost, Harness


class LogHost:
    """A fake host that also answers the log read (`tail -c +N FILE`) from its directory."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 4 * 2**20) -> CommandResult:
        if command.startswith("tail -c +"):
            offset = int(command.split()[2][1:]) - 1
            path = self.host.root / remote_job_root(JOB) / "job" / "train.log"
            data = path.read_bytes()[offset:] if path.exists() else b""
            return CommandResult(0, data.decode(), "")
        return self.host.run(command, timeout_s=timeout_s, max_output_bytes=max_output_bytes)

    def __getattr__(self, name: str) -> object:
        return getattr(self.host, name)


def _with_log_hosts(h: Harness) -> None:
    plain: Callable[[Instance, str], FakeHost] = h.shell_for
    h.sup.shell_for = lambda inst, job: LogHost(plain(inst, job))  # type: ignore[assignment,return-value]


def _log(h: Harness, inst: str, *lines: str) -> None:
    path = h.hosts[inst].root / remote_job_root(JOB) / "job" / "train.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(f"{line}\n" for line in lines)


def test_logs_read_the_host_while_it_trains_and_the_pulled_copy_after_a_cancel(tmp_path: Path) -> None:
    """While the job trains its log comes from the host; the cancel pulls a copy before the stop, and
    after it the log comes from that copy."""
    h = Harness(tmp_path)
    _with_log_hosts(h)
    inst, _, _ = _training_job(h)
    _log(h, inst, "step 1", "step 2")
    (live,) = read_log(h.sup, JOB)
    assert (live.source, live.instance_id, live.text) == ("host", inst, "step 1\nstep 2\n")

    Lifecycle(h.sup).cancel(JOB)
    assert h.sup.store.exists(log_key(JOB, inst))
    (after,) = read_log(h.sup, JOB)
    assert (after.source, after.instance_id, after.text) == ("pulled", inst, "step 1\nstep 2\n")


def test_follow_reads_on_across_a_host_change_and_marks_it(tmp_path: Path) -> None:
    """`logs -f` prints each new line once, marks the move to the recovery's host, and ends with the job."""
    h = Harness(tmp_path)
    _with_log_hosts(h)
    first, seq, jobs = _training_job(h)
    _log(h, first, "a1", "a2")
    machines: dict[str, str] = {}
    second: list[str] = []

    def lose_host_and_recover() -> None:
        h.market.destroy(first)
        h.hosts[first].unreachable = True
        _, nxt, _ = h.poll(seq)
        assert nxt == "provision"
        inst = h.provision(h.prov.step(JOB))
        h.sup.arm(JOB, inst)
        h.shell_for(h.market.status(inst), JOB)
        _log(h, inst, "b1")
        second.append(inst)

    script: list[Callable[[], object]] = [
        lambda: _log(h, first, "a3"),
        lose_host_and_recover,
        lambda: jobs.set_phase(JOB, "done", detail="finished"),
    ]

    def wait() -> bool:
        script.pop(0)()
        return True

    lines = list(follow(h.sup, JOB, wait=wait))
    for inst in (first, *second):
        machines[inst] = h.market.referee.host_of(inst).machine_id
    assert lines == [
        f"== host {machines[first]} ({first}) ==",
        "a1",
        "a2",
        "a3",
        f"== host {machines[second[0]]} ({second[0]}) ==",
        "b1",
    ]


def test_jobs_show_has_phases_hosts_failures_and_money_by_cause(tmp_path: Path) -> None:
    """The timeline of a job that lost a host and was cancelled: the phases in order, both hosts with
    their states, the loss with its evidence, and the money split by how each host ended."""
    h = Harness(tmp_path)
    first, seq, jobs = _training_job(h)
    h.market.destroy(first)
    h.hosts[first].unreachable = True
    h.poll(seq)
    second = h.provision(h.prov.step(JOB))
    h.clock.advance(600)
    Lifecycle(h.sup).cancel(JOB)

    t = job_timeline(JOB, jobs=jobs, ledger=h.sup.ledger, rentals=h.prov.rentals, now=h.clock.now())

    kinds = [p["kind"] for p in t["phases"]]
    assert kinds[:2] == ["provisioning_started", "training_handed_over"] and kinds[-1] == "job_cancelled"
    assert {x["instance"]: x["state"] for x in t["hosts"] if x["instance"] in (first, second)} == {
        first: "lost",
        second: "stopped",
    }
    lost = [f for f in t["failures"] if f["kind"] == "host_lost"]
    assert len(lost) == 1 and lost[0]["instance"] == first and lost[0]["cause"] == "lost"
    assert lost[0]["reason"] == "provider reports the instance gone"
    assert t["job"]["phase"] == "cancelled"
    assert abs(t["total_usd"] - sum(t["money_by_cause_usd"].values())) < 1e-6 and t["total_usd"] > 0
