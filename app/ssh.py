"""SSH to rented hosts: `SSHHostShell` implements `app.ports.HostShell` with paramiko.

- One ed25519 keypair per job (`generate_keypair`); its public half goes into the LaunchSpec.
- An instance may offer a second way in (Vast's SSH proxy beside the direct port): when the
  first endpoint refuses or times out, `connect` tries the fallback before it reports the host
  unreachable, and stays on whichever answered.
- The host key is recorded on first contact and pinned for the instance's life: a different
  key later means another machine answers at that address, and `HostKeyChanged` aborts before
  any command runs or any file moves.
- paramiko and socket errors are translated at this edge: `HostUnreachable` (transient: retry
  or declare the host lost), `SSHAuthFailed` (the key was refused), `HostKeyChanged`,
  `CommandTimedOut`, `OutputTooLarge` (a command printed, or a file held, more than allowed).
"""

from __future__ import annotations

import base64
import io
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import paramiko
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.errors import TuneharnessError
from app.market import SSHEndpoint
from app.ports import DEFAULT_MAX_OUTPUT_BYTES, CommandResult, HostOutputTooLarge

__all__ = [
    "CommandTimedOut",
    "FileHostKeyPin",
    "HostKeyChanged",
    "HostKeyPin",
    "HostUnreachable",
    "KeyPair",
    "MemoryHostKeyPin",
    "OutputTooLarge",
    "SSHAuthFailed",
    "SSHError",
    "SSHHostShell",
    "generate_keypair",
]


EOF_GRACE_S = 2.0
POLL_S = 0.02  # how often a running command's channel is looked at for output


class SSHError(TuneharnessError):
    """Root of the errors raised while talking to a host over SSH."""


class HostUnreachable(SSHError):
    """The host refused, dropped or did not answer the connection: transient, or the host is lost."""


class SSHAuthFailed(SSHError):
    """The host refused the job's key: the key was not installed, or this is not our host."""


class HostKeyChanged(SSHError):
    """The host presented a different key than on first contact: another machine. Abort."""


class CommandTimedOut(SSHError):
    """A remote command ran past its timeout; the channel was closed."""


class OutputTooLarge(SSHError, HostOutputTooLarge):
    """A command printed, or a file held, more than allowed; the channel or transfer was closed."""


@dataclass(frozen=True, slots=True)
class KeyPair:
    private_key_path: Path
    public_key: str  # OpenSSH line: "ssh-ed25519 AAAA... comment"


def generate_keypair(directory: Path, *, name: str = "id_ed25519", comment: str = "tuneharness") -> KeyPair:
    """Write a fresh ed25519 keypair (private key mode 0600) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    path = directory / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    line = f"{public} {comment}".strip()
    (directory / f"{name}.pub").write_text(line + "\n", encoding="utf-8")
    return KeyPair(private_key_path=path, public_key=line)


class HostKeyPin(Protocol):
    """Where the host key recorded on first contact is kept for the instance's life."""

    def get(self) -> str | None: ...

    def set(self, key_line: str) -> None: ...


class MemoryHostKeyPin:
    """A pin held in memory (one process, one shell's life)."""

    def __init__(self, key_line: str | None = None) -> None:
        self._key = key_line

    def get(self) -> str | None:
        return self._key

    def set(self, key_line: str) -> None:
        self._key = key_line


