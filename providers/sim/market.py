"""`SimMarket`: the Market port over a trace of lying hosts, on any Clock.

State is never advanced by a loop: every answer is computed from the clock and the trace, so a
virtual clock can jump hours at once. What a renter sees (`Offer`, `Instance`) carries no truth;
the simulator's own referee (`market.referee`) reads truth and bills from it.

Semantics (all times in seconds after the instance's create; see docs/simulation.md):
- loading while the host pulls image+model at `pull_mbps`; the status line
  `Downloading 3.21/23.00 GB` is refreshed every `status_every_s` from t=0; then `running`.
- `freeze_at_s`: the line stops changing and the pull stops; never ready.
- `fatal_at_s`: at that instant the line becomes `fatal_status`; still `loading`; never ready.
  (When both are set, the earlier wins.)
- `dies_at_s`: state `gone`, billing stops, the machine is listed again.
- `hangs_at_s`: still running, GPU utilisation 0.
- stop: GPU billing pauses (storage goes on); start: resumes. Host physics (the pull, death,
  hang) keep running while stopped.
- destroy: billing ends; the machine's offer is listed again with the same truth.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.market import (
    Instance,
    InstanceState,
    LaunchSpec,
    Offer,
    OfferGone,
    OfferQuery,
    PriceIncrease,
    ProviderError,
    SSHEndpoint,
)
from app.ports import Clock
from providers.sim.observe import preflight_report
from providers.sim.trace import HostSpec, HostTruth, Trace

__all__ = ["HostRuntime", "InstanceBill", "SimMarket", "SimReferee", "pull_seconds"]

PROVIDER = "sim"
HOURS_PER_MONTH = 720.0
GPU_UTIL_BUSY = 95.0


def pull_seconds(*, download_gb: float, pull_mbps: float) -> float:
    """Seconds to pull `download_gb` (10^9 bytes) at `pull_mbps` (10^6 bit/s)."""
    return download_gb * 8000.0 / pull_mbps


class HostRuntime(Protocol):
    """Something that makes a running sim host reachable (e.g. an sshd per host)."""

    def up(self, instance_id: str, host: HostSpec, spec: LaunchSpec, created_at_s: float) -> SSHEndpoint: ...

    def down(self, instance_id: str) -> None: ...


@dataclass(frozen=True, slots=True)
class InstanceBill:
    """What the simulator bills one instance, from truth, as of `as_of_s`."""

    instance_id: str
    machine_id: str
    label: str
    created_at: float
    ended_at: float | None  # destroyed or died; None while it still exists
    end_reason: str | None  # "destroyed" | "died" | None
    gpu_seconds: float
    gpu_usd: float
    storage_usd: float
    traffic_usd: float
    downloaded_gb: float
    disk_gb: float
    as_of_s: float
    truth: HostTruth

    @property
    def total_usd(self) -> float:
        return self.gpu_usd + self.storage_usd + self.traffic_usd

    def to_dict(self) -> dict[str, Any]:
        d = {f: getattr(self, f) for f in self.__dataclass_fields__ if f != "truth"}
        d["total_usd"] = self.total_usd
        d["truth"] = self.truth.to_dict()
        return d


@dataclass
class _Inst:
    instance_id: str
    host: HostSpec
    spec: LaunchSpec
    disk_gb: float
    created_at: float
    gpu_intervals: list[list[float | None]] = field(default_factory=list)  # [start, end|None]
    destroyed_at: float | None = None
    stopped: bool = False
    runtime_up: bool = False
    ssh: SSHEndpoint | None = None

    @property
    def truth(self) -> HostTruth:
        return self.host.truth

    def died_at(self) -> float | None:
        t = self.truth.dies_at_s
        return None if t is None else self.created_at + t

    def ended_at(self, now: float) -> tuple[float | None, str | None]:
        """When it stopped existing (destroy or death), if that is not in the future."""
        candidates: list[tuple[float, str]] = []
        died = self.died_at()
        if died is not None and died <= now:
            candidates.append((died, "died"))
        if self.destroyed_at is not None:
            candidates.append((self.destroyed_at, "destroyed"))
        if not candidates:
            return None, None
        return min(candidates)


class SimMarket:
    """The Market port over a trace; `referee` is the simulator's window on truth and billing."""

    name = PROVIDER

    def __init__(
        self,
        trace: Trace,
        clock: Clock,
        *,
        runtime: HostRuntime | None = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.trace = trace
        self.clock = clock
        self._runtime = runtime
        self._on_change = on_change
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._insts: dict[str, _Inst] = {}
        self._active: dict[str, _Inst] = {}  # not yet finalized as ended: what _sync looks at
        self._live_by_machine: dict[str, str] = {}
        self._generation: dict[str, int] = {h.machine_id: 1 for h in trace.hosts}
        self.referee = SimReferee(self)

    # -- the Market port ------------------------------------------------------------------
    def search_offers(self, query: OfferQuery) -> list[Offer]:
        with self._lock:
            self._sync()
            names = {n.strip().lower() for n in query.gpu_names}
            offers = []
            for h in self.trace.hosts:
                if h.machine_id in self._live_by_machine:
                    continue
                o = h.offer
                if names and o.gpu_name.lower() not in names:
                    continue
                if query.min_gpu_ram_gb is not None and o.gpu_ram_gb < query.min_gpu_ram_gb:
                    continue
                if o.num_gpus < query.num_gpus:
                    continue
                if query.max_dph is not None and o.dph > query.max_dph:
                    continue
                if query.datacenter_only and not o.datacenter:
                    continue
                offers.append(self._offer(h))
            offers.sort(key=lambda x: (x.dph_total, x.offer_id))
            return offers[: query.limit] if query.limit else offers

    def create(self, offer: Offer, spec: LaunchSpec) -> str:
        with self._lock:
            self._sync()
            host = self._host_of_offer(offer.offer_id)
            if host is None or host.machine_id in self._live_by_machine:
                raise OfferGone(f"offer {offer.offer_id} is no longer available", provider=PROVIDER, status_code=410)
            now = self.clock.now()
            iid = f"sim-{next(self._ids)}"
            disk = spec.disk_gb if spec.disk_gb > 0 else self.trace.workload.disk_gb
            inst = _Inst(instance_id=iid, host=host, spec=spec, disk_gb=disk, created_at=now)
            inst.gpu_intervals.append([now, None])
            self._insts[iid] = inst
            self._active[iid] = inst
            self._live_by_machine[host.machine_id] = iid
            self._sync()
        self._changed()
        return iid

    def status(self, instance_id: str) -> Instance:
        with self._lock:
            inst = self._insts.get(instance_id)
            if inst is not None and instance_id in self._active:
                self._sync_one(inst, self.clock.now())
            if inst is None:
                return Instance.gone(PROVIDER, instance_id)
            return self._instance(inst, self.clock.now())

    def list_instances(self, label_prefix: str = "") -> list[Instance]:
        with self._lock:
            self._sync()
            now = self.clock.now()
            return [
                self._instance(i, now)
                for i in self._active.values()
                if i.ended_at(now)[0] is None and i.spec.label.startswith(label_prefix)
            ]

    def stop(self, instance_id: str) -> None:
        """Stop GPU billing; storage goes on. Stopping a stopped or gone instance is a no-op."""
        with self._lock:
            self._sync()
            inst = self._insts.get(instance_id)
            now = self.clock.now()
            if inst is None or inst.ended_at(now)[0] is not None or inst.stopped:
                return
            inst.stopped = True
            inst.gpu_intervals[-1][1] = now
            self._sync()
        self._changed()

    def start(self, instance_id: str) -> None:
        with self._lock:
            self._sync()
            inst = self._insts.get(instance_id)
            now = self.clock.now()
            if inst is None or inst.ended_at(now)[0] is not None:
                raise ProviderError(
                    f"instance {instance_id} is gone and cannot be started", provider=PROVIDER, status_code=404
                )
            if not inst.stopped:
                return
            inst.stopped = False
            inst.gpu_intervals.append([now, None])
            self._sync()
        self._changed()

    def destroy(self, instance_id: str) -> None:
        with self._lock:
            self._sync()
            inst = self._insts.get(instance_id)
            now = self.clock.now()
            if inst is None or inst.ended_at(now)[0] is not None:
                return
            inst.destroyed_at = now
            self._sync()
        self._changed()

    def pending_price_increases(self) -> list[PriceIncrease]:
        """The simulated hosts never raise their price."""
        return []

    def answer_price_increase(self, increase: PriceIncrease, *, accept: bool) -> bool:
        return False

    # -- time-driven transitions ---------------------------------------------------------
    def sync(self) -> float | None:
        """Apply transitions due by now (sshd up/down, re-listing); return the next due time."""
        with self._lock:
            return self._sync()

    def _sync(self) -> float | None:
        now = self.clock.now()
        next_due: float | None = None
        for inst in list(self._active.values()):
            due = self._sync_one(inst, now)
            if due is not None:
                next_due = due if next_due is None else min(next_due, due)
        return next_due

    def _sync_one(self, inst: _Inst, now: float) -> float | None:
        """Apply what is due for one instance; return when it next changes by itself."""
        ended, _ = inst.ended_at(now)
        if ended is not None:
            if self._live_by_machine.get(inst.host.machine_id) == inst.instance_id:
                del self._live_by_machine[inst.host.machine_id]
                self._generation[inst.host.machine_id] += 1
            for iv in inst.gpu_intervals:
                if iv[1] is None:
                    iv[1] = ended
            self._runtime_down(inst)
            self._active.pop(inst.instance_id, None)
            return None
        next_due = inst.died_at()
        if self._phase(inst, now) == "running" and not inst.stopped:
            if not inst.runtime_up:
                self._runtime_up(inst)
        else:
            self._runtime_down(inst)
            ready = self._ready_at(inst)
            if ready is not None and ready > now:
                next_due = ready if next_due is None else min(next_due, ready)
        return next_due

    def _runtime_up(self, inst: _Inst) -> None:
        if self._runtime is not None:
            inst.ssh = self._runtime.up(inst.instance_id, inst.host, inst.spec, inst.created_at)
        else:  # in-process: nothing answers there; the campaign simulator observes through the referee
            inst.ssh = SSHEndpoint(host=f"{inst.host.machine_id}.sim.invalid", port=22)
        inst.runtime_up = True

    def _runtime_down(self, inst: _Inst) -> None:
        if inst.runtime_up:
            inst.runtime_up = False
            inst.ssh = None
            if self._runtime is not None:
                self._runtime.down(inst.instance_id)

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change()

    # -- truth -> observation -------------------------------------------------------------
    def _pull_s(self, inst: _Inst) -> float:
        return pull_seconds(download_gb=self.trace.workload.download_gb, pull_mbps=inst.truth.pull_mbps)

    def _blocked_at_s(self, truth: HostTruth) -> float | None:
        times = [t for t in (truth.freeze_at_s, truth.fatal_at_s) if t is not None]
        return min(times) if times else None

    def _ready_at(self, inst: _Inst) -> float | None:
        """When the pull completes and the host is ready; None when it never will be."""
        if self._blocked_at_s(inst.truth) is not None:
            return None
        return inst.created_at + self._pull_s(inst)

    def _phase(self, inst: _Inst, now: float) -> str:
        ready = self._ready_at(inst)
        return "running" if ready is not None and now >= ready else "loading"

    def _downloaded_gb(self, inst: _Inst, at: float) -> float:
        total = self.trace.workload.download_gb
        elapsed = max(0.0, at - inst.created_at)
        blocked = self._blocked_at_s(inst.truth)
        if blocked is not None:
            elapsed = min(elapsed, blocked)
        return min(total, elapsed * inst.truth.pull_mbps / 8000.0)

    def _status_line(self, inst: _Inst, now: float) -> str:
        t = inst.truth
        e = now - inst.created_at
        total = self.trace.workload.download_gb
        fatal_wins = t.fatal_at_s is not None and (t.freeze_at_s is None or t.fatal_at_s <= t.freeze_at_s)
        if fatal_wins and t.fatal_at_s is not None and e >= t.fatal_at_s:
            return t.fatal_status or "error"
        seen = e if t.freeze_at_s is None or fatal_wins else min(e, t.freeze_at_s)
        refreshed = math.floor(seen / t.status_every_s) * t.status_every_s
        got = self._downloaded_gb(inst, inst.created_at + refreshed)
        return f"Downloading {got:.2f}/{total:.2f} GB"

    def _instance(self, inst: _Inst, now: float) -> Instance:
        ended, _ = inst.ended_at(now)
        state: InstanceState
        gpu_util: float | None = None
        if ended is not None:
            state, line = "gone", None
        elif inst.stopped:
            state, line = "stopped", "stopped"
        elif self._phase(inst, now) == "running":
            state, line = "running", f"running {inst.spec.image}"
            hung = inst.truth.hangs_at_s is not None and now - inst.created_at >= inst.truth.hangs_at_s
            gpu_util = 0.0 if hung or not inst.truth.computes else GPU_UTIL_BUSY
        else:
            state, line = "loading", self._status_line(inst, now)
        return Instance(
            provider=PROVIDER,
            instance_id=inst.instance_id,
            machine_id=inst.host.machine_id,
            label=inst.spec.label,
            state=state,
            status_line=line,
            ssh=inst.ssh if state == "running" else None,
            gpu_util=gpu_util,
            dph_total=inst.host.offer.dph,
            started_at=inst.created_at,
            raw={"actual_status": state, "status_msg": line, "image": inst.spec.image},
        )

    def _offer(self, h: HostSpec) -> Offer:
        o = h.offer
        offer_id = f"{h.machine_id}#{self._generation[h.machine_id]}"
        raw = {
            "offer_id": offer_id,
            "machine_id": h.machine_id,
            "gpu_name": o.gpu_name,
            "num_gpus": o.num_gpus,
            "gpu_ram_gb": o.gpu_ram_gb,
            "dph": o.dph,
            "storage_per_gb_month": o.storage_per_gb_month,
            "inet_down_per_gb": o.inet_down_per_gb,
            "inet_down_mbps": o.inet_down_mbps,
            "reliability": o.reliability,
            "cuda_max": o.cuda_max,
            "datacenter": o.datacenter,
        }
        return Offer(
            provider=PROVIDER,
            offer_id=offer_id,
            machine_id=h.machine_id,
            gpu_name=o.gpu_name,
            num_gpus=o.num_gpus,
            gpu_ram_gb=o.gpu_ram_gb,
            dph_total=o.dph,
            storage_per_gb_month=o.storage_per_gb_month,
            inet_down_per_gb=o.inet_down_per_gb,
            inet_down_mbps=o.inet_down_mbps,
            reliability=o.reliability,
            cuda_max=o.cuda_max,
            raw=raw,
        )

    def _host_of_offer(self, offer_id: str) -> HostSpec | None:
        machine_id, _, gen = offer_id.rpartition("#")
        try:
            host = self.trace.host(machine_id)
        except KeyError:
            return None
        return host if gen == str(self._generation[machine_id]) else None

    def _inst(self, instance_id: str) -> _Inst:
        inst = self._insts.get(instance_id)
        if inst is None:
            raise KeyError(f"no sim instance {instance_id!r}")
        return inst


class SimReferee:
    """The simulator's own view: truth and billing. Never handed to policy code."""

    def __init__(self, market: SimMarket) -> None:
        self._m = market

    def truth_of(self, instance_id: str) -> HostTruth:
        with self._m._lock:
            return self._m._inst(instance_id).truth

    def host_of(self, instance_id: str) -> HostSpec:
        with self._m._lock:
            return self._m._inst(instance_id).host

    def instance_ids(self) -> list[str]:
        with self._m._lock:
            return list(self._m._insts)

    def ready_at(self, instance_id: str) -> float | None:
        """Clock time the host becomes ready (pull done), or None when it never will."""
        with self._m._lock:
            return self._m._ready_at(self._m._inst(instance_id))

    def pull_seconds(self, instance_id: str) -> float:
        with self._m._lock:
            return self._m._pull_s(self._m._inst(instance_id))

    def preflight_report(self, instance_id: str) -> dict[str, Any] | None:
        """What a preflight prints on this host now; None when it is not running (no SSH)."""
        inst = self._m.status(instance_id)
        if inst.state != "running":
            return None
        return preflight_report(self.truth_of(instance_id))

    def bill(self, instance_id: str, *, as_of_s: float | None = None) -> InstanceBill:
        """Billing from truth: dph over GPU-billed time, storage create->end, traffic per GB."""
        m = self._m
        with m._lock:
            m._sync()
            inst = m._inst(instance_id)
            now = m.clock.now() if as_of_s is None else as_of_s
            ended, reason = inst.ended_at(now)
            horizon = now if ended is None else min(now, ended)
            gpu_s = 0.0
            for start, end in inst.gpu_intervals:
                assert start is not None
                stop = horizon if end is None else min(end, horizon)
                gpu_s += max(0.0, stop - start)
            offer = inst.host.offer
            life_h = max(0.0, horizon - inst.created_at) / 3600.0
            downloaded = m._downloaded_gb(inst, horizon)
            return InstanceBill(
                instance_id=inst.instance_id,
                machine_id=inst.host.machine_id,
                label=inst.spec.label,
                created_at=inst.created_at,
                ended_at=ended,
                end_reason=reason,
                gpu_seconds=gpu_s,
                gpu_usd=offer.dph * gpu_s / 3600.0,
                storage_usd=offer.storage_per_gb_month * inst.disk_gb * life_h / HOURS_PER_MONTH,
                traffic_usd=offer.inet_down_per_gb * downloaded,
                downloaded_gb=downloaded,
                disk_gb=inst.disk_gb,
                as_of_s=now,
                truth=inst.truth,
            )

    def bills(self, *, as_of_s: float | None = None) -> list[InstanceBill]:
        return [self.bill(i, as_of_s=as_of_s) for i in self.instance_ids()]
