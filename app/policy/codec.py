"""JobState to and from plain JSON data, so a real-time driver can keep it between tasks.

Pure and stdlib-only like the rest of the policy: `dump_job(state) -> dict`, `load_job(dict)`.
An offer's raw vendor record is not kept (it is for the operator's eyes, not for decisions).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from app.market import Offer
from app.policy.bootwatch import BootWatch
from app.policy.provisioning import Attempt, JobState
from app.policy.ranking import JobShape, Requirements

__all__ = ["dump_job", "load_job"]

_OFFER_FIELDS = ("provider", "offer_id", "machine_id", "gpu_name", "num_gpus", "gpu_ram_gb", "dph_total",
                 "storage_per_gb_month", "inet_down_per_gb", "inet_down_mbps", "reliability", "cuda_max")


def _offer(d: dict[str, Any]) -> Offer:
    return Offer(**{k: d[k] for k in _OFFER_FIELDS})


def _pair(v: Any) -> tuple[float, float] | None:
    return None if v is None else (float(v[0]), float(v[1]))


def _watch(d: dict[str, Any]) -> BootWatch:
    return BootWatch(
        created_at=d["created_at"], last_line=d["last_line"], last_change_at=d["last_change_at"],
        first_seen_at=d["first_seen_at"], intervals=tuple(d["intervals"]), first_progress=_pair(d["first_progress"]),
        last_progress=_pair(d["last_progress"]), total_gb=d["total_gb"], unknown_since=d["unknown_since"],
        polls=d["polls"],
    )


def _attempt(d: dict[str, Any] | None) -> Attempt | None:
    if d is None:
        return None
    return Attempt(
        instance_id=d["instance_id"], machine_id=d["machine_id"], provider=d["provider"], offer=_offer(d["offer"]),
        created_at=d["created_at"], watch=_watch(d["watch"]), held_work=d["held_work"],
        preflight_started_at=d["preflight_started_at"], training_started_at=d["training_started_at"],
        last_progress_at=d["last_progress_at"], last_work_s=d["last_work_s"], trouble_since=d["trouble_since"],
        trouble=None if d["trouble"] is None else (str(d["trouble"][0]), str(d["trouble"][1])),
    )


def dump_job(job: JobState) -> dict[str, Any]:
    """Plain JSON-able data for `job`."""
    d = asdict(job)
    d["excluded"] = sorted(job.excluded)
    if job.attempt is not None:
        d["attempt"]["offer"] = {k: getattr(job.attempt.offer, k) for k in _OFFER_FIELDS}
    return d


def load_job(d: dict[str, Any]) -> JobState:
    """The JobState `dump_job` wrote."""
    req = dict(d["req"])
    req["gpu_names"] = tuple(req["gpu_names"])
    req["providers"] = tuple(req["providers"])
    return JobState(
        job_id=d["job_id"], req=Requirements(**req), shape=JobShape(**d["shape"]), phase=d["phase"],
        creates=d["creates"], failures_in_row=d["failures_in_row"], attempt=_attempt(d["attempt"]),
        excluded=frozenset(d["excluded"]), not_before=d["not_before"], checkpoint_work_s=d["checkpoint_work_s"],
        lost_at=d["lost_at"], lost_cause=d["lost_cause"], lost_machine=d["lost_machine"], failure=d["failure"],
        waiting_since=d["waiting_since"],
    )
