"""ArtifactStore: where checkpoints and adapters live once they are off the rented host.

Adapters: a local directory (or a mounted network volume) and any S3-compatible store through
boto3. `pull_checkpoints` and `pull_adapter` copy artifacts off a host through the HostShell
port: only directories whose COMPLETE manifest is present are pulled, every file is checked
against the manifest's size and SHA-256 before upload, and the manifest is uploaded last, so a
store never shows a checkpoint as complete before all of its files are there. A host is not
trusted with our disk: the manifest is read with a small cap, its declared sizes (each file and
the total) are checked against `PullLimits` and the free disk before anything is copied, and each
file is copied with its declared size as the most that may arrive.

The manifest format is the trainer's (docs/trainer.md); this module shares no code with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from app.errors import TuneharnessError, UserError
from app.ports import HostOutputTooLarge, HostShell

__all__ = [
    "MARKER",
    "ArtifactError",
    "ArtifactStore",
    "LocalArtifactStore",
    "PullLimits",
    "PullReport",
    "PushGrant",
    "S3ArtifactStore",
    "decrypt_object",
    "fetch_dir",
    "fetch_encrypted_dir",
    "grant_push",
    "latest_checkpoint",
    "open_store",
    "pull_adapter",
    "pull_checkpoints",
]

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d{8})$")


class ArtifactError(TuneharnessError):
    """An artifact could not be stored or fetched, or did not match its manifest."""


@runtime_checkable
class ArtifactStore(Protocol):
    """Keys are '/'-separated relative paths (`jobs/<job>/checkpoints/step-00000050/COMPLETE`)."""

    def put_file(self, key: str, local: Path) -> None: ...

    def get_file(self, key: str, local: Path) -> None: ...

    def exists(self, key: str) -> bool: ...

    def list_keys(self, prefix: str) -> list[str]: ...


def _check_key(key: str) -> str:
    p = PurePosixPath(key)
    if not key or p.is_absolute() or any(part in ("", ".", "..") for part in key.split("/")):
        raise ArtifactError(f"bad artifact key {key!r}: keys are relative paths without '..'")
    return key


class LocalArtifactStore:
    """A directory tree; each put is a temp file plus an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def put_file(self, key: str, local: Path) -> None:
        dest = self._path(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            shutil.copyfile(local, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, dest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise ArtifactError(f"cannot store {key} under {self.root}: {e}") from e

    def get_file(self, key: str, local: Path) -> None:
        src = self._path(key)
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copyfile(src, local)
        except FileNotFoundError:
            raise ArtifactError(f"artifact {key} is not in {self.root}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str) -> list[str]:
        base = self.root
        if not base.is_dir():
            return []
        keys = []
        for dirpath, _dirs, names in os.walk(base):
            for name in names:
                if name.endswith(".tmp") and name.startswith("."):
                    continue
                key = (Path(dirpath) / name).relative_to(base).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)


class S3ArtifactStore:
    """An S3 bucket (any S3-compatible endpoint), under an optional key prefix."""

    def __init__(self, bucket: str, *, prefix: str = "", client: Any) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.client = client

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _translate(self, e: Exception, what: str) -> ArtifactError:
        return ArtifactError(f"S3 {what} in bucket {self.bucket!r} failed: {e}")

    def put_file(self, key: str, local: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.upload_file(str(local), self.bucket, self._key(key))
        except (BotoCoreError, ClientError) as e:
            raise self._translate(e, f"upload of {key}") from e

    def get_file(self, key: str, local: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.client.download_file(self.bucket, self._key(key), str(local))
        except (BotoCoreError, ClientError) as e:
            raise self._translate(e, f"download of {key}") from e

    def exists(self, key: str) -> bool:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._translate(e, f"lookup of {key}") from e
        except BotoCoreError as e:
            raise self._translate(e, f"lookup of {key}") from e
        return True

    def list_keys(self, prefix: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        if ".." in prefix.split("/") or prefix.startswith("/"):
            raise ArtifactError(f"bad artifact prefix {prefix!r}")
        full = f"{self.prefix}/{prefix}" if self.prefix else prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        except (BotoCoreError, ClientError) as e:
            raise self._translate(e, f"listing of {prefix}") from e
        return sorted(keys)


def open_store(url: str, *, s3_endpoint_url: str | None = None, s3_client: Any | None = None) -> ArtifactStore:
    """`/path`, `file:///path` or `s3://bucket/prefix` -> a store. The S3 client is built here
    (credentials from the usual boto3 chain) unless one is passed."""
    if url.startswith("s3://"):
        rest = url[len("s3://") :]
        bucket, _, prefix = rest.partition("/")
        if not bucket:
            raise UserError(f"artifact store URL {url!r} names no bucket. Fix: use s3://BUCKET/PREFIX")
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3", endpoint_url=s3_endpoint_url)
        return S3ArtifactStore(bucket, prefix=prefix, client=s3_client)
    if url.startswith("file://"):
        url = url[len("file://") :]
    if "://" in url or not url:
        raise UserError(f"artifact store URL {url!r} is not supported. Fix: use a directory path or s3://BUCKET/PREFIX")
    return LocalArtifactStore(Path(url))


# -- pulling off a host ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PullReport:
    pulled: tuple[str, ...]
    already_stored: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...]  # (name, reason): incomplete, vanished, or not matching


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _manifest_files(marker_path: Path) -> dict[str, dict[str, Any]]:
    try:
        marker = json.loads(marker_path.read_text())
    except (OSError, ValueError) as e:
        raise ArtifactError(f"unreadable manifest {marker_path.name}: {e}") from e
    files = marker.get("files") if isinstance(marker, dict) else None
    if not isinstance(files, dict):
        raise ArtifactError("manifest lists no files")
    for rel in files:
        _check_key(rel)
    return files


def _verify_local(root: Path, files: dict[str, dict[str, Any]]) -> None:
    for rel, want in files.items():
        p = root / rel
        if not p.is_file():
            raise ArtifactError(f"{rel} is missing")
        if p.stat().st_size != want.get("size") or _sha256(p) != want.get("sha256"):
            raise ArtifactError(f"{rel} does not match its manifest checksum")


@dataclass(frozen=True, slots=True)
class PullLimits:
    """What one pulled directory may weigh: its manifest, each file, all files; and the free disk
    that must remain on the control plane after it has landed."""

    manifest_bytes: int = 1 * 2**20
    file_bytes: int = 20 * 2**30
    total_bytes: int = 40 * 2**30
    disk_reserve_bytes: int = 1 * 2**30


DEFAULT_PULL_LIMITS = PullLimits()


def _check_declared_sizes(files: dict[str, dict[str, Any]], limits: PullLimits, staging: Path) -> None:
    """Refuse a manifest whose sizes are not whole byte counts, or that would not fit (a file, the
    total, or the free disk), before a byte of it is copied."""
    total = 0
    for rel, want in files.items():
        size = want.get("size") if isinstance(want, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ArtifactError(f"manifest declares no byte size for {rel} ({size!r})")
        if size > limits.file_bytes:
            raise ArtifactError(
                f"manifest declares {rel} at {size} bytes, over the {limits.file_bytes} allowed per file"
            )
        total += size
    if total > limits.total_bytes:
        raise ArtifactError(f"manifest declares {total} bytes in all, over the {limits.total_bytes} allowed")
    free = shutil.disk_usage(staging).free
    if total + limits.disk_reserve_bytes > free:
        raise ArtifactError(
            f"manifest declares {total} bytes but {staging} has {free} free (keeping {limits.disk_reserve_bytes} "
            "in reserve). Fix: free disk space on the control plane"
        )


def _pull_dir(
    shell: HostShell,
    remote_dir: str,
    store: ArtifactStore,
    key_prefix: str,
    staging: Path,
    limits: PullLimits = DEFAULT_PULL_LIMITS,
) -> None:
    """Copy one complete directory: manifest first (to know the files), verify, upload, manifest last."""
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    try:
        try:
            shell.get(f"{remote_dir}/{MARKER}", staging / MARKER, max_bytes=limits.manifest_bytes)
            files = _manifest_files(staging / MARKER)
            _check_declared_sizes(files, limits, staging)
            for rel in files:
                (staging / rel).parent.mkdir(parents=True, exist_ok=True)
                shell.get(f"{remote_dir}/{rel}", staging / rel, max_bytes=int(files[rel]["size"]))
        except HostOutputTooLarge as e:
            raise ArtifactError(str(e)) from e
        _verify_local(staging, files)
        for rel in sorted(files):
            store.put_file(f"{key_prefix}/{rel}", staging / rel)
        store.put_file(f"{key_prefix}/{MARKER}", staging / MARKER)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _job_prefix(job: str) -> str:
    return f"jobs/{_check_key(job)}"


def pull_checkpoints(
    shell: HostShell,
    remote_job_dir: str,
    store: ArtifactStore,
    *,
    job: str,
    staging: Path,
    newest_only: bool = False,
    limits: PullLimits = DEFAULT_PULL_LIMITS,
) -> PullReport:
    """Pull the complete checkpoints of `remote_job_dir` that the store lacks (newest first)."""
    remote_root = f"{remote_job_dir.rstrip('/')}/checkpoints"
    try:
        names = sorted((n for n in shell.listdir(remote_root) if _STEP_DIR.match(n)), reverse=True)
    except OSError:
        return PullReport((), (), ())
    pulled: list[str] = []
    stored: list[str] = []
    skipped: list[tuple[str, str]] = []
    for name in names:
        prefix = f"{_job_prefix(job)}/checkpoints/{name}"
        if store.exists(f"{prefix}/{MARKER}"):
            stored.append(name)
            if newest_only:
                break
            continue
        try:
            entries = shell.listdir(f"{remote_root}/{name}")
        except OSError as e:
            skipped.append((name, f"vanished: {e}"))
            continue
        if MARKER not in entries:
            skipped.append((name, "incomplete: no COMPLETE marker"))
            continue
        try:
            _pull_dir(shell, f"{remote_root}/{name}", store, prefix, staging / name, limits)
        except (OSError, ArtifactError) as e:
            skipped.append((name, str(e)))
            continue
        pulled.append(name)
        if newest_only:
            break
    return PullReport(tuple(pulled), tuple(stored), tuple(skipped))


def pull_adapter(
    shell: HostShell,
    remote_job_dir: str,
    store: ArtifactStore,
    *,
    job: str,
    staging: Path,
    limits: PullLimits = DEFAULT_PULL_LIMITS,
) -> bool:
    """Pull DIR/adapter when it is complete; False when the host has no complete adapter yet."""
    remote = f"{remote_job_dir.rstrip('/')}/adapter"
    try:
        entries = shell.listdir(remote)
    except OSError:
        return False
    if MARKER not in entries:
        return False
    _pull_dir(shell, remote, store, f"{_job_prefix(job)}/adapter", staging / "adapter", limits)
    return True


def latest_checkpoint(store: ArtifactStore, *, job: str) -> str | None:
    """The newest checkpoint name the store holds completely."""
    prefix = f"{_job_prefix(job)}/checkpoints/"
    names = {key[len(prefix) :].split("/")[0] for key in store.list_keys(prefix) if key.endswith(f"/{MARKER}")}
    valid = sorted(n for n in names if _STEP_DIR.match(n))
    return valid[-1] if valid else None


def _iter_manifest(store: ArtifactStore, prefix: str, dest: Path) -> Iterator[tuple[str, Path]]:
    store.get_file(f"{prefix}/{MARKER}", dest / MARKER)
    for rel in _manifest_files(dest / MARKER):
        yield f"{prefix}/{rel}", dest / rel


def fetch_dir(store: ArtifactStore, key_prefix: str, dest: Path) -> Path:
    """Download a complete directory (a checkpoint or the adapter) and verify it against its manifest."""
    dest.mkdir(parents=True, exist_ok=True)
    for key, local in _iter_manifest(store, key_prefix, dest):
        store.get_file(key, local)
    _verify_local(dest, _manifest_files(dest / MARKER))
    return dest


# -- push mode: presigned, prefix-scoped, short-lived; optional AES-GCM ----------------------

ENCRYPTED_MAGIC = b"THE1"


@dataclass(frozen=True, slots=True)
class PushGrant:
    """What a host receives for push mode (as DIR/push.json): a presigned POST limited to one
    job's key prefix and a short lifetime, never a storage credential. `aes_key_b64` is the
    control plane's per-job AES-256-GCM key when encryption is on (the bucket only ever holds
    ciphertext); the AAD of each object is `aad_prefix` + its path below the job."""

    url: str
    fields: dict[str, str]
    key_prefix: str
    aad_prefix: str
    expires_at: float
    aes_key_b64: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "fields": dict(self.fields),
            "key_prefix": self.key_prefix,
            "aad_prefix": self.aad_prefix,
            "expires_at": self.expires_at,
            "aes_key_b64": self.aes_key_b64,
        }


def grant_push(
    store: S3ArtifactStore,
    *,
    job: str,
    now: float,
    expires_s: int = 900,
    max_object_bytes: int = 5 * 2**30,
    encrypt: bool = False,
) -> tuple[PushGrant, bytes | None]:
    """A presigned POST for `jobs/<job>/` only, valid for `expires_s`; plus the AES key to keep (or None)."""
    import base64

    if not 1 <= expires_s <= 3600:
        raise UserError(f"push grant lifetime {expires_s}s is out of range. Fix: use 1..3600 seconds")
    aad_prefix = f"{_job_prefix(job)}/"
    key_prefix = store._key(aad_prefix.rstrip("/")) + "/"
    post = store.client.generate_presigned_post(
        Bucket=store.bucket,
        Key=key_prefix + "${filename}",
        Conditions=[["starts-with", "$key", key_prefix], ["content-length-range", 0, max_object_bytes]],
        ExpiresIn=expires_s,
    )
    key = os.urandom(32) if encrypt else None
    fields = {k: str(v) for k, v in post["fields"].items() if k != "key"}
    grant = PushGrant(
        url=str(post["url"]),
        fields=fields,
        key_prefix=key_prefix,
        aad_prefix=aad_prefix,
        expires_at=now + expires_s,
        aes_key_b64=base64.b64encode(key).decode() if key else None,
    )
    return grant, key


def decrypt_object(data: bytes, *, key: bytes, aad: str) -> bytes:
    """Plaintext of an object pushed encrypted (ArtifactError if it was altered or the key is wrong)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not data.startswith(ENCRYPTED_MAGIC) or len(data) < len(ENCRYPTED_MAGIC) + 12 + 16:
        raise ArtifactError(f"{aad} is not an encrypted artifact")
    nonce = data[len(ENCRYPTED_MAGIC) : len(ENCRYPTED_MAGIC) + 12]
    try:
        return AESGCM(key).decrypt(nonce, data[len(ENCRYPTED_MAGIC) + 12 :], aad.encode())
    except InvalidTag:
        raise ArtifactError(f"{aad} failed authentication (altered, or another key)") from None


def fetch_encrypted_dir(store: ArtifactStore, key_prefix: str, dest: Path, *, key: bytes) -> Path:
    """fetch_dir for a directory pushed with encryption: decrypt each object, then verify the manifest."""
    dest.mkdir(parents=True, exist_ok=True)

    def get(store_key: str, local: Path) -> None:
        store.get_file(store_key, local)
        local.write_bytes(decrypt_object(local.read_bytes(), key=key, aad=store_key))

    get(f"{key_prefix}/{MARKER}", dest / MARKER)
    files = _manifest_files(dest / MARKER)
    for rel in files:
        get(f"{key_prefix}/{rel}", dest / rel)
    _verify_local(dest, files)
    return dest
