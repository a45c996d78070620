"""Market traces (`tuneharness-market-trace/1`): loading and validation.

A trace is what a simulated marketplace rents out: a workload and a list of hosts, each with
an `offer` (all a renter can see) and a `truth` (what really happens; read only by the
simulator). Unspecified truth fields default to a healthy host that delivers what it offers.
A malformed trace is refused with a `TraceError` naming the host index and the field.
The format is documented in docs/simulation.md.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.policy.gpus import canonical_gpu

__all__ = [
    "TRACE_FORMAT",
    "GpuModelTruth",
    "HostOffer",
    "HostSpec",
    "HostTruth",
    "Trace",
    "TraceError",
    "Workload",
    "load_trace",
    "parse_trace",
    "shipped_trace_path",
    "sim_hardware_ids",
]

TRACE_FORMAT = "tuneharness-market-trace/1"
TRACES_DIR = Path(__file__).resolve().parent / "traces"
DEFAULT_PULL_MBPS = 500.0


class TraceError(UserError):
    """A trace file that cannot be simulated; the message names the place and the fix."""


@dataclass(frozen=True, slots=True)
class Workload:
    jobs: int = 1
    image_gb: float = 8.0
    model_gb: float = 15.0
    train_seconds: float = 1140.0
    checkpoint_every_s: float = 300.0
    disk_gb: float = 60.0
    budget_usd: float | None = None

    @property
    def download_gb(self) -> float:
        """What every host pulls before it is ready: image plus model."""
        return self.image_gb + self.model_gb


@dataclass(frozen=True, slots=True)
class HostOffer:
    """What the marketplace lists for a machine (which may be a lie)."""

    gpu_name: str
    gpu_ram_gb: float
    dph: float
    num_gpus: int = 1
    storage_per_gb_month: float = 0.0
    inet_down_per_gb: float = 0.0
    inet_down_mbps: float | None = None
    reliability: float | None = None
    cuda_max: str | None = None
    datacenter: bool = False  # a datacenter host (what `OfferQuery.datacenter_only` asks for)


@dataclass(frozen=True, slots=True)
class HostTruth:
    """What really happens on a machine, in seconds after an instance's create."""

    pull_mbps: float
    actual_gpu_name: str
    actual_gpu_ram_gb: float
    status_every_s: float = 10.0
    freeze_at_s: float | None = None
    fatal_at_s: float | None = None
    fatal_status: str | None = None
    computes: bool = True
    # The image the host runs: "trainer" holds the trainer's whole stack, "bare" only torch (a
    # pytorch runtime image); there the bootstrap installs the stack, taking `install_s`.
    image: str = "trainer"
    install_s: float = 60.0
    tflops_factor: float = 1.0
    dies_at_s: float | None = None
    hangs_at_s: float | None = None
    # What a healthy card of the actual model reaches on the preflight's matmul, as a fraction of
    # its datasheet peak: the trace's `gpu_models`, filled in by the loader (1.0 when not listed).
    healthy_fraction: float = 1.0
    # The hardware's own identity as the preflight reads it; the loader derives a stable one from
    # the machine id when the trace does not give it (the same values on two listings: one host).
    gpu_uuid: str | None = None
    host_machine_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass(frozen=True, slots=True)
class HostSpec:
    index: int
    machine_id: str
    offer: HostOffer
    truth: HostTruth


@dataclass(frozen=True, slots=True)
class GpuModelTruth:
    """What every healthy card of one GPU model does, whoever hosts it."""

    healthy_fraction: float = 1.0  # of its datasheet's bf16 peak, on the preflight's matmul


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    workload: Workload
    hosts: tuple[HostSpec, ...]
    source: str = ""
    gpu_models: Mapping[str, GpuModelTruth] = field(default_factory=dict)  # canonical model -> truth

    def host(self, machine_id: str) -> HostSpec:
        for h in self.hosts:
            if h.machine_id == machine_id:
                return h
        raise KeyError(machine_id)


