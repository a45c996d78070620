"""The training supervisor driven poll by poll: SimMarket on a virtual clock, a fake host directory
behind the HostShell port, an in-memory notifier and a scripted triage."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from app.alerts import InMemoryNotifier
from app.artifacts import LocalArtifactStore
from app.budget import Budget
from app.db import init_db, make_engine
from app.ledger import Ledger
from app.market import Instance, LaunchSpec, Market
from app.policy.preflight import PreflightReport
from app.policy.provisioning import PreflightResult
from app.policy.ranking import JobShape, Requirements
from app.policy.supervision import SupervisorConfig
from app.ports import CommandResult
from app.services.provisioning import ProvisioningService, Step
from app.services.supervisor import (
    Bundle,
    SupervisorService,
    TriageAnswer,
    _first_step_wall,
    _probe_command,
    parse_probe_output,
    remote_job_root,
)
from app.ssh import HostUnreachable
from app.triage.rules import DEFAULT_TAIL_BYTES, classify, read_tail
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

ROOT = Path(__file__).resolve().parents[3]
SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)
JOB = "job-1"


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall * 1000) % 1000:03d}Z"


def _trace(path: Path) -> Path:
    """A stale-driver dud (cheapest) and three healthy hosts."""
    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    hosts = [{"machine_id": "m-stale", "offer": {**offer, "dph": 0.09}, "truth": {"computes": False}}]
    hosts += [{"machine_id": f"m-{i}", "offer": {**offer, "dph": 0.1 + 0.01 * i}, "truth": {}} for i in range(3)]
    path.write_text(
        json.dumps(
            {
                "format": "tuneharness-market-trace/1",
                "name": "supervisor",
                "workload": {"image_gb": 2, "model_gb": 1},
                "hosts": hosts,
            }
        )
    )
    return path


class FakeHost:
    """A host's files in a local directory; the probe's answers are set by the test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.launches = 0
        self.unreachable = False
        self.status: dict[str, object] = {}
        self.alive = True
        self.exit_code: int | None = None
        self.log = ""

    def _check(self) -> None:
        if self.unreachable:
            raise HostUnreachable("connection refused")

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 4 * 2**20) -> CommandResult:
        self._check()
        if "nohup" in command:
            self.launches += 1
            self.alive, self.exit_code = True, None
            return CommandResult(0, "", "")
        out = [
            "@@STATUS",
            json.dumps(self.status),
            "@@ALIVE",
            "yes" if self.alive else "no",
            "@@EXIT",
            "" if self.exit_code is None else str(self.exit_code),
            "@@LOG",
            self.log,
        ]
        return CommandResult(0, "\n".join(out), "")

    def put(self, local: Path, remote: str) -> None:
        self._check()
        (self.root / remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, self.root / remote)

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
        self._check()
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / remote, local)

    def listdir(self, remote: str) -> list[str]:
        self._check()
        return sorted(p.name for p in (self.root / remote).iterdir())

    def close(self) -> None:
        return None

    def write_complete(self, rel: str, files: dict[str, bytes], *, step: int, kind: str) -> None:
        """A directory with its COMPLETE manifest, as the trainer writes it."""
        d = self.root / remote_job_root(JOB) / "job" / rel
        d.mkdir(parents=True, exist_ok=True)
        manifest = {}
        for name, data in files.items():
            (d / name).write_bytes(data)
            manifest[name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        (d / "COMPLETE").write_text(json.dumps({"format": 1, "step": step, "kind": kind, "files": manifest}))


class Harness:
    def __init__(self, tmp: Path, *, triage: TriageAnswer | None = None) -> None:
        self.engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
        init_db(self.engine)
        self.clock = VirtualClock()
        self.market = SimMarket(load_trace(_trace(tmp / "trace.json")), self.clock)
        Budget(self.engine, Ledger(self.engine)).set_cap(JOB, 5.0)
        self.prov = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self.preflight,
            launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
        )
        self.hosts: dict[str, FakeHost] = {}
        self.tmp = tmp
        self.notifier = InMemoryNotifier()
        self.triage_answer = triage or TriageAnswer("oom", "resume with a smaller micro-batch, same host")
        (tmp / "data").mkdir()
        (tmp / "data" / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        self.store = LocalArtifactStore(tmp / "store")
        self.sup = SupervisorService(
            self.engine,
            provisioning=self.prov,
            shell_for=self.shell_for,
            store=self.store,
            staging=tmp / "staging",
            bundle_for=self.bundle,
            trainer_dir=ROOT / "trainer",
            notifier=self.notifier,
            triage=lambda _job, _log: self.triage_answer,
            cfg=SupervisorConfig(monitor_s=30.0, repoll_s=10.0),
        )

    def bundle(self, _job: str) -> Bundle:
        return Bundle(
            {"base_model": "base_model", "train_file": "data/train.jsonl", "max_steps": 20},
            ((self.tmp / "data" / "train.jsonl", "data/train.jsonl"),),
        )

    def shell_for(self, inst: Instance, _job: str) -> FakeHost:
        return self.hosts.setdefault(inst.instance_id, FakeHost(self.tmp / "hosts" / inst.instance_id))

    def preflight(self, market: Market, job_id: str, instance_id: str) -> PreflightResult:
        raw = self.market.referee.preflight_report(instance_id)
        return (
            PreflightResult(None, "ssh_unreachable", "no SSH")
            if raw is None
            else PreflightResult(PreflightReport.from_mapping(raw))
        )

    def provision(self, step: Step) -> str:
        """Drive provisioning (virtual time) until hand-over; arm the supervisor; return the instance."""
        for _ in range(500):
            if step.handed_over:
                return step.handed_over
            if step.preflight_instance:
                step = self.prov.preflight(step.job_id, step.preflight_instance)
                continue
            assert step.wake_at is not None, step
            if step.wake_at > self.clock.now():
                self.clock.set(step.wake_at)
            step = self.prov.step(step.job_id)
        raise AssertionError("did not hand over")

    def start(self) -> tuple[str, int]:
        inst = self.provision(self.prov.start(JOB, req=Requirements(), shape=SHAPE))
        return inst, self.sup.arm(JOB, inst)

    def poll(self, seq: int, *, advance_s: float = 30.0) -> tuple[int, str, float | None]:
        step = self.sup.poll(JOB, seq)
        if step.next == "monitor":
            assert step.seq is not None and step.wake_at is not None
            self.clock.set(max(self.clock.now(), step.wake_at))
            return step.seq, step.next, step.wake_at
        return seq, step.next, step.wake_at

    def kinds(self) -> list[str]:
        return [r.kind for r in Ledger(self.engine).rows(job=JOB)]

    def destroyed(self, instance: str) -> bool:
        return any(r.kind == "instance_destroyed" and r.instance == instance for r in Ledger(self.engine).rows())


def _training(host: FakeHost, step: int) -> None:
    host.status = {"step": step, "max_steps": 20, "phase": "training", "loss": 1.0, "updated_at": _iso(time.time())}
    host.alive, host.exit_code = True, None


def test_the_first_poll_pushes_the_bundle_and_starts_the_trainer(tmp_path: Path) -> None:
    """Hand-over -> trainer sources, job.json and data on the host, one detached launch, a ledger event."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, nxt, _ = h.poll(seq)
    host = h.hosts[inst]
    root = host.root / remote_job_root(JOB)
    assert nxt == "monitor" and host.launches == 1
    assert (root / "code" / "trainer" / "run.py").is_file() and (root / "code" / "trainer" / "__main__.py").is_file()
    assert json.loads((root / "job" / "job.json").read_text())["train_file"] == "data/train.jsonl"
    assert (root / "job" / "data" / "train.jsonl").is_file()
    assert "training_started" in h.kinds()
    assert h.prov.rentals.by_instance("sim", inst).held_work  # type: ignore[union-attr]


def test_new_checkpoints_are_pulled_while_training(tmp_path: Path) -> None:
    """A complete checkpoint on the host lands in the store; an incomplete one is left alone."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 5)
    host.write_complete("checkpoints/step-00000004", {"trainer_state.pt": b"state"}, step=4, kind="checkpoint")
    (host.root / remote_job_root(JOB) / "job" / "checkpoints" / "step-00000008").mkdir()
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor"
    assert h.store.exists(f"jobs/{JOB}/checkpoints/step-00000004/COMPLETE")
    assert not h.store.list_keys(f"jobs/{JOB}/checkpoints/step-00000008")
    watch = h.sup.watch(JOB)
    assert watch is not None and watch[0].pulled_step == 4 and watch[0].step == 5


def test_one_failed_ssh_poll_looks_again_soon_and_a_gone_host_is_replaced(tmp_path: Path) -> None:
    """SSH failing once with the host running: re-poll after repoll_s; the provider saying gone: lost,
    stopped-not-destroyed bookkeeping, host_lost alert, and the job back to provisioning without that machine."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 3)
    seq, _, _ = h.poll(seq)
    host.unreachable = True
    now = h.clock.now()
    seq, nxt, wake = h.poll(seq)
    assert nxt == "monitor" and wake == pytest.approx(now + 10.0)
    h.market.destroy(inst)  # the host vanishes
    _, nxt, _ = h.poll(seq)
    assert nxt == "provision"
    state = h.prov.state(JOB)
    assert state is not None and state[0].phase == "queued" and h.market.status(inst).state == "gone"
    machine = h.market.referee.host_of(inst).machine_id
    assert machine in state[0].excluded
    assert "host_lost" in h.kinds() and not h.destroyed(inst)
    assert h.notifier.kinds() == ["host_lost"]


def test_ssh_failing_twice_with_the_provider_reporting_stopped_is_a_loss(tmp_path: Path) -> None:
    """The provider stops the instance (outbid) and SSH fails on two polls in a row: lost, not before."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 3)
    seq, _, _ = h.poll(seq)
    h.market.stop(inst)
    host.unreachable = True
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and "host_lost" not in h.kinds()
    _, nxt, _ = h.poll(seq)
    assert nxt == "provision"
    lost = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "host_lost"]
    assert lost and "2 consecutive polls" in lost[0].reason
    assert h.prov.rentals.by_instance("sim", inst).state == "stopped"  # type: ignore[union-attr]


