"""What may be shipped to a rented host, a stranger's machine: a job's model and data, never a secret.

A job file may point anywhere. `shipping_refusal` says why a path must not leave this machine:

- it lies inside the state directory (`TUNEHARNESS_HOME`: every job's SSH private key, the
  database), or is a directory that contains it;
- it is, or a directory holds, a known credential file (`.env`, `id_rsa`, `id_ed25519`,
  `credentials`, `.netrc`, ...), or a file that begins like a private key (PEM
  `-----BEGIN ... PRIVATE KEY-----`, OpenSSH, PuTTY);
- a symlink inside a shipped directory leads into the state directory.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

__all__ = ["CREDENTIAL_NAMES", "shipping_refusal", "state_dir"]

CREDENTIAL_NAMES = frozenset(
    {
        ".env",
        ".netrc",
        "_netrc",
        ".pgpass",
        ".git-credentials",
        ".pypirc",
        ".npmrc",
        ".dockercfg",
        "credentials",
        "credentials.json",
        "id_rsa",
        "id_dsa",
        "id_ecdsa",
        "id_ed25519",
        "id_ecdsa_sk",
        "id_ed25519_sk",
    }
)
# A private key announces itself in its first lines; a key pasted into a big file would too.
_KEY_HEADER = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----|PuTTY-User-Key-File-\d")
_SCAN_BYTES = 64 * 1024


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """TUNEHARNESS_HOME as `app.settings` reads it (default ~/.tuneharness)."""
    env = os.environ if environ is None else environ
    return Path(env.get("TUNEHARNESS_HOME") or str(Path.home() / ".tuneharness")).expanduser().resolve()


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def _credential_name(name: str) -> bool:
    return name in CREDENTIAL_NAMES or name.startswith(".env.")


def _looks_like_key(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            return _KEY_HEADER.search(fh.read(_SCAN_BYTES)) is not None
    except OSError:
        return False  # unreadable here: the transfer reports it


def _file_refusal(path: Path, home: Path) -> str | None:
    real = path.resolve()
    if _inside(real, home):
        return f"{path} leads into the state directory {home}, which holds every job's SSH key"
    if _credential_name(path.name) or _credential_name(real.name):
        return f"{path} is a credential file ({path.name})"
    if real.is_file() and _looks_like_key(real):
        return f"{path} looks like a private key"
    return None


def shipping_refusal(path: Path, *, home: Path | None = None) -> str | None:
    """Why `path` (a file or a directory) must not be shipped to a host; None when it may."""
    home = (home or state_dir()).resolve()
    real = Path(path).resolve()
    if _inside(real, home):
        return f"{path} is inside the state directory {home}, which holds every job's SSH key"
    if home.is_relative_to(real):
        return f"{path} contains the state directory {home}, which holds every job's SSH key"
    if not real.is_dir():
        return _file_refusal(Path(path), home)
    for dirpath, dirnames, filenames in os.walk(real):
        for name in (*filenames, *dirnames):
            entry = Path(dirpath) / name
            if entry.is_symlink() or name in filenames:
                problem = _file_refusal(entry, home)
                if problem is not None:
                    return problem
    return None
