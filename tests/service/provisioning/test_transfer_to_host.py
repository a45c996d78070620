"""Moving a job's files onto its host outside the monitor task: the supervisor on SimMarket (virtual
clock), a host directory whose commands really run (sh, stat, sha256sum, python3), the fake
Hugging Face Hub on loopback, and the transfer task's body called as the worker would."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
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
from app.rentals import billed_usd
from app.services.provisioning import ProvisioningService, Step
from app.services.supervisor import Bundle, SupervisorService, TriageAnswer, remote_job_root
from app.services.transfer import HOST_MANIFEST, TransferService
from providers.fakes.hf import FakeHub
from providers.sim.clock import VirtualClock
from providers.sim.market import SimMarket
from providers.sim.trace import load_trace

ROOT = Path(__file__).resolve().parents[3]
SHAPE = JobShape(download_gb=3.0, train_s=120.0, disk_gb=20.0)
JOB = "job-t"
CHUNK = 64 * 1024
PRICE_PER_GB = 50.0
MODEL = "tiny-org/tiny-causal"
REV = "89abcdef0123456789abcdef0123456789abcdef"


class TaskKilled(Exception):
    """Stands for the transfer task's soft time limit (or a worker lost mid-transfer)."""


class Host:
    """A rented host as a directory: commands run there for real; the trainer's launch and the
    monitor's probe are answered as the FakeHost of the supervisor's tests does."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.launches = 0
        self.puts: Counter[str] = Counter()
        self.chunk_puts: list[tuple[str, int]] = []  # (file, offset on the host when put)
        self.kill_after_chunks: int | None = None

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 4 * 2**20) -> CommandResult:
        if "-m trainer run" in command:
            self.launches += 1
            return CommandResult(0, "", "")
        if "@@STATUS" in command:
            return CommandResult(0, "@@STATUS\n{}\n@@ALIVE\nyes\n@@EXIT\n\n@@LOG\n", "")
        done = subprocess.run(
            command, shell=True, cwd=self.root, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def put(self, local: Path, remote: str) -> None:
        if remote.endswith(".chunk"):
            if self.kill_after_chunks is not None and len(self.chunk_puts) >= self.kill_after_chunks:
                self.kill_after_chunks = None
                raise TaskKilled("soft time limit")
            part = self.root / (remote[: -len(".chunk")] + ".part")
            self.chunk_puts.append((remote, part.stat().st_size if part.exists() else 0))
        self.puts[remote] += 1
        (self.root / remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, self.root / remote)

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / remote, local)

    def listdir(self, remote: str) -> list[str]:
        return sorted(p.name for p in (self.root / remote).iterdir())

    def close(self) -> None:
        return None


def _trace(path: Path) -> Path:
    offer = {"gpu_name": "RTX 3090", "num_gpus": 1, "gpu_ram_gb": 24, "inet_down_mbps": 800, "reliability": 0.995}
    hosts = [
        {"machine_id": f"m-{i}", "offer": {**offer, "dph": 0.1 + 0.01 * i, "inet_down_per_gb": PRICE_PER_GB}}
        for i in range(3)
    ]
    path.write_text(
        json.dumps(
            {
                "format": "tuneharness-market-trace/1",
                "name": "transfer",
                "workload": {"image_gb": 2, "model_gb": 1},
                "hosts": hosts,
            }
        )
    )
    return path


class Harness:
    def __init__(self, tmp: Path, *, hub: FakeHub | None = None) -> None:
        self.tmp = tmp
        self.engine = make_engine(f"sqlite:///{tmp / 'th.db'}")
        init_db(self.engine)
        self.clock = VirtualClock()
        self.market = SimMarket(load_trace(_trace(tmp / "trace.json")), self.clock)
        Budget(self.engine, Ledger(self.engine)).set_cap(JOB, 1000.0)
        self.prov = ProvisioningService(
            self.engine,
            market_for=lambda _name: self.market,
            clock=self.clock,
            run_preflight=self.preflight,
            launch_spec_for=lambda _job: LaunchSpec(image="img", disk_gb=20, label="", ssh_public_key="ssh-ed25519 k"),
        )
        self.hosts: dict[str, Host] = {}
        (tmp / "data").mkdir()
        (tmp / "data" / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        self.model = tmp / "private-model"
        self.model.mkdir()
        (self.model / "config.json").write_text('{"model_type": "tiny"}')
        (self.model / "model.safetensors").write_bytes(bytes(range(256)) * (5 * CHUNK // 256 + 7))
        self.hub = hub
        self.transfers = TransferService(
            self.engine, rentals=self.prov.rentals, clock=self.clock, staging=tmp / "staging", chunk_bytes=CHUNK
        )
        self.sup = SupervisorService(
            self.engine,
            provisioning=self.prov,
            shell_for=self.shell_for,
            store=LocalArtifactStore(tmp / "store"),
            staging=tmp / "staging",
            bundle_for=self.bundle,
            trainer_dir=ROOT / "trainer",
            notifier=InMemoryNotifier(),
            triage=lambda _job, _log: TriageAnswer("oom", "same host"),
            cfg=SupervisorConfig(monitor_s=30.0, repoll_s=10.0),
            transfers=self.transfers,
            hf_endpoint=hub.url if hub is not None else "https://huggingface.co",
        )

    def bundle(self, _job: str) -> Bundle:
        job = {"base_model": "base_model", "train_file": "data/train.jsonl", "max_steps": 20}
        files = [(self.tmp / "data" / "train.jsonl", "data/train.jsonl")]
        if self.hub is not None:
            return Bundle(job, tuple(files), hub=(MODEL, REV))
        files += [(p, f"base_model/{p.name}") for p in sorted(self.model.iterdir())]
        return Bundle(job, tuple(files))

    def shell_for(self, inst: Instance, _job: str) -> Host:
        return self.hosts.setdefault(inst.instance_id, Host(self.tmp / "hosts" / inst.instance_id))

    def preflight(self, market: Market, job_id: str, instance_id: str) -> PreflightResult:
        raw = self.market.referee.preflight_report(instance_id)
        assert raw is not None
        return PreflightResult(PreflightReport.from_mapping(raw))

    def start(self) -> tuple[str, int]:
        step: Step = self.prov.start(JOB, req=Requirements(), shape=SHAPE)
        for _ in range(500):
            if step.handed_over:
                return step.handed_over, self.sup.arm(JOB, step.handed_over)
            if step.preflight_instance:
                step = self.prov.preflight(step.job_id, step.preflight_instance)
                continue
            assert step.wake_at is not None
            self.clock.set(max(self.clock.now(), step.wake_at))
            step = self.prov.step(step.job_id)
        raise AssertionError("did not hand over")

    def poll(self, seq: int) -> tuple[int, str, str | None]:
        step = self.sup.poll(JOB, seq)
        if step.next == "monitor":
            assert step.seq is not None and step.wake_at is not None
            self.clock.set(max(self.clock.now(), step.wake_at))
            return step.seq, step.next, step.transfer
        return seq, step.next, step.transfer

    def job_root(self, inst: str) -> Path:
        return self.hosts[inst].root / remote_job_root(JOB)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[FakeHub]:
    if shutil.which("python3") is None:
        pytest.skip("the host's python3 runs the fetcher")
    model = tmp_path / "hub-model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "tiny"}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 400)
    (model / "tokenizer" / "vocab.txt").parent.mkdir()
    (model / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    with FakeHub(lfs_min_bytes=4096) as fake:
        fake.add_repo(MODEL, REV, model)
        yield fake


def test_the_monitor_asks_for_a_transfer_and_starts_the_slice_only_once_it_is_done(tmp_path: Path) -> None:
    """Hand-over: the poll moves no file and asks for a transfer task; once it ran, the next poll starts training."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, nxt, transfer = h.poll(seq)
    assert nxt == "monitor" and transfer == inst
    assert not h.hosts.get(inst) or not h.hosts[inst].puts
    seq, nxt, transfer = h.poll(seq)
    assert transfer is None  # one task asked for, not one per poll
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None and done.state == "done" and done.bytes_done == done.bytes_total > 5 * CHUNK
    seq, _, _ = h.poll(seq)
    assert h.hosts[inst].launches == 1
    root = h.job_root(inst)
    assert (root / "code" / "trainer" / "run.py").is_file() and (root / "job" / "job.json").is_file()
    assert (root / "job" / "base_model" / "model.safetensors").read_bytes() == (
        h.model / "model.safetensors"
    ).read_bytes()
    assert json.loads((root / HOST_MANIFEST).read_text())["job/base_model/model.safetensors"]["size"] > 5 * CHUNK
    kinds = [r.kind for r in Ledger(h.engine).rows(job=JOB)]
    assert kinds.index("transfer_done") < kinds.index("training_started")


