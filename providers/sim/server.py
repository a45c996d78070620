"""`tuneharness sim serve`: one SimMarket on a ScaledClock, shared over HTTP on loopback.

Celery workers and CLI invocations are separate processes; they all talk to this one server
(through `SimClientMarket`), so they see one marketplace. The server also owns the sim hosts'
sshd daemons and starts/stops them on time (a host's sshd stops at its `dies_at_s` even when
nobody polls): a scheduler thread sleeps until the next due transition.

API (JSON): GET /v1/health; POST /v1/offers/search; POST /v1/instances; GET /v1/instances
[?label_prefix=]; GET|DELETE /v1/instances/{id}; POST /v1/instances/{id}/stop|start;
referee only (never for policy code): GET /v1/referee/bills, GET /v1/referee/truth/{id},
POST /v1/referee/receipt (the campaign receipt of what the control plane reports it did).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from app.market import MarketError, OfferGone, ProviderError
from providers.sim.campaign.referee import referee_receipt
from providers.sim.clock import ScaledClock
from providers.sim.hosts import SshdHostRuntime
from providers.sim.market import SimMarket
from providers.sim.trace import Trace
from providers.sim.wire import (
    instance_to_json,
    offer_from_json,
    offer_to_json,
    query_from_json,
    spec_from_json,
)

__all__ = ["SimServer"]


class SimServer:
    """The sim marketplace as a loopback HTTP service with real-SSH hosts."""

    def __init__(
        self,
        trace: Trace,
        *,
        scale: float = 1.0,
        port: int = 0,
        root: Path | None = None,
        clock: ScaledClock | None = None,
        train_step_s: float | None = None,
        train_start_s: float | None = None,
        wheelhouse: Path | None = None,
    ) -> None:
        self.trace = trace
        self.clock = clock or ScaledClock.starting_now(scale)
        self._own_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="tuneharness-sim-"))
        self.runtime = SshdHostRuntime(
            self.root / "hosts",
            clock_info=self.clock.to_dict(),
            train_step_s=train_step_s,
            train_start_s=train_start_s,
            wheelhouse=wheelhouse,
        )
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.market = SimMarket(trace, self.clock, runtime=self.runtime, on_change=self._wake.set)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self.httpd.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        """Serve in background threads; return the base URL."""
        self._threads = [
            threading.Thread(target=self.httpd.serve_forever, name="sim-http", daemon=True),
            threading.Thread(target=self._schedule, name="sim-scheduler", daemon=True),
        ]
        for t in self._threads:
            t.start()
        return self.url

    def request_stop(self) -> None:
        """Make `wait()` return (safe from a signal handler)."""
        self._stopping.set()

    def wait(self) -> None:
        """Block until `close()` (or Ctrl-C in the caller)."""
        self._stopping.wait()

    def _schedule(self) -> None:
        """Apply due transitions (sshd up at ready, down at death) without anyone polling."""
        while not self._stopping.is_set():
            try:
                next_due = self.market.sync()
            except Exception:  # a failing sshd start must not kill the scheduler; status() retries
                next_due = None
            wait_s = 1.0
            if next_due is not None:
                wait_s = min(1.0, max(0.005, self.clock.wall_seconds(next_due - self.clock.now())))
            self._wake.wait(wait_s)
            self._wake.clear()

    def close(self) -> None:
        self._stopping.set()
        self._wake.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self.runtime.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)


def _handler_for(server: SimServer) -> type[BaseHTTPRequestHandler]:
    market = server.market

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            if not n:
                return {}
            data = json.loads(self.rfile.read(n) or b"{}")
            return data if isinstance(data, dict) else {}

        def _dispatch(self, method: str) -> None:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/") if p]
            try:
                self._route(method, parts, parse_qs(url.query))
            except OfferGone as exc:
                self._send(HTTPStatus.GONE, {"success": False, "error": "offer_gone", "msg": str(exc)})
            except ProviderError as exc:
                self._send(exc.status_code or 400, {"success": False, "error": "provider_error", "msg": str(exc)})
            except MarketError as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"success": False, "error": "market_error", "msg": str(exc)})
            except KeyError as exc:
                self._send(HTTPStatus.NOT_FOUND, {"success": False, "error": "not_found", "msg": str(exc)})
            except (ValueError, TypeError) as exc:
                self._send(HTTPStatus.BAD_REQUEST, {"success": False, "error": "bad_request", "msg": str(exc)})
            except Exception as exc:
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"success": False, "error": "internal", "msg": repr(exc)})

        def _route(self, method: str, parts: list[str], query: dict[str, list[str]]) -> None:
            if parts[:1] != ["v1"]:
                raise KeyError(self.path)
            rest = parts[1:]
            if method == "GET" and rest == ["health"]:
                self._send(
                    200,
                    {
                        "ok": True,
                        "trace": server.trace.name,
                        "hosts": len(server.trace.hosts),
                        "clock": server.clock.to_dict(),
                        "now": server.clock.now(),
                    },
                )
            elif method == "POST" and rest == ["offers", "search"]:
                offers = market.search_offers(query_from_json(self._body()))
                self._send(200, {"offers": [offer_to_json(o) for o in offers]})
            elif method == "POST" and rest == ["instances"]:
                body = self._body()
                iid = market.create(offer_from_json(body["offer"]), spec_from_json(body["spec"]))
                self._send(201, {"success": True, "instance_id": iid})
            elif method == "GET" and rest == ["instances"]:
                prefix = (query.get("label_prefix") or [""])[0]
                self._send(200, {"instances": [instance_to_json(i) for i in market.list_instances(prefix)]})
            elif len(rest) == 2 and rest[0] == "instances" and method in ("GET", "DELETE"):
                if method == "GET":
                    self._send(200, instance_to_json(market.status(rest[1])))
                else:
                    market.destroy(rest[1])
                    self._send(200, {"success": True})
            elif len(rest) == 3 and rest[0] == "instances" and method == "POST" and rest[2] in ("stop", "start"):
                (market.stop if rest[2] == "stop" else market.start)(rest[1])
                self._send(200, {"success": True})
            elif method == "GET" and rest == ["referee", "bills"]:
                self._send(200, {"bills": [b.to_dict() for b in market.referee.bills()]})
            elif method == "GET" and len(rest) == 3 and rest[:2] == ["referee", "truth"]:
                self._send(200, market.referee.truth_of(rest[2]).to_dict())
            elif method == "POST" and rest == ["referee", "receipt"]:
                self._send(200, referee_receipt(market.referee, self._body()))
            else:
                raise KeyError(f"{method} {self.path}")

        def do_GET(self) -> None:
            self._dispatch("GET")

        def do_POST(self) -> None:
            self._dispatch("POST")

        def do_DELETE(self) -> None:
            self._dispatch("DELETE")

    return Handler
