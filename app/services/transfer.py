"""Moving a job's files onto its host: outside the monitor task, once per host, resumable, billed.

The monitor task never moves a model: on a host it has not started yet it asks for a transfer
(`TransferService.request`) and looks again later; the transfer runs in its own task
(`transfer_to_host`, long elapsed-time bound) and the slice starts only once it is `done`.

A transfer is a `TransferPlan`: files pushed from the control plane (trainer code, job.json,
data, a private base model, the newest pulled checkpoint) and, for a public model pinned to a
commit, a `HubFetch` the host runs itself (`python -m trainer fetch-model`, detached, resumable,
verified), so a public model never crosses the operator's uplink.

- Once per host: the host keeps `transfer.json` (each pushed file's size and sha256, written
  after the file was verified); a file listed there with the same size and hash is not sent
  again. A second slice on the same host moves nothing; a new host gets everything.
- Resumable: a pushed file grows as `FILE.part` in chunks (each put as `FILE.chunk`, appended
  only when `FILE.part` has exactly the size the chunk starts at); a re-run continues from the
  part's size after checking its prefix's sha256, so a killed task restarts neither from the
  first file nor from the first byte. The whole file's sha256 is checked before it is renamed.
- One runner at a time: a lease in `host_transfers` (renewed with each chunk); a task killed
  mid-way leaves the lease to expire and the monitor asks for a new task.
- Billed: every byte moved to the host (pushed, or fetched by it) is recorded against the
  rental (`Rentals.add_traffic`) and counts in its spend at the offer's traffic price.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import TuneharnessError
from app.ledger import Event, Ledger
from app.ports import Clock, HostShell
from app.rentals import Rentals

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HOST_MANIFEST",
    "HubFetch",
    "PushFile",
    "TransferFailed",
    "TransferPlan",
    "TransferProgress",
    "TransferRow",
    "TransferService",
]

DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
DEFAULT_LEASE_S = 90.0
HOST_MANIFEST = "transfer.json"
# trainer/fetch.py's exits that another try cannot fix: 2 bad arguments, 4 a hash that does not match
FETCH_REFUSED = (2, 4)
MAX_FETCH_RESTARTS = 5
_QUEUED = "queued"


class TransferFailed(TuneharnessError):
    """The job's files cannot be put on this host as they are (a hash that does not match)."""


class _LeaseLost(Exception):
    """Another task took this transfer's lease (this one was presumed dead): stop quietly."""


class TransferRow(SQLModel, table=True):
    """One job's transfer onto one host, and who is moving it now."""

    __tablename__ = "host_transfers"

    id: str = Field(primary_key=True)  # "<job>@<instance>"
    job_id: str = Field(index=True)
    instance_id: str
    provider: str = ""
    state: str = "pending"  # pending | running | done | failed
    bytes_done: int = 0
    bytes_total: int = 0
    bytes_moved: int = 0  # onto the host, this transfer (billed)
    rate_bytes_per_s: float | None = None
    current: str | None = None
    runner: str | None = None
    lease_until: float = 0.0
    started_at: float | None = None
    updated_at: float = 0.0
    resume_step: int = 0
    error: str | None = None
    failures: int = 0  # tasks in a row that ended in an error without moving a byte


_T = TransferRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class PushFile:
    local: Path
    remote: str  # relative to the job's directory on the host


@dataclass(frozen=True, slots=True)
class HubFetch:
    endpoint: str
    repo: str
    revision: str
    dest: str  # relative to the job's directory on the host


@dataclass(frozen=True, slots=True)
class TransferPlan:
    root: str  # the job's directory on the host
    files: tuple[PushFile, ...]
    fetch: HubFetch | None = None
    resume_step: int = 0  # the checkpoint the plan carries (0: none)
    code_prefix: str = "code/"  # pushed first: the host's fetcher needs it