def shipped_trace_path(name: str) -> Path:
    """Path of a trace shipped in providers/sim/traces (`smoke`, `marketplace`, `adversarial`)."""
    path = TRACES_DIR / (name if name.endswith(".json") else f"{name}.json")
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TRACES_DIR.glob("*.json")))
        raise TraceError(f"no shipped trace named {name!r}. Fix: use one of {known} or a file path")
    return path


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file; a bare shipped name (`smoke`) also works."""
    p = Path(path)
    if not p.exists() and p.suffix == "" and "/" not in str(path):
        p = shipped_trace_path(str(path))
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"trace {p}: cannot be read ({exc.strerror}). Fix: pass an existing trace file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(
            f"trace {p}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). Fix: correct the JSON"
        ) from None
    return parse_trace(data, source=str(p))


class _Checker:
    """Typed field readers that raise TraceError naming `where.field`."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, problem: str, fix: str) -> TraceError:
        prefix = f"trace {self.source}: " if self.source else "trace: "
        return TraceError(f"{prefix}{where}: {problem}. Fix: {fix}")

    def obj(self, value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, f"must be an object, got {_show(value)}", "write a JSON object {...}")
        return value

    def no_unknown(self, data: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in data:
            if key not in allowed:
                raise self.fail(f"{where}.{key}", "unknown field", f"remove it or use one of: {', '.join(allowed)}")

    def number(
        self,
        data: Mapping[str, Any],
        key: str,
        where: str,
        *,
        default: float | None = None,
        required: bool = False,
        minimum: float | None = None,
        positive: bool = False,
        maximum: float | None = None,
    ) -> float | None:
        if key not in data or data[key] is None:
            if required:
                raise self.fail(f"{where}.{key}", "is required", "add it as a number")
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(f"{where}.{key}", f"must be a number, got {_show(value)}", "write a plain number")
        v = float(value)
        if positive and v <= 0:
            raise self.fail(f"{where}.{key}", f"must be > 0, got {_show(value)}", "use a positive number")
        if minimum is not None and v < minimum:
            raise self.fail(
                f"{where}.{key}", f"must be >= {minimum:g}, got {_show(value)}", f"use a number >= {minimum:g}"
            )
        if maximum is not None and v > maximum:
            raise self.fail(
                f"{where}.{key}", f"must be <= {maximum:g}, got {_show(value)}", f"use a number <= {maximum:g}"
            )
        return v

    def req_number(self, data: Mapping[str, Any], key: str, where: str, **kw: Any) -> float:
        v = self.number(data, key, where, required=True, **kw)
        assert v is not None
        return v

    def integer(self, data: Mapping[str, Any], key: str, where: str, *, default: int, minimum: int) -> int:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(f"{where}.{key}", f"must be a whole number, got {_show(value)}", "write an integer")
        if value < minimum:
            raise self.fail(f"{where}.{key}", f"must be >= {minimum}, got {value}", f"use an integer >= {minimum}")
        return value

    def string(
        self, data: Mapping[str, Any], key: str, where: str, *, required: bool = False, default: str | None = None
    ) -> str | None:
        if key not in data or data[key] is None:
            if required:
                raise self.fail(f"{where}.{key}", "is required", "add it as a non-empty string")
            return default
        value = data[key]
        if not isinstance(value, str) or not value.strip():
            raise self.fail(f"{where}.{key}", f"must be a non-empty string, got {_show(value)}", "write a string")
        return value

    def boolean(self, data: Mapping[str, Any], key: str, where: str, *, default: bool) -> bool:
        if key not in data or data[key] is None:
            return default
        value = data[key]
        if not isinstance(value, bool):
            raise self.fail(f"{where}.{key}", f"must be true or false, got {_show(value)}", "write true or false")
        return value


IMAGES = ("trainer", "bare")


def _image(c: _Checker, t: Mapping[str, Any], where: str) -> str:
    image = c.string(t, "image", where, default="trainer") or "trainer"
    if image not in IMAGES:
        raise c.fail(
            f"{where}.image", f"must be one of {', '.join(IMAGES)}, got {_show(image)}", 'write "bare" or "trainer"'
        )
    return image


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, float | int) or isinstance(value, bool) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


_TOP_FIELDS = ("format", "name", "workload", "hosts", "description", "gpu_models")
_GPU_MODEL_FIELDS = ("healthy_fraction",)
_WORKLOAD_FIELDS = ("jobs", "image_gb", "model_gb", "train_seconds", "checkpoint_every_s", "disk_gb", "budget_usd")
_HOST_FIELDS = ("machine_id", "offer", "truth", "note")
_OFFER_FIELDS = (
    "gpu_name",
    "num_gpus",
    "gpu_ram_gb",
    "dph",
    "storage_per_gb_month",
    "inet_down_per_gb",
    "inet_down_mbps",
    "reliability",
    "cuda_max",
    "datacenter",
)
_TRUTH_FIELDS = (
    "pull_mbps",
    "status_every_s",
    "freeze_at_s",
    "fatal_at_s",
    "fatal_status",
    "computes",
    "image",
    "install_s",
    "actual_gpu_ram_gb",
    "actual_gpu_name",
    "tflops_factor",
    "dies_at_s",
    "hangs_at_s",
    "gpu_uuid",
    "host_machine_id",
)


def parse_trace(data: Any, *, source: str = "") -> Trace:
    """Validate a decoded trace; raise TraceError naming `hosts[i].<section>.<field>`."""
    c = _Checker(source)
    top = c.obj(data, "top level")
    c.no_unknown(top, _TOP_FIELDS, "top level")
    fmt = top.get("format")
    if fmt != TRACE_FORMAT:
        raise c.fail("format", f"must be {TRACE_FORMAT!r}, got {_show(fmt)}", f'set "format": "{TRACE_FORMAT}"')
    name = c.string(top, "name", "top level", default=Path(source).stem if source else "trace") or "trace"

    wl = c.obj(top.get("workload", {}), "workload")
    c.no_unknown(wl, _WORKLOAD_FIELDS, "workload")
    d = Workload()
    workload = Workload(
        jobs=c.integer(wl, "jobs", "workload", default=d.jobs, minimum=1),
        image_gb=c.number(wl, "image_gb", "workload", default=d.image_gb, minimum=0) or 0.0,
        model_gb=c.number(wl, "model_gb", "workload", default=d.model_gb, minimum=0) or 0.0,
        train_seconds=c.number(wl, "train_seconds", "workload", default=d.train_seconds, positive=True) or 0.0,
        checkpoint_every_s=c.number(wl, "checkpoint_every_s", "workload", default=d.checkpoint_every_s, positive=True)
        or 0.0,
        disk_gb=c.number(wl, "disk_gb", "workload", default=d.disk_gb, minimum=0) or 0.0,
        budget_usd=c.number(wl, "budget_usd", "workload", default=None, minimum=0),
    )
    if workload.download_gb <= 0:
        raise c.fail("workload.image_gb", "image_gb + model_gb must be > 0", "give the image or model a size")

    models: dict[str, GpuModelTruth] = {}
    for model, raw in c.obj(top.get("gpu_models", {}), "gpu_models").items():
        mw = f"gpu_models.{model}"
        m = c.obj(raw, mw)
        c.no_unknown(m, _GPU_MODEL_FIELDS, mw)
        fraction = c.number(m, "healthy_fraction", mw, default=1.0, positive=True, maximum=1.5) or 1.0
        models[canonical_gpu(model)] = GpuModelTruth(healthy_fraction=fraction)

    raw_hosts = top.get("hosts")
    if not isinstance(raw_hosts, list) or not raw_hosts:
        raise c.fail("hosts", f"must be a non-empty list, got {_show(raw_hosts)}", "list at least one host")
    hosts: list[HostSpec] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_hosts):
        host = _parse_host(c, i, raw, seen)
        known = models.get(canonical_gpu(host.truth.actual_gpu_name))
        if known is not None:
            host = replace(host, truth=replace(host.truth, healthy_fraction=known.healthy_fraction))
        hosts.append(host)
    return Trace(name=name, workload=workload, hosts=tuple(hosts), source=source, gpu_models=models)


def sim_hardware_ids(machine_id: str) -> tuple[str, str]:
    """The GPU UUID and /etc/machine-id a simulated machine reports: stable per machine id."""
    gpu = uuid.uuid5(uuid.NAMESPACE_URL, f"tuneharness-sim:gpu:{machine_id}")
    host = uuid.uuid5(uuid.NAMESPACE_URL, f"tuneharness-sim:host:{machine_id}")
    return f"GPU-{gpu}", host.hex