class FileHostKeyPin:
    """A pin in a small file (one per instance), shared by every process that talks to the host."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self) -> str | None:
        try:
            text = self.path.read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            return None
        return text or None

    def set(self, key_line: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(key_line + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def _key_line(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.get_base64()}"


def _key_from_line(line: str) -> paramiko.PKey:
    kind, _, rest = line.strip().partition(" ")
    blob = rest.split()[0] if rest else ""
    return paramiko.PKey.from_type_string(kind, base64.b64decode(blob))


class _RecordFirstKey(paramiko.MissingHostKeyPolicy):
    """First contact: accept the key and remember it; the shell pins it after connecting."""

    def __init__(self) -> None:
        self.seen: paramiko.PKey | None = None

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        self.seen = key


class SSHHostShell:
    """Commands and files on one host over SSH, with its host key pinned."""

    def __init__(
        self,
        endpoint: SSHEndpoint,
        private_key_path: Path | None,
        *,
        pin: HostKeyPin | None = None,
        connect_timeout_s: float = 15.0,
        fallback: SSHEndpoint | None = None,
        private_key: str | None = None,
    ) -> None:
        """The key is a file (`private_key_path`) or, from the fleet's database, OpenSSH PEM text held
        in memory only (`private_key`; then the path is None)."""
        self.endpoint = endpoint
        self.fallback = fallback if fallback != endpoint else None
        self.private_key_path = private_key_path
        self._private_key = private_key
        self.pin: HostKeyPin = pin if pin is not None else MemoryHostKeyPin()
        self.connect_timeout_s = connect_timeout_s
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None

    @property
    def _where(self) -> str:
        return f"{self.endpoint.user}@{self.endpoint.host}:{self.endpoint.port}"

    def _host_name(self) -> str:
        host, port = self.endpoint.host, self.endpoint.port
        return host if port == 22 else f"[{host}]:{port}"

    def connect(self) -> paramiko.SSHClient:
        """Connect (once) and verify the host key against the pin; record it on first contact.

        When the endpoint refuses or times out and there is a fallback, the fallback is tried
        before HostUnreachable is raised; the one that answered is used from then on.
        """
        if self._client is not None:
            transport = self._client.get_transport()
            if transport is not None and transport.is_active():
                return self._client
            self.close()
        try:
            return self._connect_once()
        except HostUnreachable as first:
            if self.fallback is None:
                raise
            tried = self._where
            self.endpoint, self.fallback = self.fallback, self.endpoint
            try:
                return self._connect_once()
            except HostUnreachable as second:
                raise HostUnreachable(f"{tried} and its fallback both unreachable: {first}; {second}") from second

    def _connect_once(self) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        pinned = self.pin.get()
        policy = _RecordFirstKey()
        if pinned is not None:
            client.get_host_keys().add(self._host_name(), pinned.split()[0], _key_from_line(pinned))
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        else:
            client.set_missing_host_key_policy(policy)
        try:
            pkey = self._load_key()
            client.connect(
                self.endpoint.host,
                port=self.endpoint.port,
                username=self.endpoint.user,
                pkey=pkey,
                timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s,
                auth_timeout=self.connect_timeout_s,
                allow_agent=False,
                look_for_keys=False,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyChanged(
                f"{self._where} presented host key {_key_line(exc.key)[:60]}... but this instance was "
                f"pinned to {pinned[:60] if pinned else '?'}...: another machine answers at that address. "
                "Do not push or run anything there; treat the host as lost"
            ) from None
        except paramiko.AuthenticationException as exc:
            client.close()
            raise SSHAuthFailed(
                f"{self._where} refused the job's key ({exc}). Fix: attach the job's public key to the instance"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            client.close()
            raise HostUnreachable(f"{self._where} unreachable: {exc or type(exc).__name__}") from exc
        if pinned is None and policy.seen is not None:
            self.pin.set(_key_line(policy.seen))
        self._client = client
        return client

    def _load_key(self) -> paramiko.PKey:
        if self._private_key is not None:
            return paramiko.Ed25519Key.from_private_key(io.StringIO(self._private_key))
        return paramiko.Ed25519Key.from_private_key_file(str(self.private_key_path))

    def _transport(self) -> paramiko.Transport:
        transport = self.connect().get_transport()
        if transport is None or not transport.is_active():
            raise HostUnreachable(f"{self._where}: connection lost")
        return transport

    def run(
        self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    ) -> CommandResult:
        """Run `command`; return its exit code and output. Raises CommandTimedOut past `timeout_s`,
        OutputTooLarge (the channel closed, nothing more read) past `max_output_bytes`."""
        transport = self._transport()
        try:
            chan = transport.open_session(timeout=self.connect_timeout_s)
            chan.exec_command(command)
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout_s
            exited_at: float | None = None
            while True:
                while chan.recv_ready():
                    out += chan.recv(65536)
                    self._within(chan, len(out) + len(err), max_output_bytes, command)
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    self._within(chan, len(out) + len(err), max_output_bytes, command)
                drained = not chan.recv_ready() and not chan.recv_stderr_ready()
                if chan.exit_status_ready():
                    # output still waiting on the flow-control window can arrive after the exit
                    # status: finish at EOF, or after a grace for a background child holding it open
                    exited_at = exited_at if exited_at is not None else time.monotonic()
                    if drained and (chan.eof_received or time.monotonic() - exited_at > EOF_GRACE_S):
                        break
                if not transport.is_active():
                    raise HostUnreachable(f"{self._where}: connection dropped while running a command")
                left = deadline - time.monotonic()
                if left <= 0:
                    chan.close()
                    raise CommandTimedOut(f"{self._where}: command ran past {timeout_s:g}s: {command[:80]}")
                # Polled, not select()ed: select() makes paramiko open a pipe for the channel, and a
                # channel closed while the host still sends (output past the cap) then has paramiko's
                # reader thread write to that closed pipe and die with the connection.
                if chan.recv_ready() or chan.recv_stderr_ready():
                    continue
                time.sleep(min(left, POLL_S))
            code = chan.recv_exit_status()
            chan.close()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self._where}: {exc or type(exc).__name__}") from exc
        return CommandResult(
            exit_code=code, stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace")
        )

    def _within(self, chan: paramiko.Channel, got: int, limit: int, command: str) -> None:
        if got > limit:
            chan.close()
            raise OutputTooLarge(
                f"{self._where}: command printed more than {limit} bytes; stopped reading: {command[:80]}. "
                "Treat the host as misbehaving"
            )

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                self._sftp = self.connect().open_sftp()
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self.close()
                raise HostUnreachable(f"{self._where}: SFTP unavailable: {exc or type(exc).__name__}") from exc
        return self._sftp

    def _mkdirs(self, sftp: paramiko.SFTPClient, remote_dir: str) -> None:
        parts = [p for p in remote_dir.split("/") if p]
        path = "/" if remote_dir.startswith("/") else ""
        for part in parts:
            path = f"{path}{part}" if path in ("", "/") else f"{path}/{part}"
            try:
                if not stat.S_ISDIR(sftp.stat(path).st_mode or 0):
                    raise NotADirectoryError(path)
            except FileNotFoundError:
                sftp.mkdir(path)

    def put(self, local: Path, remote: str) -> None:
        """Copy a local file to `remote` (parent directories created), replacing it atomically."""
        sftp = self._sftp_client()
        try:
            parent = remote.rsplit("/", 1)[0] if "/" in remote else ""
            if parent:
                self._mkdirs(sftp, parent)
            tmp = f"{remote}.part"
            sftp.put(str(local), tmp)
            sftp.posix_rename(tmp, remote)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self._where}: put {remote} failed: {exc or type(exc).__name__}") from exc

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
        """Copy `remote` to a local file (written to a temp file, then renamed). With `max_bytes`,
        a file larger than that is refused before a byte moves, and one that grows past it while
        being copied is abandoned (OutputTooLarge, no local file left)."""
        sftp = self._sftp_client()
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".part")
        try:
            if max_bytes is None:
                sftp.get(remote, str(tmp))
            else:
                self._get_bounded(sftp, remote, tmp, max_bytes)
            os.replace(tmp, local)
        except (FileNotFoundError, PermissionError, OutputTooLarge):
            tmp.unlink(missing_ok=True)
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            tmp.unlink(missing_ok=True)
            self.close()
            raise HostUnreachable(f"{self._where}: get {remote} failed: {exc or type(exc).__name__}") from exc

    def _get_bounded(self, sftp: paramiko.SFTPClient, remote: str, tmp: Path, max_bytes: int) -> None:
        def too_large(size: str) -> OutputTooLarge:
            return OutputTooLarge(f"{self._where}: {remote} is {size}, over the {max_bytes} bytes allowed; not copied")

        size = sftp.stat(remote).st_size or 0
        if size > max_bytes:
            raise too_large(f"{size} bytes")
        copied = 0
        with sftp.open(remote, "rb") as src, open(tmp, "wb") as dst:
            src.prefetch(size)
            while chunk := src.read(1 << 20):
                copied += len(chunk)
                if copied > max_bytes:
                    raise too_large("growing while copied")
                dst.write(chunk)

    def listdir(self, remote: str) -> list[str]:
        sftp = self._sftp_client()
        try:
            return sorted(sftp.listdir(remote))
        except (FileNotFoundError, PermissionError):
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            self.close()
            raise HostUnreachable(f"{self._where}: listdir {remote} failed: {exc or type(exc).__name__}") from exc

    def close(self) -> None:
        sftp, self._sftp = self._sftp, None
        client, self._client = self._client, None
        for closeable in (sftp, client):
            if closeable is not None:
                try:
                    closeable.close()
                except (OSError, EOFError, paramiko.SSHException):
                    pass

    def __enter__(self) -> SSHHostShell:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
