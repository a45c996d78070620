"""The scale bench's Celery worker and beat: the product's app (`workers.celery_app`) with the
simulated fleet at the edge, and a recorder of every task's lag and run time.

    celery -A bench.scale_worker worker -Q monitor,maintenance ...

The fleet's truth is one JSON file (`TUNEHARNESS_SCALE_TRUTH`), written by `bench/scale.py` before
any process starts, so every worker answers the same: instance `sim-sNNNNN` runs job `scale-jNNNNN`
on machine `m-sNNNNN`; the instances in `losses` are gone from their moment on; those in `hangs`
stop advancing their step (GPU utilisation 0) from theirs. `EdgeMarket` answers the Market port from
it. With `edge` true, `EdgeShell` answers the probe at the SSH port's edge from the same truth
(step = seconds since the start / 3, heartbeat now, trainer alive; no checkpoint directory); with
`edge` false the product's own SSH shell is kept and the hosts are one real sshd the bench runs.

Each task writes one line to `<dir>/tasks-<pid>.jsonl` when it ends: its name, its due time (the
message's ETA, when it had one), when it started and ended, and the CPU its process spent on it.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from celery import signals

from app import bootstrap
from app.market import Instance, LaunchSpec, Offer, OfferQuery, PriceIncrease, SSHEndpoint
from app.ports import CommandResult
from workers.celery_app import app

__all__ = ["EdgeMarket", "EdgeShell", "Truth", "app", "instance_of", "job_of", "machine_of"]

TRUTH_VAR = "TUNEHARNESS_SCALE_TRUTH"
STEP_EVERY_S = 3.0  # a healthy trainer's step rate at the edge


def job_of(i: int) -> str:
    return f"scale-j{i:05d}"


def instance_of(i: int) -> str:
    return f"sim-s{i:05d}"


def machine_of(i: int) -> str:
    return f"m-s{i:05d}"


def _index(instance_id: str) -> int | None:
    tail = instance_id.rsplit("-s", 1)[-1]
    return int(tail) if tail.isdigit() else None


def _iso(wall: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall * 1000) % 1000:03d}Z"


class Truth:
    """The simulated fleet as every process sees it."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.n = int(doc["n"])
        self.t0 = float(doc["t0"])
        self.edge = bool(doc["edge"])
        self.losses = {str(k): float(v) for k, v in doc["losses"].items()}
        self.hangs = {str(k): float(v) for k, v in doc["hangs"].items()}
        self.labels = {str(k): str(v) for k, v in doc.get("labels", {}).items()}
        ssh = doc.get("ssh")
        self.ssh = SSHEndpoint(ssh["host"], int(ssh["port"]), ssh.get("user", "root")) if ssh else None
        self.dir = Path(doc["dir"])

    @classmethod
    def load(cls, path: str | Path) -> Truth:
        return cls(json.loads(Path(path).read_text(encoding="utf-8")))

    def gone(self, instance_id: str, now: float) -> bool:
        at = self.losses.get(instance_id)
        return at is not None and now >= at

    def frozen_at(self, instance_id: str, now: float) -> float | None:
        at = self.hangs.get(instance_id)
        return at if at is not None and now >= at else None

    def step(self, instance_id: str, now: float) -> tuple[int, float]:
        """(step, heartbeat wall time) the trainer on `instance_id` reports at `now`."""
        at = self.frozen_at(instance_id, now) or now
        return max(1, int((at - self.t0) / STEP_EVERY_S)), at


class EdgeMarket:
    """The Market port answered from the truth file: no HTTP, no state of its own."""

    name = "sim"

    def __init__(self, truth: Truth) -> None:
        self.truth = truth

    def search_offers(self, query: OfferQuery) -> list[Offer]:
        return []

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        from app.market import OfferGone

        raise OfferGone("the scale bench rents nothing", provider=self.name)

    def status(self, instance_id: str) -> Instance:
        now = time.time()
        i = _index(instance_id)
        if i is None or i >= self.truth.n or self.truth.gone(instance_id, now):
            return Instance(self.name, instance_id, None, None, "gone", "gone", None, None, None, None)
        hung = self.truth.frozen_at(instance_id, now) is not None
        ssh = self.truth.ssh or SSHEndpoint("edge", 22)
        return Instance(
            self.name,
            instance_id,
            machine_of(i),
            self.truth.labels.get(instance_id),
            "running",
            "running",
            ssh,
            0.0 if hung else 97.0,
            0.1,
            self.truth.t0,
        )

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        out = [self.status(instance_of(i)) for i in range(self.truth.n)]
        return [x for x in out if x.state != "gone" and (x.label or "").startswith(label_prefix)]

    def stop(self, instance_id: str) -> None:
        return None

    def start(self, instance_id: str) -> None:
        return None

    def destroy(self, instance_id: str) -> None:
        return None

    def pending_price_increases(self) -> list[PriceIncrease]:
        return []

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        return False


class EdgeShell:
    """The HostShell port at the SSH port's edge: the probe answered from the truth file."""

    def __init__(self, truth: Truth, instance_id: str) -> None:
        self.truth = truth
        self.instance_id = instance_id

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 4 * 2**20) -> CommandResult:
        if "@@STATUS" not in command:
            return CommandResult(0, "", "")  # a launch: the trainer runs already
        step, hb = self.truth.step(self.instance_id, time.time())
        status = {"phase": "training", "step": step, "max_steps": 1_000_000, "loss": 1.0, "updated_at": _iso(hb)}
        out = ["@@STATUS", json.dumps(status), "@@ALIVE", "yes", "@@EXIT", "", "@@LOG", ""]
        return CommandResult(0, "\n".join(out), "")

    def put(self, local: Path, remote: str) -> None:
        return None

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
        raise FileNotFoundError(remote)

    def listdir(self, remote: str) -> list[str]:
        raise FileNotFoundError(remote)  # no checkpoint directory yet

    def close(self) -> None:
        return None


_truth_path = os.environ.get(TRUTH_VAR)
TRUTH = Truth.load(_truth_path) if _truth_path else None

if TRUTH is not None:
    _market = EdgeMarket(TRUTH)
    _product_market = bootstrap.market

    def _market_for(name: str) -> Any:
        return _market if name == "sim" else _product_market(name)

    bootstrap.market = _market_for  # type: ignore[assignment]
    if TRUTH.edge:
        _truth = TRUTH

        def _edge_shell(inst: Instance, job_id: str, s: Any = None) -> Any:
            return EdgeShell(_truth, inst.instance_id)

        bootstrap.host_shell = _edge_shell  # type: ignore[assignment]

_started: dict[str, tuple[float, float]] = {}


def _eta_ts(eta: Any) -> float | None:
    if not eta:
        return None
    if isinstance(eta, datetime):
        return eta.timestamp()
    try:
        return datetime.fromisoformat(str(eta)).timestamp()
    except ValueError:
        return None


@signals.task_prerun.connect
def _prerun(task_id: str | None = None, **_: Any) -> None:
    if task_id:
        _started[task_id] = (time.time(), time.process_time())


@signals.task_postrun.connect
def _postrun(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    if TRUTH is None or task_id is None or task is None:
        return
    began, cpu = _started.pop(task_id, (None, None))
    line = {
        "task": task.name,
        "due": _eta_ts(getattr(task.request, "eta", None)),
        "start": began,
        "end": time.time(),
        "cpu": None if cpu is None else time.process_time() - cpu,
    }
    with open(TRUTH.dir / f"tasks-{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