def test_recovery_resumes_from_the_newest_pulled_checkpoint_on_a_new_host(tmp_path: Path) -> None:
    """After a loss the replacement receives the pulled checkpoint (manifest last) and the recovery is timed."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 6)
    host.write_complete("checkpoints/step-00000004", {"trainer_state.pt": b"state"}, step=4, kind="checkpoint")
    seq, _, _ = h.poll(seq)
    h.market.destroy(inst)
    _, nxt, wake = h.poll(seq)
    assert nxt == "provision" and wake is not None
    h.clock.set(max(h.clock.now(), wake))
    new = h.provision(h.prov.step(JOB))
    assert new != inst
    seq = h.sup.arm(JOB, new)
    seq, _, _ = h.poll(seq)
    new_host = h.hosts[new]
    pushed = new_host.root / remote_job_root(JOB) / "job" / "checkpoints" / "step-00000004"
    assert (pushed / "COMPLETE").is_file() and (pushed / "trainer_state.pt").read_bytes() == b"state"
    _training(new_host, 5)
    new_host.log = (
        f"{_iso(time.time())} step step=5 max_steps=20 loss=1 lr=1e-3 grad_norm=1 tokens_per_s=1 "
        "samples_per_s=1 elapsed_s=1"
    )
    h.poll(seq)
    rec = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "recovery"]
    assert len(rec) == 1 and rec[0].payload["resume_step"] == 4 and rec[0].payload["lost_steps"] == 2
    assert rec[0].payload["recovery_s"] >= 0
    assert h.notifier.kinds() == ["host_lost", "running_again"]


def test_a_slice_cap_starts_the_next_slice_on_the_same_host(tmp_path: Path) -> None:
    """Exit 3 relaunches the trainer on the same host; the job stays training."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 10)
    host.alive, host.exit_code = False, 3
    seq, nxt, _ = h.poll(seq)
    assert nxt == "monitor" and host.launches == 2
    assert h.kinds().count("training_started") == 2


