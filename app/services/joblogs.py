"""`tuneharness logs JOB [-f]`: the trainer's train.log, from the host while it trains (over SSH,
with the key the host was launched with) or from the pulled copy once it does not.

A pulled copy is kept per host under `jobs/<job>/logs/<instance>/train.log` in the artifact store:
the supervisor pulls it when the adapter is pulled, and a cancel pulls it before the stop. A host
lost before either left no copy; the command says so.

`follow` reads the log of whichever host the job trains on now, from where it left off, and marks
each host change (a recovery, a resume): one line `== host <machine> (<instance>) ==`.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.artifacts import ArtifactError, ArtifactStore
from app.market import MarketError
from app.ports import HostShell
from app.services.supervisor import SupervisorService, remote_job_root

__all__ = ["MAX_LOG_BYTES", "LogChunk", "follow", "keep_train_log", "log_key", "read_log"]

MAX_LOG_BYTES = 4 * 2**20  # what one read brings back at most (the newest bytes)
ENDED = ("done", "failed", "cancelled")


def log_key(job_id: str, instance_id: str) -> str:
    return f"jobs/{job_id}/logs/{instance_id}/train.log"


def keep_train_log(shell: HostShell, store: ArtifactStore, *, job_id: str, instance_id: str, staging: Path) -> bool:
    """Copy the host's train.log into the store (best effort: False when it cannot be read)."""
    local = staging / job_id / "logs" / instance_id / "train.log"
    local.parent.mkdir(parents=True, exist_ok=True)
    try:
        shell.get(f"{remote_job_root(job_id)}/job/train.log", local, max_bytes=64 * MAX_LOG_BYTES)
        store.put_file(log_key(job_id, instance_id), local)
    except (OSError, EOFError, ArtifactError):
        return False
    return True


@dataclass(frozen=True, slots=True)
class LogChunk:
    instance_id: str | None
    machine_id: str | None
    text: str
    source: str  # host | pulled | none


def _training_host(sup: SupervisorService, job_id: str) -> tuple[str, str, str] | None:
    """(provider, instance, machine) the job trains on now, if any."""
    loaded = sup.provisioning.state(job_id)
    if loaded is None or loaded[0].phase != "training" or loaded[0].attempt is None:
        return None
    att = loaded[0].attempt
    return att.provider, att.instance_id, att.machine_id


def _from_host(sup: SupervisorService, job_id: str, provider: str, instance_id: str, *, offset: int) -> str | None:
    """The host's train.log from byte `offset` (None when the host cannot be reached)."""
    from app.ssh import SSHError

    try:
        inst = sup.provisioning.market_for(provider).status(instance_id)
        rental = sup.provisioning.rentals.by_instance(provider, instance_id)
        shell = sup.shell_for(inst, rental.opened_by if rental is not None else job_id)
    except (MarketError, OSError, SSHError):
        return None
    path = shlex.quote(f"{remote_job_root(job_id)}/job/train.log")
    try:
        out = shell.run(f"tail -c +{offset + 1} {path} 2>/dev/null | tail -c {MAX_LOG_BYTES}", timeout_s=30)
    except (OSError, EOFError, SSHError):
        return None
    finally:
        shell.close()
    return out.stdout


def _pulled(sup: SupervisorService, job_id: str) -> list[tuple[str, str]]:
    """(instance, text) of every pulled copy, in the order the job used the hosts."""
    order = [r.instance_id for r in sup.provisioning.rentals.all(job=job_id) if r.instance_id]
    out = []
    for inst in order:
        key = log_key(job_id, inst)
        if not sup.store.exists(key):
            continue
        local = sup.staging / job_id / "logs" / inst / "pulled.log"
        local.parent.mkdir(parents=True, exist_ok=True)
        sup.store.get_file(key, local)
        out.append((inst, local.read_bytes()[-MAX_LOG_BYTES:].decode("utf-8", "replace")))
    return out


def read_log(sup: SupervisorService, job_id: str) -> list[LogChunk]:
    """The job's train.log now: from its host while it trains there, else the pulled copies."""
    host = _training_host(sup, job_id)
    if host is not None:
        text = _from_host(sup, job_id, host[0], host[1], offset=0)
        if text is not None:
            return [LogChunk(host[1], host[2], text, "host")]
    pulled = _pulled(sup, job_id)
    machines = {r.instance_id: r.machine_id for r in sup.provisioning.rentals.all(job=job_id)}
    return [LogChunk(i, machines.get(i), t, "pulled") for i, t in pulled] or [LogChunk(None, None, "", "none")]


def follow(sup: SupervisorService, job_id: str, *, wait: Callable[[], bool]) -> Iterator[str]:
    """The job's log as it grows, across slices, recoveries and resumes; a marker line at each host
    change. Ends when the job has ended (after a last read) or `wait()` says stop."""
    current: str | None = None
    offset = 0
    while True:
        rec = sup.jobs.get(job_id)
        host = _training_host(sup, job_id)
        if host is not None:
            if host[1] != current:
                current, offset = host[1], 0
                yield f"== host {host[2]} ({host[1]}) =="
            text = _from_host(sup, job_id, host[0], host[1], offset=offset)
            if text:
                offset += len(text.encode("utf-8"))
                yield from text.splitlines()
        if rec is None or rec.phase in ENDED or not wait():
            return