def test_a_poll_woken_when_the_transfer_is_done_starts_the_slice_and_the_waiting_poll_stops(tmp_path: Path) -> None:
    """The transfer task sends a poll with the chain's number as soon as the files are on the host:
    it starts the trainer at once, and the poll that was waiting out its countdown finds its number
    taken and stops, so the job keeps one chain and one launch."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, transfer = h.poll(seq)
    assert transfer == inst and h.sup.chain_seq(JOB) == seq
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None and done.state == "done"
    woken = h.sup.chain_seq(JOB)
    assert woken == seq  # the number the waiting poll holds
    step = h.sup.poll(JOB, woken)
    assert step.next == "monitor" and step.seq == woken + 1 and h.hosts[inst].launches == 1
    assert h.sup.poll(JOB, seq).detail == "stale chain"  # the waiting poll arrives, and stops
    assert h.sup.chain_seq(JOB) == woken + 1 and h.hosts[inst].launches == 1
    assert h.sup.chain_seq("job-nobody") is None


def test_a_transfer_longer_than_a_task_resumes_and_never_sends_a_byte_twice(tmp_path: Path) -> None:
    """The task is killed mid-model; the next task resumes from the host's partial file; the trainer then starts."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, transfer = h.poll(seq)
    host = h.shell_for(h.market.status(inst), JOB)
    host.kill_after_chunks = 2
    with pytest.raises(TaskKilled):
        h.sup.run_transfer(JOB, inst)
    mid = h.transfers.get(JOB, inst)
    assert mid is not None and mid.state == "running" and 0 < mid.bytes_done < mid.bytes_total
    seq, _, transfer = h.poll(seq)
    assert transfer == inst and host.launches == 0  # the lease was given back: a new task is asked for
    # a task that ends at its own deadline also keeps what it moved
    h.sup.run_transfer(JOB, inst, deadline_s=0.0)
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None and done.state == "done"
    seq, _, _ = h.poll(seq)
    assert host.launches == 1
    assert len(host.chunk_puts) == len(set(host.chunk_puts))  # no chunk sent twice
    assert all(n == 1 for r, n in host.puts.items() if not r.endswith((".chunk", HOST_MANIFEST)))
    big = h.job_root(inst) / "job" / "base_model" / "model.safetensors"
    assert big.read_bytes() == (h.model / "model.safetensors").read_bytes()