def _parse_host(c: _Checker, i: int, raw: Any, seen: dict[str, int]) -> HostSpec:
    where = f"hosts[{i}]"
    host = c.obj(raw, where)
    c.no_unknown(host, _HOST_FIELDS, where)
    machine_id = c.string(host, "machine_id", where, required=True)
    assert machine_id is not None
    if machine_id in seen:
        raise c.fail(
            f"{where}.machine_id",
            f"{machine_id!r} is already used by hosts[{seen[machine_id]}]",
            "give every host its own machine_id",
        )
    seen[machine_id] = i

    ow = f"{where}.offer"
    o = c.obj(host.get("offer"), ow)
    c.no_unknown(o, _OFFER_FIELDS, ow)
    gpu_name = c.string(o, "gpu_name", ow, required=True)
    assert gpu_name is not None
    cuda_max = o.get("cuda_max")
    if cuda_max is not None and not isinstance(cuda_max, str):
        if isinstance(cuda_max, int | float) and not isinstance(cuda_max, bool):
            cuda_max = f"{cuda_max}"
        else:
            raise c.fail(f"{ow}.cuda_max", f"must be a version string, got {_show(cuda_max)}", 'write e.g. "12.4"')
    offer = HostOffer(
        gpu_name=gpu_name,
        gpu_ram_gb=c.req_number(o, "gpu_ram_gb", ow, positive=True),
        dph=c.req_number(o, "dph", ow, minimum=0),
        num_gpus=c.integer(o, "num_gpus", ow, default=1, minimum=1),
        storage_per_gb_month=c.number(o, "storage_per_gb_month", ow, default=0.0, minimum=0) or 0.0,
        inet_down_per_gb=c.number(o, "inet_down_per_gb", ow, default=0.0, minimum=0) or 0.0,
        inet_down_mbps=c.number(o, "inet_down_mbps", ow, default=None, positive=True),
        reliability=c.number(o, "reliability", ow, default=None, minimum=0, maximum=1),
        cuda_max=cuda_max,
        datacenter=c.boolean(o, "datacenter", ow, default=False),
    )

    tw = f"{where}.truth"
    t = c.obj(host.get("truth", {}) if host.get("truth") is not None else {}, tw)
    c.no_unknown(t, _TRUTH_FIELDS, tw)
    fatal_at = c.number(t, "fatal_at_s", tw, default=None, minimum=0)
    fatal_status = c.string(t, "fatal_status", tw)
    if fatal_at is not None and fatal_status is None:
        raise c.fail(f"{tw}.fatal_status", "is required when fatal_at_s is set", "give the fatal status line text")
    if fatal_status is not None and fatal_at is None:
        raise c.fail(
            f"{tw}.fatal_at_s", "is required when fatal_status is set", "give the instant in seconds after create"
        )
    truth = HostTruth(
        pull_mbps=c.number(t, "pull_mbps", tw, default=offer.inet_down_mbps or DEFAULT_PULL_MBPS, positive=True)
        or DEFAULT_PULL_MBPS,
        status_every_s=c.number(t, "status_every_s", tw, default=10.0, positive=True) or 10.0,
        freeze_at_s=c.number(t, "freeze_at_s", tw, default=None, minimum=0),
        fatal_at_s=fatal_at,
        fatal_status=fatal_status,
        computes=c.boolean(t, "computes", tw, default=True),
        image=_image(c, t, tw),
        install_s=c.number(t, "install_s", tw, default=60.0, minimum=0) or 0.0,
        actual_gpu_ram_gb=c.number(t, "actual_gpu_ram_gb", tw, default=offer.gpu_ram_gb, positive=True)
        or offer.gpu_ram_gb,
        actual_gpu_name=c.string(t, "actual_gpu_name", tw, default=offer.gpu_name) or offer.gpu_name,
        tflops_factor=c.number(t, "tflops_factor", tw, default=1.0, positive=True, maximum=2.0) or 1.0,
        dies_at_s=c.number(t, "dies_at_s", tw, default=None, minimum=0),
        hangs_at_s=c.number(t, "hangs_at_s", tw, default=None, minimum=0),
        gpu_uuid=c.string(t, "gpu_uuid", tw, default=sim_hardware_ids(machine_id)[0]),
        host_machine_id=c.string(t, "host_machine_id", tw, default=sim_hardware_ids(machine_id)[1]),
    )
    return HostSpec(index=i, machine_id=machine_id, offer=offer, truth=truth)
