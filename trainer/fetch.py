"""`python -m trainer fetch-model`: the host downloads a public model from a Hugging Face Hub itself.

Standard library only (urllib), so it runs before anything else is installed. It lists the
repository at a pinned commit (`GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true`,
following `Link: <...>; rel="next"` pages), downloads each file from
`{endpoint}/{repo}/resolve/{revision}/{path}` into `PATH.part`, resuming with `Range: bytes=N-`,
and verifies it before renaming it into place: LFS files by sha256 against the tree's `lfs.oid`,
small files by their git blob sha1 against `oid`. Verified files are recorded in
`DEST/.fetched.json` (size and hash), so a second run moves no bytes for them.

Exit codes: 0 every file verified; 2 bad arguments; 4 a file's hash does not match (the file is
named on stderr and in the result line); 5 the hub could not be reached or refused. The last
stdout line is one JSON object: ok, files, bytes_total, downloaded_bytes, and error/file on failure.
With `--progress FILE`, the same counters are written atomically to FILE while it runs.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

__all__ = [
    "EXIT_FETCH_FAILED",
    "EXIT_HASH_MISMATCH",
    "FETCH_MANIFEST",
    "FetchError",
    "HashMismatch",
    "HubFile",
    "fetch_model",
    "git_blob_sha1",
    "list_tree",
    "main_fetch",
]

EXIT_HASH_MISMATCH = 4
EXIT_FETCH_FAILED = 5
FETCH_MANIFEST = ".fetched.json"
CHUNK_BYTES = 1 << 20
PROGRESS_EVERY_S = 0.5
_REVISION = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')


class FetchError(Exception):
    """The hub could not be reached, refused, or sent something that is not a tree."""


class HashMismatch(FetchError):
    """A downloaded file's hash differs from the tree's."""

    def __init__(self, path: str, expected: str, got: str) -> None:
        self.path = path
        super().__init__(f"hash mismatch: {path}: expected {expected}, got {got}")


@dataclass(frozen=True, slots=True)
class HubFile:
    path: str
    size: int
    oid: str  # git blob sha1
    sha256: str | None  # lfs.oid for LFS files

    @property
    def digest(self) -> tuple[str, str]:
        return ("sha256", self.sha256) if self.sha256 else ("sha1", self.oid)


def git_blob_sha1(path: Path) -> str:
    """The git blob id of a file: sha1 of `blob <size>\\0` + its bytes."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(CHUNK_BYTES), b""):
            h.update(block)
    return h.hexdigest()


def _open(url: str, *, headers: dict[str, str] | None = None, timeout_s: float = 60.0) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "tuneharness-trainer/1", **(headers or {})})
    return urllib.request.urlopen(req, timeout=timeout_s)


def list_tree(endpoint: str, repo: str, revision: str) -> list[HubFile]:
    """Every file of `repo` at `revision`, following the hub's pagination."""
    url: str | None = f"{endpoint.rstrip('/')}/api/models/{repo}/tree/{quote(revision, safe='')}?recursive=true"
    files: list[HubFile] = []
    while url is not None:
        try:
            with _open(url) as resp:
                page = json.loads(resp.read().decode("utf-8"))
                link = resp.headers.get("Link") or ""
        except urllib.error.HTTPError as exc:
            raise FetchError(f"tree of {repo}@{revision}: HTTP {exc.code} from {endpoint}") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise FetchError(f"tree of {repo}@{revision}: {exc}") from None
        if not isinstance(page, list):
            raise FetchError(f"tree of {repo}@{revision}: not a list")
        for entry in page:
            if entry.get("type") != "file":
                continue
            path = str(entry["path"])
            if path.startswith("/") or ".." in path.split("/"):
                raise FetchError(f"tree of {repo}@{revision}: unsafe path {path!r}")
            lfs = entry.get("lfs") or None
            files.append(
                HubFile(path, int(entry.get("size") or 0), str(entry["oid"]), str(lfs["oid"]) if lfs else None)
            )
        m = _NEXT.search(link)
        url = m.group(1) if m else None
    return files


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


class _Progress:
    def __init__(self, path: Path | None, total: int) -> None:
        self.path, self.total = path, total
        self.done = self.downloaded = 0
        self.started = time.monotonic()
        self._last = 0.0

    def add(self, n: int, *, downloaded: bool) -> None:
        self.done += n
        if downloaded:
            self.downloaded += n
        self.write()

    def write(self, *, force: bool = False, state: str = "fetching") -> None:
        now = time.monotonic()
        if self.path is None or (not force and now - self._last < PROGRESS_EVERY_S):
            return
        self._last = now
        elapsed = max(1e-6, now - self.started)
        _write_json(
            self.path,
            {
                "state": state,
                "bytes_done": self.done,
                "bytes_total": self.total,
                "downloaded_bytes": self.downloaded,
                "rate_bytes_per_s": self.downloaded / elapsed,
            },
        )


def _download(url: str, part: Path, size: int, progress: _Progress) -> None:
    """Bring `part` up to `size` bytes from `url`, resuming from its current length."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    if have == size:
        return
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = _open(url, headers=headers)
    except urllib.error.HTTPError as exc:
        if exc.code == 416:
            return  # nothing left to send: the hash decides
        raise FetchError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise FetchError(f"{url}: {exc}") from None
    with resp:
        if have and resp.status != 206:
            progress.add(-have, downloaded=False)
            have = 0  # the server ignored the range: start the file again
        with part.open("ab" if have else "wb") as f:
            try:
                for block in iter(lambda: resp.read(CHUNK_BYTES), b""):
                    f.write(block)
                    progress.add(len(block), downloaded=True)
            except (OSError, http.client.HTTPException) as exc:
                raise FetchError(f"{url}: transfer broke off: {exc!r}") from None
            finally:
                f.flush()
                os.fsync(f.fileno())
    got = part.stat().st_size
    if got < size:
        raise FetchError(f"{url}: transfer broke off at {got} of {size} bytes; run again to resume")


def fetch_model(
    endpoint: str, repo: str, revision: str, dest: Path, *, progress_file: Path | None = None
) -> dict[str, Any]:
    """Download and verify every file of `repo@revision` into `dest`; return the result line."""
    files = list_tree(endpoint, repo, revision)
    dest.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / FETCH_MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        if manifest.get("repo") != repo or manifest.get("revision") != revision:
            manifest = {}
    except (OSError, ValueError):
        manifest = {}
    verified: dict[str, Any] = dict(manifest.get("files") or {})
    progress = _Progress(progress_file, sum(f.size for f in files))
    for hub_file in files:
        target = dest / hub_file.path
        algo, expected = hub_file.digest
        known = verified.get(hub_file.path)
        if (
            known == {"size": hub_file.size, algo: expected}
            and target.is_file()
            and target.stat().st_size == hub_file.size
        ):
            progress.add(hub_file.size, downloaded=False)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        part = target.with_name(target.name + ".part")
        before = part.stat().st_size if part.exists() else 0
        progress.add(min(before, hub_file.size), downloaded=False)
        url = f"{endpoint.rstrip('/')}/{repo}/resolve/{quote(revision, safe='')}/{quote(hub_file.path)}"
        _download(url, part, hub_file.size, progress)
        got = _sha256(part) if algo == "sha256" else git_blob_sha1(part)
        if got != expected:
            part.unlink(missing_ok=True)
            raise HashMismatch(hub_file.path, expected, got)
        os.replace(part, target)
        verified[hub_file.path] = {"size": hub_file.size, algo: expected}
        _write_json(manifest_path, {"repo": repo, "revision": revision, "files": verified})
    _write_json(manifest_path, {"repo": repo, "revision": revision, "files": verified})
    progress.write(force=True, state="done")
    return {
        "ok": True,
        "files": len(files),
        "bytes_total": progress.total,
        "downloaded_bytes": progress.downloaded,
    }


def _iter_problems(endpoint: str, repo: str, revision: str) -> Iterator[str]:
    if not endpoint.startswith(("http://", "https://")):
        yield f"--endpoint {endpoint!r} is not an http(s) URL; pass e.g. https://huggingface.co"
    if not _REPO.match(repo):
        yield f"--repo {repo!r} is not ORG/NAME; pass the model's id as the hub shows it"
    if not _REVISION.match(revision):
        yield f"--revision {revision!r} is not a 40-hex commit; pin the commit the hub shows for the model"


def main_fetch(endpoint: str, repo: str, revision: str, dest: Path, *, progress_file: Path | None = None) -> int:
    for problem in _iter_problems(endpoint, repo, revision):
        print(problem, file=sys.stderr)
        return 2
    try:
        result = fetch_model(endpoint, repo, revision, dest, progress_file=progress_file)
    except HashMismatch as exc:
        print(str(exc), file=sys.stderr)
        print(json.dumps({"ok": False, "error": "hash_mismatch", "file": exc.path, "detail": str(exc)}))
        return EXIT_HASH_MISMATCH
    except FetchError as exc:
        print(str(exc), file=sys.stderr)
        print(json.dumps({"ok": False, "error": "fetch_failed", "detail": str(exc)}))
        return EXIT_FETCH_FAILED
    print(json.dumps(result, sort_keys=True))
    return 0
