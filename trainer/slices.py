"""`python -m trainer slices`: run a job to the end in capped slices, paying the imports once.

Every slice is still a transaction in a process of its own: a child forked from this one resumes
from the newest complete checkpoint, trains until its cap, checkpoints and exits, through the same
`trainer.run.run_job` as `python -m trainer run --max-seconds S`. The children share nothing but the
job directory, so a crashed slice loses at most the steps since its last checkpoint, and the next
slice (or another host) resumes as after any other exit.

What the parent saves is the start-up of each slice: it imports torch, bitsandbytes, transformers
and peft once (seconds on a busy machine) and forks. It never runs a torch operation and starts no
thread, so no OpenMP pool or lock is inherited half-used (a child forked after a parallel region
deadlocks in its first one); if it ever finds another thread in itself, it starts each slice as a
new `python -m trainer run` process instead.

Exit codes are those of `run`: 0 finished, 3 stopped by SIGTERM after the running slice
checkpointed (resumable), 2/4/5/1 the code of the slice that failed. A slice killed by a signal
(the OOM killer, SIGKILL) or one that made no progress ends the runner with 1 and a `failed` line
in train.log written by the runner.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from trainer import checkpoint as ckpt
from trainer.exitcodes import EXIT_BAD_JOB, EXIT_CAP, EXIT_FAILED, EXIT_FINISHED
from trainer.fsutil import atomic_write_json
from trainer.reporting import TrainLog, utc_stamp

__all__ = ["run_slices"]


class _Runner:
    def __init__(self, job_dir: Path, *, slice_seconds: float | None, slice_steps: int | None) -> None:
        self.job_dir = job_dir
        self.slice_seconds = slice_seconds
        self.slice_steps = slice_steps
        self.child: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def on_sigterm(self, signum: int, frame: Any) -> None:
        """Forward SIGTERM to the running slice (it checkpoints and exits 3); start no other."""
        self.stopping = True
        if self.child is not None:
            try:
                os.kill(self.child, signal.SIGTERM)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def run_one(self) -> int:
        """One slice in a fresh process; its exit code (negative: killed by that signal)."""
        if threading.active_count() == 1 and _os_threads() == 1:
            return self._forked()
        return self._spawned()

    def _forked(self) -> int:
        sys.stdout.flush()
        sys.stderr.flush()
        # SIGTERM stays blocked across the fork: in the parent until the child's pid is known (so
        # it can be forwarded), in the child until run_job has installed its handler (which
        # unblocks it); a SIGTERM in between is delivered late, never lost or fatal.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        pid = os.fork()
        if pid == 0:  # the slice: never returns into the runner's loop
            code = EXIT_FAILED
            try:
                from trainer.run import run_job

                code = run_job(self.job_dir, max_seconds=self.slice_seconds, slice_steps=self.slice_steps)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.child = pid
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if self.stopping:
            os.kill(pid, signal.SIGTERM)
        try:
            _, status = os.waitpid(pid, 0)
        finally:
            self.child = None
        return os.waitstatus_to_exitcode(status)

    def _spawned(self) -> int:
        cmd = [sys.executable, "-m", "trainer", "run", "--job-dir", str(self.job_dir)]
        if self.slice_seconds is not None:
            cmd += ["--max-seconds", str(self.slice_seconds)]
        if self.slice_steps is not None:
            cmd += ["--slice-steps", str(self.slice_steps)]
        self.proc = subprocess.Popen(cmd)
        if self.stopping:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait()
        finally:
            self.proc = None


def _os_threads() -> int:
    """Threads of this process as the kernel sees them (OpenMP pools included); 0 if unknown."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


def _status(job_dir: Path) -> dict[str, Any]:
    try:
        status = json.loads((job_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return status if isinstance(status, dict) else {}


def _newest_checkpoint_step(job_dir: Path) -> int | None:
    """Step of the newest checkpoint with a completion marker (by name; slices verify on resume)."""
    for c in ckpt.list_checkpoints(job_dir / "checkpoints"):
        if (c.path / ckpt.MARKER).is_file():
            return c.step
    return None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _fail(job_dir: Path, reason: str) -> int:
    """Report a failure no slice could report itself (it was killed, or made no progress)."""
    print(f"trainer slices: {reason}", flush=True)
    status = _status(job_dir)
    if status:
        status.update(phase="failed", error=reason, exit_code=EXIT_FAILED, updated_at=utc_stamp())
        try:
            atomic_write_json(job_dir / "status.json", status)
        except OSError:
            pass
    try:
        log = TrainLog(job_dir / "train.log")
        try:
            log.event("failed", exit_code=EXIT_FAILED, step=status.get("step", "-"), reason=reason)
        finally:
            log.close()
    except OSError:
        pass
    return EXIT_FAILED


def run_slices(
    job_dir: Path, *, slice_seconds: float | None = None, slice_steps: int | None = None, max_slices: int | None = None
) -> int:
    """Run slices of the job in `job_dir` until it finishes, fails or is stopped; the exit code."""
    job_dir = Path(job_dir)
    if not (job_dir / "job.json").is_file():
        print(f"trainer slices: {job_dir}/job.json does not exist. Fix: pass a job directory", flush=True)
        return EXIT_BAD_JOB
    from trainer.stack import import_stack

    import_stack()
    runner = _Runner(job_dir, slice_seconds=slice_seconds, slice_steps=slice_steps)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, runner.on_sigterm)
    slices = 0
    while True:
        if runner.stopping:
            return EXIT_CAP
        before = _newest_checkpoint_step(job_dir)
        code = runner.run_one()
        slices += 1
        if code == EXIT_FINISHED or (code == EXIT_CAP and runner.stopping):
            return code
        if code < 0:
            return _fail(
                job_dir,
                f"slice {slices} was killed by {_signal_name(-code)}; the newest complete checkpoint "
                "is intact. Fix: run slices again (or another host) to resume",
            )
        if code != EXIT_CAP:
            return code
        after = _newest_checkpoint_step(job_dir)
        if after == before:
            return _fail(
                job_dir,
                f"slice {slices} made no progress (checkpoint step {after}): the slice cap "
                "is shorter than loading. Fix: raise --slice-seconds",
            )
        if max_slices is not None and slices >= max_slices:
            return EXIT_CAP
