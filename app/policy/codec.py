"""JobState to and from plain JSON data, so a real-time driver can keep it between tasks.

Pure and stdlib-only like the rest of the policy: `dump_job(state) -> dict`, `load_job(dict)`.
`load_job(dump_job(s)) == s` for every state (a property test checks it). An offer's raw vendor
record is not kept (it is for the operator's eyes, not for decisions; `Offer.raw` takes no part in
equality). Rows written before a field existed load with that field's default.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from app.market import Offer
from app.policy.bootwatch import BootWatch
from app.policy.provisioning import Attempt, JobState
from app.policy.ranking import JobShape, Requirements

__all__ = ["dump_job", "load_job"]

_OFFER_FIELDS = tuple(f.name for f in fields(Offer) if f.name != "raw")


def _offer(d: dict[str, Any]) -> Offer:
    return Offer(**{k: d[k] for k in _OFFER_FIELDS if k in d})


def _pair(v: Any) -> tuple[float, float] | None:
    return None if v is None else (float(v[0]), float(v[1]))


def _watch(d: dict[str, Any]) -> BootWatch:
    return BootWatch(
        created_at=d["created_at"],
        last_line=d.get("last_line"),
        last_change_at=d.get("last_change_at"),
        first_seen_at=d.get("first_seen_at"),
        intervals=tuple(d.get("intervals", ())),
        first_progress=_pair(d.get("first_progress")),
        last_progress=_pair(d.get("last_progress")),
        total_gb=d.get("total_gb"),
        unknown_since=d.get("unknown_since"),
        polls=d.get("polls", 0),
    )


def _attempt(d: dict[str, Any] | None) -> Attempt | None:
    if d is None:
        return None
    trouble = d.get("trouble")
    return Attempt(
        instance_id=d["instance_id"],
        machine_id=d["machine_id"],
        provider=d["provider"],
        offer=_offer(d["offer"]),
        created_at=d["created_at"],
        watch=_watch(d["watch"]),
        held_work=d.get("held_work", False),
        preflight_started_at=d.get("preflight_started_at"),
        training_started_at=d.get("training_started_at"),
        last_progress_at=d.get("last_progress_at"),
        last_work_s=d.get("last_work_s", 0.0),
        trouble_since=d.get("trouble_since"),
        trouble=None if trouble is None else (str(trouble[0]), str(trouble[1])),
    )


def dump_job(job: JobState) -> dict[str, Any]:
    """Plain JSON-able data for `job`."""
    d = asdict(job)
    d["excluded"] = sorted(job.excluded)
    if job.attempt is not None:
        d["attempt"]["offer"] = {k: getattr(job.attempt.offer, k) for k in _OFFER_FIELDS}
    return d


def load_job(d: dict[str, Any]) -> JobState:
    """The JobState `dump_job` wrote (with this version or an earlier one)."""
    req = dict(d["req"])
    req["gpu_names"] = tuple(req.get("gpu_names", ()))
    req["providers"] = tuple(req.get("providers", ()))
    default = JobState(job_id="", req=Requirements(), shape=JobShape(download_gb=0.0, train_s=0.0, disk_gb=0.0))
    return JobState(
        job_id=d["job_id"],
        req=Requirements(**req),
        shape=JobShape(**d["shape"]),
        phase=d["phase"],
        creates=d.get("creates", default.creates),
        creates_before_reopen=d.get("creates_before_reopen", default.creates_before_reopen),
        failures_in_row=d.get("failures_in_row", default.failures_in_row),
        attempt=_attempt(d.get("attempt")),
        excluded=frozenset(d.get("excluded", ())),
        not_before=d.get("not_before", default.not_before),
        checkpoint_work_s=d.get("checkpoint_work_s", default.checkpoint_work_s),
        lost_at=d.get("lost_at"),
        lost_cause=d.get("lost_cause"),
        lost_machine=d.get("lost_machine"),
        failure=d.get("failure"),
        waiting_since=d.get("waiting_since"),
        standby=bool(d.get("standby", default.standby)),
        progress_hedges=d.get("progress_hedges", default.progress_hedges),
        rentals_max=d.get("rentals_max", default.rentals_max),
    )
