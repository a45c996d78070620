"""JSON shapes of the sim server's HTTP API (renter-visible fields only)."""

from __future__ import annotations

from typing import Any

from app.market import (
    INSTANCE_STATES,
    OFFER_FIELDS,
    Instance,
    InstanceState,
    LaunchSpec,
    Offer,
    OfferQuery,
    SSHEndpoint,
)

__all__ = [
    "instance_from_json",
    "instance_to_json",
    "offer_from_json",
    "offer_to_json",
    "query_from_json",
    "query_to_json",
    "spec_from_json",
    "spec_to_json",
]


def offer_to_json(o: Offer) -> dict[str, Any]:
    d = {f: getattr(o, f) for f in OFFER_FIELDS}
    d["raw"] = dict(o.raw)
    return d


def offer_from_json(d: dict[str, Any]) -> Offer:
    fields: dict[str, Any] = {f: d.get(f) for f in OFFER_FIELDS}
    return Offer(**fields, raw=d.get("raw") or {})


def instance_to_json(i: Instance) -> dict[str, Any]:
    return {
        "provider": i.provider,
        "instance_id": i.instance_id,
        "machine_id": i.machine_id,
        "label": i.label,
        "state": i.state,
        "status_line": i.status_line,
        "ssh": None if i.ssh is None else {"host": i.ssh.host, "port": i.ssh.port, "user": i.ssh.user},
        "gpu_util": i.gpu_util,
        "dph_total": i.dph_total,
        "started_at": i.started_at,
        "raw": dict(i.raw),
    }


def instance_from_json(d: dict[str, Any]) -> Instance:
    ssh = d.get("ssh")
    state: InstanceState = d["state"] if d.get("state") in INSTANCE_STATES else "unknown"
    return Instance(
        provider=d.get("provider", "sim"),
        instance_id=str(d["instance_id"]),
        machine_id=d.get("machine_id"),
        label=d.get("label"),
        state=state,
        status_line=d.get("status_line"),
        ssh=None if not ssh else SSHEndpoint(host=ssh["host"], port=int(ssh["port"]), user=ssh.get("user", "root")),
        gpu_util=d.get("gpu_util"),
        dph_total=d.get("dph_total"),
        started_at=d.get("started_at"),
        raw=d.get("raw") or {},
    )


def spec_to_json(s: LaunchSpec) -> dict[str, Any]:
    return {
        "image": s.image,
        "disk_gb": s.disk_gb,
        "label": s.label,
        "ssh_public_key": s.ssh_public_key,
        "env": dict(s.env),
        "onstart": s.onstart,
    }


def spec_from_json(d: dict[str, Any]) -> LaunchSpec:
    return LaunchSpec(
        image=str(d["image"]),
        disk_gb=float(d.get("disk_gb") or 0.0),
        label=str(d.get("label") or ""),
        ssh_public_key=str(d.get("ssh_public_key") or ""),
        env={str(k): str(v) for k, v in (d.get("env") or {}).items()},
        onstart=str(d.get("onstart") or ""),
    )


def query_to_json(q: OfferQuery) -> dict[str, Any]:
    return {
        "gpu_names": list(q.gpu_names),
        "min_gpu_ram_gb": q.min_gpu_ram_gb,
        "num_gpus": q.num_gpus,
        "max_dph": q.max_dph,
        "disk_gb": q.disk_gb,
        "limit": q.limit,
        "datacenter_only": q.datacenter_only,
    }


def query_from_json(d: dict[str, Any]) -> OfferQuery:
    return OfferQuery(
        gpu_names=tuple(d.get("gpu_names") or ()),
        min_gpu_ram_gb=d.get("min_gpu_ram_gb"),
        num_gpus=int(d.get("num_gpus") or 1),
        max_dph=d.get("max_dph"),
        disk_gb=float(d.get("disk_gb") or 0.0),
        limit=int(d["limit"]) if d.get("limit") is not None else 64,
        datacenter_only=bool(d.get("datacenter_only", False)),
    )
