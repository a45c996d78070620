"""A fake Hugging Face Hub on 127.0.0.1: serves local model directories as public repositories.

It answers the two calls `huggingface_hub` makes to download a model (and `trainer/fetch.py`
makes without it), as the Hub documents them:

- `GET /api/models/{repo}/tree/{revision}?recursive=true` -> a JSON list of
  `{"type": "file", "oid": <git blob sha1>, "size", "path", "lfs": {"oid": <sha256>, "size", "pointerSize"}}`
  (`lfs` only on files stored in LFS: here, those of `lfs_min_bytes` or more), paginated with a
  `Link: <...>; rel="next"` header every `page_size` entries;
- `GET /{repo}/resolve/{revision}/{path}` -> the file, with `Range: bytes=N-` answered `206` and
  `Content-Range`, and the `X-Repo-Commit` and `ETag` headers the Hub sends.

An unknown repository or revision is `404` (the Hub says the same for a private repository
without a token). Faults for tests: `corrupt(path)` serves altered bytes for a file;
`throttle_bytes_per_s` slows every download; `break_after_bytes` drops the connection once
after that many bytes of one response.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FakeHub", "HubRepo"]

DEFAULT_LFS_MIN_BYTES = 10 * 1024


@dataclass
class HubRepo:
    repo_id: str
    revision: str
    files: dict[str, bytes]


@dataclass
class _Faults:
    corrupt: set[str] = field(default_factory=set)
    break_after_bytes: int | None = None


class FakeHub:
    """Public model repositories from local directories, over real HTTP."""

    def __init__(self, *, page_size: int = 1000, lfs_min_bytes: int = DEFAULT_LFS_MIN_BYTES) -> None:
        self.page_size = page_size
        self.lfs_min_bytes = lfs_min_bytes
        self.throttle_bytes_per_s: float | None = None
        self.repos: dict[tuple[str, str], HubRepo] = {}
        self.requests: list[tuple[str, str]] = []  # (path, Range header or "")
        self.bytes_served = 0  # file bytes sent by resolve (tree listings not counted)
        self._faults = _Faults()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- content -------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, revision: str, directory: Path) -> HubRepo:
        paths = [p for p in sorted(directory.rglob("*")) if p.is_file()]
        files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in paths}
        repo = HubRepo(repo_id, revision, files)
        self.repos[(repo_id, revision)] = repo
        return repo

    def corrupt(self, path: str) -> None:
        self._faults.corrupt.add(path)

    def break_once_after(self, n_bytes: int) -> None:
        self._faults.break_after_bytes = n_bytes

    def entry(self, path: str, data: bytes) -> dict[str, Any]:
        oid = hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()
        out: dict[str, Any] = {"type": "file", "oid": oid, "size": len(data), "path": path}
        if len(data) >= self.lfs_min_bytes:
            out["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> FakeHub:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, name="fake-hub", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- routes --------------------------------------------------------------------------------
    def _find(self, parts: list[str]) -> tuple[HubRepo, list[str]] | None:
        if len(parts) < 3:
            return None
        repo_id, revision = "/".join(parts[:2]), parts[2]
        repo = self.repos.get((repo_id, revision))
        return None if repo is None else (repo, parts[3:])

    def tree(self, path: str, query: dict[str, list[str]]) -> tuple[int, bytes, dict[str, str]]:
        # /api/models/{org}/{name}/tree/{revision}[/{path}]
        parts = [unquote(p) for p in path.split("/") if p]
        if len(parts) < 6 or parts[:2] != ["api", "models"] or parts[4] != "tree":
            return 404, b'{"error":"not found"}', {}
        found = self._find([parts[2], parts[3], parts[5]])
        if found is None:
            return 404, b'{"error":"Repository not found"}', {}
        repo, _ = found
        recursive = (query.get("recursive") or ["false"])[0].lower() in ("true", "1")
        names = sorted(repo.files) if recursive else sorted(n for n in repo.files if "/" not in n)
        start = int((query.get("cursor") or ["0"])[0])
        page = names[start : start + self.page_size]
        headers: dict[str, str] = {}
        if start + self.page_size < len(names):
            nxt = f"{self.url}{path}?recursive={str(recursive).lower()}&cursor={start + self.page_size}"
            headers["Link"] = f'<{nxt}>; rel="next"'
        body = json.dumps([self.entry(n, repo.files[n]) for n in page]).encode()
        return 200, body, headers

    def resolve(self, path: str) -> tuple[HubRepo, str, bytes] | None:
        # /{org}/{name}/resolve/{revision}/{path...}
        parts = [unquote(p) for p in path.split("/") if p]
        if len(parts) < 5 or parts[2] != "resolve":
            return None
        found = self._find([parts[0], parts[1], parts[3]])
        if found is None:
            return None
        repo, _ = found
        name = "/".join(parts[4:])
        data = repo.files.get(name)
        if data is None:
            return None
        if name in self._faults.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:] if data else b"x"
        return repo, name, data


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            split = urlsplit(self.path)
            with hub._lock:
                hub.requests.append((split.path, self.headers.get("Range") or ""))
            if split.path.startswith("/api/models/"):
                status, body, headers = hub.tree(split.path, parse_qs(split.query))
                self._send(status, body, {"Content-Type": "application/json", **headers})
                return
            found = hub.resolve(split.path)
            if found is None:
                self._send(404, b"Entry not found", {"Content-Type": "text/plain", "X-Error-Code": "EntryNotFound"})
                return
            repo, name, data = found
            entry = hub.entry(name, repo.files[name])
            etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
            headers = {
                "Content-Type": "application/octet-stream",
                "X-Repo-Commit": repo.revision,
                "ETag": f'"{etag}"',
                "Accept-Ranges": "bytes",
            }
            start = 0
            rng = self.headers.get("Range") or ""
            if rng.startswith("bytes=") and rng[6:].endswith("-") and rng[6:-1].isdigit():
                start = int(rng[6:-1])
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206 if start else 200, data[start:], headers, count=True)

        def _send(self, status: int, body: bytes, headers: dict[str, str], *, count: bool = False) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            limit = hub._faults.break_after_bytes
            sent = 0
            step = 16 * 1024
            for i in range(0, len(body), step):
                block = body[i : i + step]
                if limit is not None and sent + len(block) > limit:
                    hub._faults.break_after_bytes = None
                    self.wfile.write(block[: max(0, limit - sent)])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(block)
                sent += len(block)
                if count:
                    with hub._lock:
                        hub.bytes_served += len(block)
                if hub.throttle_bytes_per_s:
                    time.sleep(len(block) / hub.throttle_bytes_per_s)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler
