"""A real OpenSSH `sshd` on 127.0.0.1, private to one directory: config, host key,
authorized_keys, pid file and logs all live there. Used for sim hosts and by the tests.

The daemon runs in the foreground (`-D -e`) as a child process; readiness is its own
"Server listening" log line, not a sleep. `stop()` ends the daemon and the per-connection
processes it forked (found by parent id), so open sessions drop as when a host vanishes.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["SSHD_PATH", "Sshd", "SshdError"]

SSHD_PATH = "/usr/sbin/sshd"
SFTP_SERVER_CANDIDATES = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/libexec/sftp-server",
)


class SshdError(RuntimeError):
    """sshd could not be started."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _descendants(pid: int) -> list[int]:
    """Every process below `pid`, found through /proc parent ids."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Sshd:
    """One sshd on loopback. `start()` returns the port; `stop()` refuses new connections and
    drops open sessions.

    `workdir` and `env`, when given, are applied to every session (commands and SFTP) through a
    ForceCommand wrapper: sessions start in `workdir` with `env` exported.
    """

    def __init__(
        self,
        root: Path,
        authorized_keys: str,
        *,
        workdir: Path | None = None,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        ready_timeout_s: float = 10.0,
    ) -> None:
        self.root = Path(root)
        self.authorized_keys = authorized_keys
        self.workdir = workdir
        self.env = dict(env or {})
        self.port = port or 0
        self.ready_timeout_s = ready_timeout_s
        self.host_key_path = self.root / "ssh_host_ed25519_key"
        self.config_path = self.root / "sshd_config"
        self.pid_path = self.root / "sshd.pid"
        self.home = self.root / "home"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: deque[str] = deque(maxlen=200)
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def host_public_key(self) -> str:
        """The host key as an OpenSSH public key line (`ssh-ed25519 AAAA...`)."""
        key = serialization.load_ssh_private_key(self.host_key_path.read_bytes(), password=None)
        return (
            key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
        )

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def log_tail(self) -> str:
        return "\n".join(self._log)

    def _prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(exist_ok=True)
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege-separation directory
        if not self.host_key_path.exists():
            key = Ed25519PrivateKey.generate()
            _write_private(
                self.host_key_path,
                key.private_bytes(
                    serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
                ),
            )
        (self.root / "authorized_keys").write_text(self.authorized_keys.strip() + "\n", encoding="utf-8")
        sftp = next((p for p in SFTP_SERVER_CANDIDATES if os.path.exists(p)), None)
        lines = [
            f"ListenAddress 127.0.0.1:{self.port}",
            f"HostKey {self.host_key_path}",
            f"PidFile {self.pid_path}",
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}",
            "StrictModes no",
            "UsePAM no",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "AllowTcpForwarding no",
            "X11Forwarding no",
            "PrintMotd no",
            "PrintLastLog no",
            "UseDNS no",
            # A home of the host's own: sshd runs every command through root's login shell, and bash
            # sources ~/.bashrc for ssh commands. The renter machine's dotfiles (pyenv's rehash lock
            # there waits 60 s once a killed session leaves it stale) have no business on a sim host.
            f"SetEnv HOME={self.home}",
            "MaxStartups 64:30:128",
            "MaxSessions 32",
            "LogLevel INFO",
        ]
        if self.workdir is not None or self.env:
            if sftp is None:
                raise SshdError("no sftp-server binary found; install openssh-sftp-server")
            wrapper = self.root / "session.sh"
            exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(self.env.items()))
            cd = f"cd {shlex.quote(str(self.workdir))} || exit 1\n" if self.workdir else ""
            wrapper.write_text(
                "#!/bin/sh\n"
                + exports
                + cd
                + 'if [ -z "$SSH_ORIGINAL_COMMAND" ]; then exec /bin/sh -l; fi\n'
                + 'exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n',
                encoding="utf-8",
            )
            wrapper.chmod(0o755)
            lines += [f"Subsystem sftp {sftp}", f"ForceCommand {wrapper}"]
        else:
            lines.append("Subsystem sftp internal-sftp")
        self.config_path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def start(self) -> int:
        """Start the daemon and wait (bounded) for it to listen; return its port."""
        if self.running:
            return self.port
        self._prepare()
        fixed_port = self.port != 0
        for _attempt in range(3 if not fixed_port else 1):
            if not fixed_port:
                self.port = _free_port()
                self._prepare()
            if self._spawn():
                return self.port
        raise SshdError(f"sshd did not start listening on 127.0.0.1:{self.port}:\n{self.log_tail()}")

    def _spawn(self) -> bool:
        self._listening.clear()
        self._log.clear()
        self._proc = subprocess.Popen(
            [SSHD_PATH, "-D", "-e", "-f", str(self.config_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        proc = self._proc
        self._reader = threading.Thread(target=self._read_log, args=(proc,), name=f"sshd-log-{self.port}", daemon=True)
        self._reader.start()
        if self._listening.wait(self.ready_timeout_s) and proc.poll() is None:
            return True
        self._kill(proc)
        return False

    def _read_log(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self._log.append(line)
            if "Server listening on" in line:
                self._listening.set()
        self._listening.set()  # EOF: the daemon exited; wake the waiter

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGSTOP)  # no new connections are forked from here on
            except ProcessLookupError:
                pass
            for pid in _descendants(proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.kill()
        proc.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=5)

    def stop(self) -> None:
        """Refuse new connections and drop the open ones."""
        proc, self._proc = self._proc, None
        if proc is not None:
            self._kill(proc)

    def __enter__(self) -> Sshd:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
