"""Each job's SSH key pair and each instance's pinned host key, in the fleet's database.

A job provisioned by a worker on one machine is supervised, recovered, idle-watched and reaped by
whichever worker takes the next task, on any machine. So the key a host was launched with, and the
host key recorded on first contact, live in the shared database (`job_ssh_keys`,
`host_key_pins`), never on one worker's disk.

Who may read a private key: whoever holds the application's database credentials (every worker
does). A key is never put in a task's arguments, a log line, the environment or a file the worker
keeps: `JobKey` hides it from `repr`, and the SSH shell loads it from memory.

Homes written before keys moved here keep working: a job whose key (or an instance whose pin) is
not in the database yet is read once from `TUNEHARNESS_HOME/keys/<job>/` and stored.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction

__all__ = ["DbHostKeyPin", "HostKeyPinRow", "JobKey", "JobKeyRow", "job_key", "legacy_key_dir"]

LEGACY_KEY_NAME = "id_ed25519"


class JobKeyRow(SQLModel, table=True):
    __tablename__ = "job_ssh_keys"

    job_id: str = Field(primary_key=True)
    public_key: str  # OpenSSH line: "ssh-ed25519 AAAA... comment"
    private_key: str  # OpenSSH PEM; readable by the application's database role only
    created_at: float


class HostKeyPinRow(SQLModel, table=True):
    __tablename__ = "host_key_pins"

    pin_id: str = Field(primary_key=True)  # "<provider>/<instance id>"
    key_line: str
    pinned_at: float


_K = JobKeyRow.__table__  # type: ignore[attr-defined]
_P = HostKeyPinRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class JobKey:
    """A job's key pair; the private half stays out of every repr (and so out of logs)."""

    job_id: str
    public_key: str
    private_key: str = field(repr=False)


def legacy_key_dir(home: Path, job_id: str) -> Path:
    """Where a job's key pair and its hosts' pins were written before they moved to the database."""
    return home / "keys" / job_id


def _fresh(job_id: str) -> tuple[str, str]:
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return f"{public} tuneharness-{job_id}", private


def _from_disk(directory: Path | None) -> tuple[str, str] | None:
    if directory is None:
        return None
    private = directory / LEGACY_KEY_NAME
    try:
        return (
            (directory / f"{LEGACY_KEY_NAME}.pub").read_text(encoding="utf-8").strip(),
            private.read_text(encoding="utf-8"),
        )
    except FileNotFoundError:
        return None


def job_key(engine: Engine, job_id: str, *, legacy_dir: Path | None = None) -> JobKey:
    """The job's key pair from the database; made on first use (or read once from `legacy_dir`,
    where an older home keeps it) and stored. Two workers asking at once get the same key."""
    with read_connection(engine) as conn:
        row = conn.execute(select(_K).where(_K.c.job_id == job_id)).first()
    if row is not None:
        return JobKey(job_id, row.public_key, row.private_key)
    public, private = _from_disk(legacy_dir) or _fresh(job_id)
    with write_transaction(engine, lock=f"tuneharness.sshkey.{job_id}") as conn:
        row = conn.execute(select(_K).where(_K.c.job_id == job_id)).first()
        if row is not None:  # another worker stored one first: that one is on the host
            return JobKey(job_id, row.public_key, row.private_key)
        conn.execute(_K.insert().values(job_id=job_id, public_key=public, private_key=private, created_at=time.time()))
    return JobKey(job_id, public, private)


def _read_legacy_pin(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except FileNotFoundError:
        return None


class DbHostKeyPin:
    """The host key an instance presented on first contact, pinned in the database for its life
    and shared by every worker on every machine (`app.ssh.HostKeyPin`)."""

    def __init__(self, engine: Engine, *, provider: str, instance_id: str, legacy_file: Path | None = None) -> None:
        self.engine = engine
        self.pin_id = f"{provider}/{instance_id}"
        self.legacy_file = legacy_file

    def get(self) -> str | None:
        with read_connection(self.engine) as conn:
            row = conn.execute(select(_P.c.key_line).where(_P.c.pin_id == self.pin_id)).first()
        if row is not None:
            return str(row.key_line)
        legacy = _read_legacy_pin(self.legacy_file)
        if legacy is not None:
            self.set(legacy)
        return legacy

    def set(self, key_line: str) -> None:
        """Pin `key_line`; a different key pinned by another worker first means another machine
        answered one of us: HostKeyChanged."""
        from app.ssh import HostKeyChanged  # paramiko only where SSH is spoken

        with write_transaction(self.engine, lock=f"tuneharness.hostpin.{self.pin_id}") as conn:
            row = conn.execute(select(_P.c.key_line).where(_P.c.pin_id == self.pin_id)).first()
            if row is None:
                conn.execute(_P.insert().values(pin_id=self.pin_id, key_line=key_line, pinned_at=time.time()))
                return
        if str(row.key_line) != key_line:
            raise HostKeyChanged(
                f"{self.pin_id} presented host key {key_line[:60]}... but another worker pinned "
                f"{str(row.key_line)[:60]}...: another machine answers at that address. "
                "Do not push or run anything there; treat the host as lost"
            )