def test_a_hang_is_caught_by_the_stall_window(tmp_path: Path) -> None:
    """The process lives but the step does not move for the stall window: the host is stopped and replaced."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 7)
    nxt = "monitor"
    for _ in range(40):
        seq, nxt, _ = h.poll(seq)
        if nxt != "monitor":
            break
    assert nxt == "provision"
    assert h.prov.rentals.by_instance("sim", inst).state == "stopped"  # type: ignore[union-attr]
    lost = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "host_lost"]
    assert lost and lost[0].payload["cause"] == "hang"


@pytest.mark.parametrize(
    ("answer", "route"),
    [
        (TriageAnswer("oom", "resume with a smaller micro-batch and more accumulation, same host"), "same_host"),
        (TriageAnswer("cuda_fault", "replace the host, record it against the machine"), "replace"),
        (TriageAnswer("data_error", "stop the job, tell the operator (a new host won't fix it)"), "stop"),
    ],
)
def test_a_dead_trainer_is_triaged_and_routed(tmp_path: Path, answer: TriageAnswer, route: str) -> None:
    """Trainer gone, host fine: same host relaunches, replace re-queues without the machine, stop fails the job."""
    h = Harness(tmp_path, triage=answer)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    _training(host, 4)
    host.status["phase"] = "failed"
    host.alive, host.exit_code = False, 1
    _, nxt, _ = h.poll(seq)
    died = [r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "trainer_died"]
    assert died and died[0].payload["route"] == route
    state = h.prov.state(JOB)
    assert state is not None
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None and rental.state != "destroyed"
    if route == "same_host":
        assert nxt == "monitor" and host.launches == 2 and state[0].phase == "training"
    elif route == "replace":
        assert nxt == "provision" and state[0].phase == "queued" and rental.state == "stopped"
    else:
        assert nxt == "none" and state[0].phase == "failed" and rental.state == "stopped"
        assert "provisioning_failed" in h.kinds()


def test_a_finished_job_pulls_and_verifies_the_adapter_and_holds_the_host(tmp_path: Path) -> None:
    """Exit 0: the adapter is pulled and verified, the host held for the next job (never destroyed), the job done."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    host.write_complete(
        "adapter", {"adapter_model.safetensors": b"weights", "trainer_meta.json": b"{}"}, step=20, kind="adapter"
    )
    host.status = {"step": 20, "max_steps": 20, "phase": "finished", "updated_at": _iso(time.time())}
    host.alive, host.exit_code = False, 0
    _, nxt, _ = h.poll(seq)
    assert nxt == "none"
    assert h.store.exists(f"jobs/{JOB}/adapter/COMPLETE")
    assert h.prov.rentals.by_instance("sim", inst).state == "active"  # type: ignore[union-attr]
    assert [(x.instance_id, x.held_work) for x in h.prov.pool.held()] == [(inst, True)]
    state = h.prov.state(JOB)
    assert state is not None and state[0].phase == "done"
    assert "adapter_pulled" in h.kinds() and not h.destroyed(inst)