@dataclass(frozen=True, slots=True)
class TransferProgress:
    job_id: str
    instance_id: str
    state: str
    bytes_done: int
    bytes_total: int
    bytes_moved: int
    rate_bytes_per_s: float | None
    current: str | None
    resume_step: int
    error: str | None
    lease_until: float
    runner: str | None
    failures: int = 0

    @property
    def done(self) -> bool:
        return self.state == "done"


def _progress(r: Any) -> TransferProgress:
    return TransferProgress(
        r.job_id,
        r.instance_id,
        r.state,
        int(r.bytes_done),
        int(r.bytes_total),
        int(r.bytes_moved),
        r.rate_bytes_per_s,
        r.current,
        int(r.resume_step),
        r.error,
        float(r.lease_until),
        r.runner,
        int(r.failures or 0),
    )


def _sha256_file(path: Path, *, limit: int | None = None) -> str:
    h = hashlib.sha256()
    left = path.stat().st_size if limit is None else limit
    with path.open("rb") as f:
        while left > 0:
            block = f.read(min(1 << 20, left))
            if not block:
                break
            h.update(block)
            left -= len(block)
    return h.hexdigest()


@dataclass
class _Run:
    """One task's pass over a plan: what it moved, for the progress row and the bill."""

    job_id: str
    instance_id: str
    runner: str
    started: float
    done: int = 0
    total: int = 0
    moved: int = 0
    fetched_seen: int = 0
    current: str | None = None
    billed_keys: list[str] = field(default_factory=list)


