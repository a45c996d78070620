"""Push mode: upload complete checkpoints and the final adapter with a presigned POST.

The control plane writes DIR/push.json (see docs/trainer.md); the host never holds a storage
credential. Each object goes to `key_prefix + <path below the job>` (the POST policy only admits
that prefix and only until it expires), the COMPLETE manifest last. With `aes_key_b64` every
object is sealed with AES-256-GCM first (`THE1` + 12-byte nonce + ciphertext and tag; AAD =
`aad_prefix + path`). A failed push never stops training: it is logged and the pull path remains.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

__all__ = ["PushError", "Pusher", "load_pusher"]

GRANT_FILE = "push.json"
MAGIC = b"THE1"


class PushError(Exception):
    """An upload was refused or could not be made."""


def _seal(data: bytes, *, key: bytes, aad: str) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, data, aad.encode())


def _multipart(fields: dict[str, str], data: bytes) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    parts = []
    for name, value in fields.items():
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode())
    parts.append(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="blob"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n".encode()
    )
    parts.append(data)
    parts.append(f"\r\n--{boundary}--\r\n".encode())
    return b"".join(parts), f"multipart/form-data; boundary={boundary}"


class Pusher:
    def __init__(self, grant: dict[str, Any], *, timeout_s: float = 60.0) -> None:
        for name in ("url", "fields", "key_prefix", "aad_prefix", "expires_at"):
            if name not in grant:
                raise PushError(f"push.json lacks {name!r}")
        self.grant = grant
        self.key = base64.b64decode(grant["aes_key_b64"]) if grant.get("aes_key_b64") else None
        self.timeout_s = timeout_s

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= float(self.grant["expires_at"])

    def put(self, rel: str, data: bytes) -> None:
        if self.expired():
            raise PushError("push grant expired; the control plane pulls instead")
        if self.key is not None:
            data = _seal(data, key=self.key, aad=self.grant["aad_prefix"] + rel)
        fields = dict(self.grant["fields"], key=self.grant["key_prefix"] + rel)
        body, ctype = _multipart(fields, data)
        req = urllib.request.Request(self.grant["url"], data=body, method="POST", headers={"Content-Type": ctype})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                if resp.status not in (200, 201, 204):
                    raise PushError(f"upload of {rel} answered HTTP {resp.status}")
        except urllib.error.HTTPError as e:
            raise PushError(f"upload of {rel} refused: HTTP {e.code} {e.read()[:200]!r}") from None
        except (urllib.error.URLError, OSError) as e:
            raise PushError(f"upload of {rel} failed: {e}") from None

    def push_dir(self, local: Path, rel_prefix: str) -> int:
        """Upload a complete directory (files listed in its manifest, the manifest last); bytes sent."""
        manifest = json.loads((local / "COMPLETE").read_text())
        sent = 0
        for rel in sorted(manifest["files"]):
            data = (local / rel).read_bytes()
            self.put(f"{rel_prefix}/{rel}", data)
            sent += len(data)
        self.put(f"{rel_prefix}/COMPLETE", (local / "COMPLETE").read_bytes())
        return sent


def load_pusher(job_dir: Path) -> Pusher | None:
    """The Pusher for DIR/push.json, or None when the job runs in pull mode."""
    path = job_dir / GRANT_FILE
    if not path.is_file():
        return None
    try:
        grant = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise PushError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(grant, dict):
        raise PushError(f"{path} must hold a JSON object")
    return Pusher(grant)
