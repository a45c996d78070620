"""`tuneharness web`: the read-only pages over HTTP, from the standard library's ThreadingHTTPServer.

Routes (GET and HEAD only; any other method is 405):

| path | what |
|---|---|
| `/` | fleet: jobs, hosts, the beat sweeps' liveness, a link to Flower |
| `/money` | spend over time by cause against the caps, dead-host lifetimes, stops |
| `/reliability` | interruptions, resumed, recovery median and p90 over 7 and 30 days |
| `/jobs/<id>` | a job's timeline, loss curve, hosts, money and gate decision |
| `/api/live.json` | each job's live fields, polled by static/live.js every 2 s |
| `/static/<file>` | the stylesheet and the script shipped in the package |

The same rule as Flower's: an address other machines reach needs basic auth
(TUNEHARNESS_FLOWER_USER / TUNEHARNESS_FLOWER_PASSWORD), and without it nothing is started
(`refuse_open_web`). When the credentials are set every request must carry them, on any address.
Every answer forbids inline script and style and any other origin (Content-Security-Policy).
"""

from __future__ import annotations

import base64
import hmac
import json
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

from app.errors import UserError
from app.stack import is_loopback
from app.web import data, pages

__all__ = ["DEFAULT_PORT", "WebServer", "is_loopback", "refuse_open_web", "serve", "web_argv"]

DEFAULT_PORT = 5580
STATIC_TYPES = {".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
log = logging.getLogger("tuneharness.web")


def refuse_open_web(host: str, *, user: str | None, password: str | None) -> None:
    """The pages show every job's spend and hosts: on an address other machines reach they need
    basic auth (Flower's rule, `app.stack.refuse_open_flower`, with Flower's credentials)."""
    if not is_loopback(host) and not (user and password):
        raise UserError(
            f"the web pages would listen on {host} without authentication. Fix: set TUNEHARNESS_FLOWER_USER and "
            "TUNEHARNESS_FLOWER_PASSWORD (the pages use Flower's credentials), or keep --host 127.0.0.1"
        )


def web_argv(*, host: str = "127.0.0.1", port: int = DEFAULT_PORT) -> list[str]:
    """The child process `tuneharness up` starts for the pages (`Stack._spawn("web", web_argv(...))`)."""
    return [sys.executable, "-m", "app.cli.main", "web", "--host", host, "--port", str(port)]


def _static(name: str) -> tuple[bytes, str] | None:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in STATIC_TYPES:
        return None
    f = resources.files("app.web").joinpath("static", name)
    if not f.is_file():
        return None
    return f.read_bytes(), STATIC_TYPES[suffix]


class _Handler(BaseHTTPRequestHandler):
    server_version = "tuneharness-web"
    sys_version = ""
    site: _Site  # set on the subclass `serve` builds

    def log_message(self, format: str, *args: Any) -> None:
        log.info("%s %s", self.address_string(), format % args)

    def _send(self, status: int, body: bytes, ctype: str, *, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _authorised(self) -> bool:
        want = self.site.credentials
        if want is None:
            return True
        got = self.headers.get("Authorization", "")
        if not got.startswith("Basic "):
            return False
        try:
            user, _, password = base64.b64decode(got[6:], validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return hmac.compare_digest(user.encode(), want[0].encode()) & hmac.compare_digest(
            password.encode(), want[1].encode()
        )

    def _route(self, path: str) -> tuple[int, bytes, str]:
        src = self.site.source
        html = "text/html; charset=utf-8"
        if path == "/":
            return 200, pages.fleet_page(data.fleet(src)).encode(), html
        if path == "/money":
            return 200, pages.money_page(data.money(src), flower_url=src.flower_url).encode(), html
        if path == "/reliability":
            return 200, pages.reliability_page(data.reliability(src), flower_url=src.flower_url).encode(), html
        if path == "/api/live.json":
            return 200, json.dumps(data.live(src)).encode(), "application/json"
        if path.startswith("/jobs/"):
            job_id = unquote(path[len("/jobs/") :])
            try:
                view = data.job_page(src, job_id)
            except UserError:
                return 404, pages.not_found_page(f"no job {job_id!r}", flower_url=src.flower_url).encode(), html
            return 200, pages.job_page(view, flower_url=src.flower_url).encode(), html
        if path.startswith("/static/"):
            got = _static(path[len("/static/") :])
            if got is not None:
                return 200, got[0], got[1]
        return 404, pages.not_found_page(f"no page {path!r}", flower_url=src.flower_url).encode(), html

    def do_GET(self) -> None:
        if not self._authorised():
            self._send(
                401,
                b"authentication required\n",
                "text/plain; charset=utf-8",
                extra={"WWW-Authenticate": 'Basic realm="tuneharness", charset="UTF-8"'},
            )
            return
        try:
            status, body, ctype = self._route(urlsplit(self.path).path)
        except Exception:  # one broken read answers 500; the server goes on
            log.exception("GET %s failed", self.path)
            status, body, ctype = 500, b"internal error: see the web server's log\n", "text/plain; charset=utf-8"
        self._send(status, body, ctype)

    def do_HEAD(self) -> None:
        self.do_GET()

    def _read_only(self) -> None:
        self._send(
            HTTPStatus.METHOD_NOT_ALLOWED,
            b"read-only: GET and HEAD only\n",
            "text/plain; charset=utf-8",
            extra={"Allow": "GET, HEAD"},
        )

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_TRACE = do_CONNECT = _read_only


@dataclass
class _Site:
    source: data.Source
    credentials: tuple[str, str] | None


@dataclass
class WebServer:
    """The pages served from a thread of this process: `start()` binds and returns at once,
    `url` is where they answer, `stop()` shuts the server down. Tests and `serve` use it."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT  # 0: a free port
    source: Callable[[], data.Source] = data.default_source
    user: str | None = None
    password: str | None = None
    _httpd: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    def _bind(self) -> ThreadingHTTPServer:
        refuse_open_web(self.host, user=self.user, password=self.password)
        site = _Site(self.source(), (self.user, self.password) if self.user and self.password else None)
        handler = type("Handler", (_Handler,), {"site": site})
        try:
            httpd = ThreadingHTTPServer((self.host, self.port), handler)
        except OSError as exc:
            raise UserError(
                f"cannot listen on {self.host}:{self.port} ({exc.strerror}). Fix: pass another --port"
            ) from None
        httpd.daemon_threads = True
        return httpd

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() first"
        host, port = self._httpd.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://{name}:{port}"

    def start(self) -> WebServer:
        self._httpd = self._bind()
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="tuneharness-web", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> WebServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    source: Callable[[], data.Source] = data.default_source,
    user: str | None = None,
    password: str | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the pages on host:port until interrupted (`tuneharness web`). `ready(url)` is called
    once the socket listens."""
    server = WebServer(host=host, port=port, source=source, user=user, password=password)
    server._httpd = server._bind()
    if ready is not None:
        ready(server.url)
    try:
        server._httpd.serve_forever()
    finally:
        server._httpd.server_close()