def test_a_second_slice_and_a_repeated_transfer_on_the_same_host_move_nothing(tmp_path: Path) -> None:
    """The host's manifest lists the verified files: a transfer asked for again sends no file, the next slice none."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    h.sup.run_transfer(JOB, inst)
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    before = sum(host.puts.values())
    h.transfers.forget(JOB, inst)  # as if asked again on this host (e.g. after our own stop)
    assert h.transfers.request(JOB, "sim", inst)
    again = h.sup.run_transfer(JOB, inst)
    assert again is not None and again.state == "done" and again.bytes_moved == 0
    assert sum(host.puts.values()) - before == 0
    assert h.transfers.get(JOB, inst).bytes_done == again.bytes_total  # type: ignore[union-attr]


def test_a_partial_file_whose_prefix_differs_is_sent_again_from_the_start(tmp_path: Path) -> None:
    """Resuming checks the host's partial file against the local prefix; a damaged one is not extended."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.shell_for(h.market.status(inst), JOB)
    host.kill_after_chunks = 2
    with pytest.raises(TaskKilled):
        h.sup.run_transfer(JOB, inst)
    part = h.job_root(inst) / "job" / "base_model" / "model.safetensors.part"
    data = bytearray(part.read_bytes())
    data[10] ^= 0xFF
    part.write_bytes(bytes(data))
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None and done.state == "done"
    big = h.job_root(inst) / "job" / "base_model" / "model.safetensors"
    assert big.read_bytes() == (h.model / "model.safetensors").read_bytes()