def test_a_stale_chain_does_nothing(tmp_path: Path) -> None:
    """A duplicated or superseded monitor task (old sequence number) polls nothing."""
    h = Harness(tmp_path)
    _inst, seq = h.start()
    h.poll(seq)
    step = h.sup.poll(JOB, seq)  # the same sequence number again
    assert step.next == "none" and step.detail == "stale chain"


def test_a_training_job_whose_chain_died_is_found_and_rearmed(tmp_path: Path) -> None:
    """No poll for three periods plus a grace (a worker crashed with the chain): `orphaned` names the job,
    re-arming supersedes the dead chain, and a fresh chain is not orphaned."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    assert h.sup.orphaned() == []
    h.clock.advance(3 * 30.0 + 61.0)
    assert h.sup.orphaned() == [(JOB, inst)]
    new_seq = h.sup.arm(JOB, inst)
    assert h.sup.orphaned() == []
    assert h.sup.poll(JOB, seq).next == "none"  # the old chain's task, if it ever runs, polls nothing
    _training(h.hosts[inst], 2)
    assert h.sup.poll(JOB, new_seq).next == "monitor" and h.hosts[inst].launches == 1


def test_probe_output_and_first_step_parsing() -> None:
    """The probe's sections and train.log's step lines are read as documented."""
    parsed = parse_probe_output('@@STATUS\n{"step": 3}\n\n@@ALIVE\nno\n@@EXIT\n3\n\n@@LOG\nline')
    assert parsed == {"status": {"step": 3}, "alive": False, "exit_code": 3, "log": "line", "no_job_dir": False}
    log = (
        "2026-11-29T18:52:05.963Z step step=1 max_steps=40 loss=5.5\n"
        "2026-11-29T18:52:07.356Z step step=9 max_steps=40 loss=5.4\n"
    )
    first = _first_step_wall(log, after_step=8, not_before_wall=0.0)
    assert first is not None and abs(first - 1795978327.356) < 1e-3


def test_the_probe_reads_as_much_of_train_log_as_the_triage_cli(tmp_path: Path) -> None:
    """Run in a real shell: the probe hands triage the same last 32 KB that `tuneharness triage
    FILE` reads, so an OOM under 20 KB of launcher noise decides both verdicts alike."""
    log = tmp_path / "job" / "train.log"
    log.parent.mkdir()
    noise = "".join(
        f"[rank{r}]:W1201 12:00:0{r % 10} torch/distributed/elastic/multiprocessing/api.py:897] "
        f"Sending process {4000 + r} closing signal SIGTERM (waiting for it to stop)\n"
        for r in range(150)
    )
    oom = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB\n"
    log.write_text("step 40 loss=1.2\n" * 2000 + oom + noise)
    out = subprocess.run(
        ["bash", "-c", _probe_command(str(tmp_path))], capture_output=True, text=True, check=True
    ).stdout
    parsed = parse_probe_output(out)
    assert len(parsed["log"]) > 16_384 and len(parsed["log"].encode()) <= DEFAULT_TAIL_BYTES
    assert classify(parsed["log"]).state == classify(read_tail(log)).state == "oom"