class TransferService:
    def __init__(
        self,
        engine: Engine,
        *,
        rentals: Rentals,
        clock: Clock,
        staging: Path,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        lease_s: float = DEFAULT_LEASE_S,  # wall seconds
        fetch_poll_s: float = 2.0,
    ) -> None:
        self.engine = engine
        self.rentals = rentals
        self.ledger = Ledger(engine)
        self.clock = clock
        self.staging = staging
        self.chunk_bytes = chunk_bytes
        # the lease is in wall seconds (a task's life); as seconds of the clock (scaled under the sim)
        wall_per_clock_s = clock.wall_seconds(1.0)
        self.lease_s = lease_s / wall_per_clock_s if wall_per_clock_s > 0 else lease_s
        self.fetch_poll_s = fetch_poll_s

    # -- reads ---------------------------------------------------------------------------------
    def get(self, job_id: str, instance_id: str) -> TransferProgress | None:
        with read_connection(self.engine) as conn:
            r = conn.execute(select(_T).where(_T.c.id == f"{job_id}@{instance_id}")).first()
        return None if r is None else _progress(r)

    def of_job(self, job_id: str) -> list[TransferProgress]:
        with read_connection(self.engine) as conn:
            return [_progress(r) for r in conn.execute(select(_T).where(_T.c.job_id == job_id))]

    # -- the monitor's side --------------------------------------------------------------------
    def request(self, job_id: str, provider: str, instance_id: str) -> bool:
        """The monitor wants the job's files on this host: True when the caller should enqueue a
        transfer task (none queued or running with a live lease, and not done or failed)."""
        now = self.clock.now()
        key = f"{job_id}@{instance_id}"
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{key}") as conn:
            r = conn.execute(select(_T).where(_T.c.id == key)).first()
            if r is not None and (r.state in ("done", "failed") or float(r.lease_until) > now):
                return False
            values = {"runner": _QUEUED, "lease_until": now + self.lease_s, "updated_at": now}
            if r is None:
                conn.execute(
                    _T.insert().values(id=key, job_id=job_id, instance_id=instance_id, provider=provider, **values)
                )
            else:
                conn.execute(_T.update().where(_T.c.id == key).values(**values))
        return True

    def forget(self, job_id: str, instance_id: str) -> None:
        """The host lost the job's directory: the next request transfers everything again."""
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{job_id}@{instance_id}") as conn:
            conn.execute(_T.delete().where(_T.c.id == f"{job_id}@{instance_id}"))

    # -- the transfer task's side --------------------------------------------------------------
    def _claim(self, job_id: str, provider: str, instance_id: str, runner: str) -> bool:
        now = self.clock.now()
        key = f"{job_id}@{instance_id}"
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{key}") as conn:
            r = conn.execute(select(_T).where(_T.c.id == key)).first()
            if r is not None and r.state in ("done", "failed"):
                return False
            if r is not None and r.runner not in (None, _QUEUED, runner) and float(r.lease_until) > now:
                return False  # another task moves these files now
            values = {"runner": runner, "lease_until": now + self.lease_s, "updated_at": now, "state": "running"}
            if r is None:
                conn.execute(
                    _T.insert().values(
                        id=key, job_id=job_id, instance_id=instance_id, provider=provider, started_at=now, **values
                    )
                )
            else:
                conn.execute(
                    _T.update()
                    .where(_T.c.id == key)
                    .values(started_at=r.started_at if r.started_at is not None else now, **values)
                )
        return True

    def _save(self, run: _Run, **extra: Any) -> None:
        """Progress and a renewed lease; raises TransferFailed if another runner took the lease."""
        now = self.clock.now()
        key = f"{run.job_id}@{run.instance_id}"
        elapsed = max(1e-6, now - run.started)
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{key}") as conn:
            r = conn.execute(select(_T.c.runner, _T.c.bytes_moved).where(_T.c.id == key)).first()
            if r is None or r.runner != run.runner:
                raise _LeaseLost(key)
            values: dict[str, Any] = {
                "bytes_done": run.done,
                "bytes_total": run.total,
                "rate_bytes_per_s": run.moved / elapsed if run.moved else None,
                "current": run.current,
                "updated_at": now,
                "lease_until": now + self.lease_s,
                **extra,
            }
            conn.execute(_T.update().where(_T.c.id == key).values(**values))

    def _bill(self, run: _Run, provider: str, nbytes: int, key: str) -> None:
        if nbytes <= 0:
            return
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{run.job_id}@{run.instance_id}") as conn:
            conn.execute(
                _T.update()
                .where(_T.c.id == f"{run.job_id}@{run.instance_id}")
                .values(bytes_moved=_T.c.bytes_moved + nbytes)
            )
        rental = self.rentals.by_instance(provider, run.instance_id)
        if rental is not None:
            self.rentals.add_traffic(rental.id, nbytes=nbytes, key=key, now=self.clock.now())

    def run(
        self,
        job_id: str,
        provider: str,
        instance_id: str,
        *,
        shell: HostShell,
        plan: TransferPlan,
        deadline_s: float | None = None,
        runner: str | None = None,
    ) -> TransferProgress | None:
        """Move `plan` onto the host until done, failed, or `deadline_s` (clock seconds from now)
        passes (then the lease is released and the monitor asks for another task). None when
        another task holds the lease, or there is nothing to do."""
        runner = runner or uuid.uuid4().hex
        if not self._claim(job_id, provider, instance_id, runner):
            return None
        now = self.clock.now()
        run = _Run(job_id, instance_id, runner, started=now)
        deadline = None if deadline_s is None else now + deadline_s
        try:
            finished = self._move(run, provider, shell, plan, deadline)
        except _LeaseLost:
            return None
        except TransferFailed as exc:
            self._save(run, state="failed", error=str(exc)[:500], runner=None, lease_until=0.0)
            self.ledger.append(
                Event(
                    kind="transfer_failed",
                    job=job_id,
                    instance=instance_id,
                    provider=provider,
                    reason=str(exc)[:500],
                    idempotency_key=f"{job_id}:transfer_failed:{instance_id}",
                )
            )
            return self.get(job_id, instance_id)
        except Exception as exc:  # SSH down, the host gone, a soft time limit: the next task resumes
            self._release(run, error=f"{type(exc).__name__}: {exc}"[:500], failed=run.moved == 0)
            raise
        except BaseException:
            self._release(run)
            raise
        if not finished:
            self._release(run)
            return self.get(job_id, instance_id)
        self._save(run, state="done", runner=None, lease_until=0.0, resume_step=plan.resume_step, current=None)
        got = self.get(job_id, instance_id)
        assert got is not None
        rental = self.rentals.by_instance(provider, instance_id)
        self.ledger.append(
            Event(
                kind="transfer_done",
                job=job_id,
                instance=instance_id,
                provider=provider,
                reason=f"{got.bytes_total} bytes on the host; {got.bytes_moved} moved",
                amount_usd=None if rental is None else self.rentals.traffic_usd(rental, nbytes=got.bytes_moved),
                payload={
                    "bytes_total": got.bytes_total,
                    "bytes_moved": got.bytes_moved,
                    "hub": None if plan.fetch is None else f"{plan.fetch.repo}@{plan.fetch.revision}",
                    "resume_step": plan.resume_step,
                },
                idempotency_key=f"{job_id}:transfer_done:{instance_id}",
            )
        )
        return got

    def _release(self, run: _Run, *, error: str | None = None, failed: bool = False) -> None:
        key = f"{run.job_id}@{run.instance_id}"
        values: dict[str, Any] = {"runner": None, "lease_until": 0.0, "updated_at": self.clock.now()}
        if error is not None:
            values["error"] = error
        values["failures"] = _T.c.failures + 1 if failed else 0
        with write_transaction(self.engine, lock=f"tuneharness.transfer.{key}") as conn:
            conn.execute(_T.update().where(_T.c.id == key, _T.c.runner == run.runner).values(**values))

    # -- the moving ----------------------------------------------------------------------------
    def _local_hashes(self, job_id: str, files: tuple[PushFile, ...]) -> dict[str, tuple[int, str]]:
        """(size, sha256) of each local file, cached by size and mtime (a model is hashed once)."""
        cache_path = self.staging / job_id / "hashes.json"
        try:
            cache: dict[str, Any] = json.loads(cache_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cache = {}
        out: dict[str, tuple[int, str]] = {}
        for f in files:
            st = f.local.stat()
            stamp = f"{st.st_size}:{st.st_mtime_ns}"
            known = cache.get(str(f.local))
            if not (isinstance(known, dict) and known.get("stamp") == stamp):
                known = {"stamp": stamp, "sha256": _sha256_file(f.local)}
                cache[str(f.local)] = known
            out[f.remote] = (st.st_size, str(known["sha256"]))
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cache), encoding="utf-8")
        tmp.replace(cache_path)
        return out

    def _host_manifest(self, shell: HostShell, root: str) -> dict[str, Any]:
        """The host's record of verified files, less any no longer there at its size (one command)."""
        r = shlex.quote(root)
        res = shell.run(f"cat {r}/{HOST_MANIFEST} 2>/dev/null; true", timeout_s=30)
        try:
            loaded = json.loads(res.stdout or "{}")
        except ValueError:
            return {}
        if not isinstance(loaded, dict) or not loaded:
            return {}
        names = " ".join(shlex.quote(name) for name in sorted(loaded))
        res = shell.run(f"cd {r} && stat -c '%s %n' -- {names} 2>/dev/null; true", timeout_s=60)
        sizes: dict[str, str] = {}
        for line in res.stdout.splitlines():
            size, _, name = line.partition(" ")
            sizes[name] = size
        return {
            name: entry
            for name, entry in loaded.items()
            if isinstance(entry, dict) and sizes.get(name) == str(entry.get("size"))
        }

    def _write_manifest(self, shell: HostShell, plan: TransferPlan, manifest: Mapping[str, Any], job_id: str) -> None:
        local = self.staging / job_id / "host-manifest.json"
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(json.dumps(dict(manifest), sort_keys=True), encoding="utf-8")
        shell.put(local, f"{plan.root}/{HOST_MANIFEST}")

    def _move(self, run: _Run, provider: str, shell: HostShell, plan: TransferPlan, deadline: float | None) -> bool:
        hashes = self._local_hashes(run.job_id, plan.files)
        manifest = self._host_manifest(shell, plan.root)
        run.total = sum(size for size, _ in hashes.values())
        code = [f for f in plan.files if f.remote.startswith(plan.code_prefix)]
        rest = [f for f in plan.files if not f.remote.startswith(plan.code_prefix)]
        fetch_started = False
        for i, f in enumerate([*code, *rest]):
            if plan.fetch is not None and not fetch_started and i == len(code):
                self._start_fetch(shell, plan)
                fetch_started = True
            size, sha = hashes[f.remote]
            if manifest.get(f.remote) == {"size": size, "sha256": sha}:
                run.done += size
                continue
            if deadline is not None and self.clock.now() >= deadline:
                return False
            run.current = f.remote
            if not self._push(run, provider, shell, f, plan.root, size, sha, deadline):
                return False
            manifest[f.remote] = {"size": size, "sha256": sha}
            self._write_manifest(shell, plan, manifest, run.job_id)
            self._save(run)
        if plan.fetch is not None:
            if not fetch_started:
                self._start_fetch(shell, plan)
            return self._await_fetch(run, provider, shell, plan, deadline)
        return True

    def _push(
        self,
        run: _Run,
        provider: str,
        shell: HostShell,
        f: PushFile,
        root: str,
        size: int,
        sha: str,
        deadline: float | None,
    ) -> bool:
        dest = f"{root}/{f.remote}"
        part, chunk = shlex.quote(dest + ".part"), shlex.quote(dest + ".chunk")
        q = shlex.quote(dest)
        if size <= self.chunk_bytes:
            shell.put(f.local, dest)  # one SFTP put, renamed into place by the shell
            run.moved += size
            run.done += size
            self._bill(run, provider, size, f"{run.runner}:{f.remote}:0")
            return True
        res = shell.run(f"stat -c %s {part} 2>/dev/null || echo 0", timeout_s=30)
        have = int(res.stdout.strip() or 0) if res.stdout.strip().isdigit() else 0
        stale = have > size or (
            have > 0 and self._remote_sha(shell, dest + ".part", limit=have) != _sha256_file(f.local, limit=have)
        )
        if stale:
            shell.run(f"rm -f {part}", timeout_s=30)
            have = 0
        run.done += have
        stage = self.staging / run.job_id / "chunks"
        stage.mkdir(parents=True, exist_ok=True)
        local_chunk = stage / (hashlib.sha256(f.remote.encode()).hexdigest()[:16] + ".chunk")
        with f.local.open("rb") as src:
            while have < size:
                if deadline is not None and self.clock.now() >= deadline:
                    return False
                src.seek(have)
                data = src.read(min(self.chunk_bytes, size - have))
                local_chunk.write_bytes(data)
                shell.put(local_chunk, dest + ".chunk")
                res = shell.run(
                    f'if [ "$(stat -c %s {part} 2>/dev/null || echo 0)" = "{have}" ]; then cat {chunk} >> {part}; fi; '
                    f"rm -f {chunk}; stat -c %s {part} 2>/dev/null || echo 0",
                    timeout_s=120,
                )
                self._bill(run, provider, len(data), f"{run.runner}:{f.remote}:{have}")
                run.moved += len(data)
                now_have = int(res.stdout.strip().splitlines()[-1]) if res.stdout.strip() else 0
                run.done += now_have - have
                have = now_have
                self._save(run)
        local_chunk.unlink(missing_ok=True)
        if self._remote_sha(shell, dest + ".part") != sha:
            shell.run(f"rm -f {part}", timeout_s=30)
            raise TransferFailed(f"{f.remote}: the host's copy does not match its sha256 (the host's disk?)")
        res = shell.run(f"mv -f {part} {q}", timeout_s=30)
        if res.exit_code != 0:
            raise OSError(f"mv {dest}: {res.stderr[-200:]}")
        return True

    def _remote_sha(self, shell: HostShell, path: str, *, limit: int | None = None) -> str:
        p = shlex.quote(path)
        cmd = f"head -c {limit} {p} | sha256sum" if limit is not None else f"sha256sum {p}"
        res = shell.run(cmd, timeout_s=600)
        return res.stdout.split()[0] if res.exit_code == 0 and res.stdout.split() else ""

    # -- the host's own download ---------------------------------------------------------------
    def _start_fetch(self, shell: HostShell, plan: TransferPlan) -> None:
        """Start `python -m trainer fetch-model` detached, unless it runs or already succeeded."""
        assert plan.fetch is not None
        hub = plan.fetch
        r = shlex.quote(plan.root)
        inner = (
            f'cd code && "$0" -m trainer fetch-model --endpoint {shlex.quote(hub.endpoint)} '
            f"--repo {shlex.quote(hub.repo)} --revision {shlex.quote(hub.revision)} "
            f"--dest ../{shlex.quote(hub.dest)} --progress ../fetch.progress > ../fetch.out 2>&1; "
            "echo $? > ../fetch.exit"
        )
        command = (
            f'cd {r} && if [ -f fetch.pid ] && kill -0 "$(cat fetch.pid)" 2>/dev/null; then exit 0; fi; '
            f'if [ "$(cat fetch.exit 2>/dev/null)" = "0" ]; then exit 0; fi; '
            "rm -f fetch.exit && PY=$(command -v python3 || command -v python) && "
            f'nohup setsid sh -c {shlex.quote(inner)} "$PY" > /dev/null 2>&1 < /dev/null & '
            "echo $! > fetch.pid"
        )
        res = shell.run(command, timeout_s=30)
        if res.exit_code != 0:
            raise OSError(f"fetch-model launch failed (exit {res.exit_code}): {res.stderr[-300:]}")

    def _await_fetch(
        self, run: _Run, provider: str, shell: HostShell, plan: TransferPlan, deadline: float | None
    ) -> bool:
        assert plan.fetch is not None
        r = shlex.quote(plan.root)
        pushed_total = run.total
        pushed_done = run.done
        run.current = f"{plan.fetch.repo}@{plan.fetch.revision[:8]} (host fetch)"
        restarts = 0
        while True:
            res = shell.run(
                f"cd {r} && cat fetch.progress 2>/dev/null; echo; echo @@; cat fetch.exit 2>/dev/null; echo; echo @@; "
                'if [ -f fetch.pid ] && kill -0 "$(cat fetch.pid)" 2>/dev/null; then echo yes; else echo no; fi; '
                "echo @@; tail -n 1 fetch.out 2>/dev/null",
                timeout_s=30,
            )
            parts = res.stdout.split("@@")
            while len(parts) < 4:
                parts.append("")
            try:
                progress = json.loads(parts[0].strip() or "{}")
            except ValueError:
                progress = {}
            exit_text, alive, last = parts[1].strip(), parts[2].strip() == "yes", parts[3].strip()
            fetched = int(progress.get("downloaded_bytes") or 0)
            if fetched > run.fetched_seen:
                self._bill(run, provider, fetched - run.fetched_seen, f"{run.runner}:hub:{fetched}")
                run.moved += fetched - run.fetched_seen
                run.fetched_seen = fetched
            run.total = pushed_total + int(progress.get("bytes_total") or 0)
            run.done = pushed_done + int(progress.get("bytes_done") or 0)
            self._save(run)
            if exit_text == "0":
                return True
            if not alive and exit_text.lstrip("-").isdigit() and int(exit_text) in FETCH_REFUSED:
                raise TransferFailed(f"{plan.fetch.repo}@{plan.fetch.revision}: {_detail(last)}")
            if not alive:
                # unreachable hub, a broken download, a killed fetcher: again, resuming where it stopped
                restarts += 1
                if restarts > MAX_FETCH_RESTARTS:
                    raise TransferFailed(f"{plan.fetch.repo}@{plan.fetch.revision}: {_detail(last)}")
                self._start_fetch(shell, plan)
            if deadline is not None and self.clock.now() >= deadline:
                return False
            self.clock.sleep(self.fetch_poll_s)


def _detail(line: str) -> str:
    try:
        loaded = json.loads(line)
    except ValueError:
        return line or "fetch failed"
    if isinstance(loaded, dict):
        return str(loaded.get("detail") or loaded.get("error") or line)
    return line