def test_the_budget_counts_the_bytes_pushed_at_the_offers_traffic_price(tmp_path: Path) -> None:
    """The rental's spend grows by bytes moved x inet_down_per_gb; the budget monitor reads the same spend."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    rental = h.prov.rentals.by_instance("sim", inst)
    assert rental is not None
    seq, _, _ = h.poll(seq)
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None
    now = h.clock.now()
    before = billed_usd(rental, start=h.prov.rentals.billed_from(rental), end=now)  # GPU and storage only
    after = h.prov.rentals.spent_usd(rental, now=now)
    assert done.bytes_moved > 5 * CHUNK
    assert after - before == pytest.approx(done.bytes_moved / 1e9 * PRICE_PER_GB)
    event = next(r for r in Ledger(h.engine).rows(job=JOB) if r.kind == "transfer_done")
    assert event.amount_usd == pytest.approx(done.bytes_moved / 1e9 * PRICE_PER_GB)


def test_a_public_model_is_fetched_by_the_host_and_billed(tmp_path: Path, hub: FakeHub) -> None:
    """A pinned hub model is not pushed: the host runs fetch-model against the hub; its bytes count in the spend."""
    h = Harness(tmp_path, hub=hub)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    done = h.sup.run_transfer(JOB, inst)
    assert done is not None and done.state == "done", done
    seq, _, _ = h.poll(seq)
    host = h.hosts[inst]
    assert host.launches == 1
    assert not any("base_model" in r for r in host.puts)
    fetched = h.job_root(inst) / "job" / "base_model"
    assert (fetched / "model.safetensors").read_bytes() == hub.repos[(MODEL, REV)].files["model.safetensors"]
    assert (fetched / "tokenizer" / "vocab.txt").is_file()
    assert done.bytes_moved >= hub.bytes_served > 0


def test_a_hub_file_with_the_wrong_hash_fails_the_start_on_that_host_by_name(tmp_path: Path, hub: FakeHub) -> None:
    """A corrupted model file: the transfer fails naming the file, and the job is handed back for another host."""
    hub.corrupt("model.safetensors")
    h = Harness(tmp_path, hub=hub)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    failed = h.sup.run_transfer(JOB, inst)
    assert failed is not None and failed.state == "failed" and "model.safetensors" in (failed.error or "")
    _, nxt, _ = h.poll(seq)
    assert nxt == "provision" and h.hosts[inst].launches == 0
    rows = Ledger(h.engine).rows(job=JOB)
    assert any(r.kind == "transfer_failed" and "model.safetensors" in (r.reason or "") for r in rows)


def test_status_shows_a_transfers_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tuneharness status` shows bytes done of total and the file moving while a transfer is under way."""
    from app import bootstrap
    from app.cli.status_cmd import collect
    from app.jobs import JobSpec, JobStore, Needs

    h = Harness(tmp_path)
    inst, seq = h.start()
    JobStore(h.engine).add(JobSpec(name="t", train={}, needs=Needs()), job_id=JOB)
    monkeypatch.setattr(bootstrap, "engine", lambda s=None: h.engine)
    seq, _, _ = h.poll(seq)
    h.shell_for(h.market.status(inst), JOB).kill_after_chunks = 1
    with pytest.raises(TaskKilled):
        h.sup.run_transfer(JOB, inst)
    job = next(j for j in collect(now=h.clock.now())["jobs"] if j["job_id"] == JOB)
    t = job["transfer"]
    assert t["state"] == "running" and 0 < t["bytes_done"] < t["bytes_total"]
    assert t["current"] == "job/base_model/model.safetensors"


def test_a_transfer_task_that_vanished_is_asked_for_again_once_its_lease_expires(tmp_path: Path) -> None:
    """A queued or running task holds the lease; when it is not renewed (a worker killed -9), the monitor asks again."""
    h = Harness(tmp_path)
    inst, _ = h.start()
    assert h.transfers.request(JOB, "sim", inst)
    assert not h.transfers.request(JOB, "sim", inst)
    h.clock.set(h.clock.now() + h.transfers.lease_s + 1)
    assert h.transfers.request(JOB, "sim", inst)


def test_a_host_that_takes_no_file_is_judged_lost(tmp_path: Path) -> None:
    """Transfer tasks that fail in a row without moving a byte (SSH down, provider says running) end in a loss."""
    h = Harness(tmp_path)
    inst, seq = h.start()
    seq, _, _ = h.poll(seq)
    host = h.shell_for(h.market.status(inst), JOB)

    def refuse(local: Path, remote: str) -> None:
        raise OSError("connection refused")

    host.put = refuse  # type: ignore[method-assign]
    for _ in range(3):
        with pytest.raises(OSError):
            h.sup.run_transfer(JOB, inst)
        seq, nxt, _ = h.poll(seq)
    assert h.transfers.get(JOB, inst).failures == 3  # type: ignore[union-attr]
    assert nxt == "provision" and host.launches == 0
    assert any(r.kind == "host_lost" for r in Ledger(h.engine).rows(job=JOB))
