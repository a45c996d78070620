"""Sim hosts reachable over real SSH: one OpenSSH sshd per running instance on loopback.

Each host gets its own sandbox directory (the session's working directory and HOME) with its
truth written to `.sim/truth.json`; every SSH session sees `TUNEHARNESS_SIM_TRUTH` pointing at
it, so `python -m trainer preflight` there reports what the truth dictates. The project is on
PYTHONPATH; `python` on the PATH is the one of the host's `image` (providers/sim/images.py): on
the trainer image this project's interpreter, on a bare one a Python with torch and pip only, so
the trainer runs there only once `python -m trainer bootstrap` installed its stack (from the
`wheelhouse` when one is given, TUNEHARNESS_WHEELHOUSE on the host; else from the package index).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from pathlib import Path

from app.market import LaunchSpec, SSHEndpoint
from providers.sim.images import image_python
from providers.sim.observe import truth_file
from providers.sim.sshd import Sshd, SshdError
from providers.sim.trace import HostSpec

__all__ = ["SshdHostRuntime"]

PROJECT_ROOT = Path(__file__).resolve().parents[2]


class SshdHostRuntime:
    """Starts an sshd when a sim host becomes reachable and stops it when it is not."""

    def __init__(
        self,
        root: Path,
        *,
        clock_info: dict[str, float] | None = None,
        train_step_s: float | None = None,
        train_start_s: float | None = None,
        wheelhouse: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.clock_info = clock_info
        self.train_step_s = train_step_s
        self.train_start_s = train_start_s
        self.wheelhouse = wheelhouse
        self._sshd: dict[str, Sshd] = {}
        self._lock = threading.Lock()

    def sandbox(self, instance_id: str) -> Path:
        return self.root / instance_id / "sandbox"

    def up(self, instance_id: str, host: HostSpec, spec: LaunchSpec, created_at_s: float) -> SSHEndpoint:
        with self._lock:
            existing = self._sshd.get(instance_id)
            if existing is not None and existing.running:
                return SSHEndpoint(host="127.0.0.1", port=existing.port)
            base = self.root / instance_id
            sandbox = base / "sandbox"
            (sandbox / ".sim").mkdir(parents=True, exist_ok=True)
            truth_path = sandbox / ".sim" / "truth.json"
            payload = truth_file(
                host.truth,
                instance_id=instance_id,
                machine_id=host.machine_id,
                created_at_s=created_at_s,
                clock=self.clock_info,
                train_step_s=self.train_step_s,
                train_start_s=self.train_start_s,
            )
            truth_path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
            python = image_python("bare" if host.truth.image == "bare" else "trainer")
            env = {
                "HOME": str(sandbox),
                "TUNEHARNESS_SIM_TRUTH": str(truth_path),
                "TUNEHARNESS_SIM_SANDBOX": str(sandbox),
                "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
                "PYTHONPATH": str(PROJECT_ROOT),
                "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1",
            }
            if self.wheelhouse is not None:
                env["TUNEHARNESS_WHEELHOUSE"] = str(self.wheelhouse)
            # the job's env as a real host would set it; the simulator's own variables win
            env = {**{k: v for k, v in spec.env.items() if k.isidentifier()}, **env}
            sshd = existing or Sshd(base / "sshd", spec.ssh_public_key, workdir=sandbox, env=env)
            try:
                sshd.start()  # same host key on restart (stop/start): the same machine
            except SshdError:
                if existing is None:
                    raise
                sshd.port = 0  # its old port was taken meanwhile: the mapping changes, as on Vast
                sshd.start()
            self._sshd[instance_id] = sshd
            return SSHEndpoint(host="127.0.0.1", port=sshd.port)

    def down(self, instance_id: str) -> None:
        """The host stops, dies or is destroyed: its sshd goes, and so does every process it ran
        (a detached trainer included), as when a container stops."""
        with self._lock:
            sshd = self._sshd.get(instance_id)
        if sshd is not None:
            sshd.stop()
        _kill_sandbox_processes(self.sandbox(instance_id))

    def close(self, *, remove_files: bool = False) -> None:
        with self._lock:
            daemons = list(self._sshd.values())
            self._sshd.clear()
        for sshd in daemons:
            sshd.stop()
        if remove_files and self.root.exists():
            shutil.rmtree(self.root, ignore_errors=True)

    def running_ports(self) -> dict[str, int]:
        with self._lock:
            return {iid: s.port for iid, s in self._sshd.items() if s.running}


def _kill_sandbox_processes(sandbox: Path) -> None:
    """SIGKILL every process whose environment says it runs in `sandbox` (started over its SSH)."""
    marker = f"TUNEHARNESS_SIM_SANDBOX={sandbox}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if marker in env:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
