"""A fake vendor server: real HTTP on 127.0.0.1 (a free port), stdlib only, in a thread.

It records every call (method, path, query, headers with the key's value removed, parsed body)
and answers through `route`, which a vendor fake implements. Faults are injected per call:
`inject(429, "API requests too frequent")` makes the next matching call fail that way.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["FakeVendorServer", "Fault", "RecordedCall", "Reply", "json_reply", "text_reply"]

REDACTED = "<redacted>"


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One request the fake received. Never holds the API key."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-case names; `authorization` shows no key
    body: Any  # parsed JSON, else text, else None
    authorized: bool
    operation: str | None = None  # a GraphQL root field, for a fake that speaks GraphQL


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def json_reply(status: int, payload: Any, content_type: str = "application/json") -> Reply:
    return Reply(status, json.dumps(payload).encode(), content_type)


def text_reply(status: int, text: str) -> Reply:
    return Reply(status, text.encode(), "text/plain; charset=utf-8")


@dataclass(slots=True)
class Fault:
    """Answer `reply` to the next `times` calls whose path or operation contains `match`
    (and whose HTTP method is `method`, when given)."""

    reply: Reply
    times: int = 1
    match: str | None = None
    method: str | None = None
    acted: bool = False  # carry the call out first, then answer `reply` (a create accepted, its answer lost)


@dataclass(slots=True)
class _State:
    calls: list[RecordedCall] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)


class FakeVendorServer:
    """Base of the vendor fakes: lifecycle, recording, auth and fault injection."""

    provider = "fake"
    accepts_query_key = True  # `?api_key=` as well as the Bearer header (RunPod's v2: header only)

    def __init__(self, *, api_key: str = "fake-key") -> None:
        self.api_key = api_key
        self.lock = threading.RLock()
        self._state = _State()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeVendorServer:
        handler = _handler_for(self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"fake-{self.provider}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> FakeVendorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake server is not started")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give the adapter (VAST_API_URL / RUNPOD_API_URL)."""
        return f"http://127.0.0.1:{self.port}"

    # -- recording and faults ------------------------------------------------------------------

    @property
    def calls(self) -> list[RecordedCall]:
        with self.lock:
            return list(self._state.calls)

    def calls_to(self, match: str) -> list[RecordedCall]:
        """Calls whose path or GraphQL operation contains `match`."""
        return [c for c in self.calls if match in c.path or (c.operation is not None and match in c.operation)]

    def clear_calls(self) -> None:
        with self.lock:
            self._state.calls.clear()

    def inject(
        self,
        status: int,
        body: str | dict[str, Any] | list[Any] = "",
        *,
        times: int = 1,
        match: str | None = None,
        method: str | None = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
        acted: bool = False,
    ) -> None:
        """Make the next `times` matching calls answer `status` with `body` (text or JSON); with
        `acted`, each call is carried out first (the vendor acted, then its answer was lost)."""
        reply = json_reply(status, body) if isinstance(body, dict | list) else text_reply(status, body)
        if headers or content_type:
            reply = Reply(reply.status, reply.body, content_type or reply.content_type, tuple((headers or {}).items()))
        with self.lock:
            self._state.faults.append(Fault(reply, times, match, method, acted))

    def pending_faults(self) -> int:
        with self.lock:
            return sum(f.times for f in self._state.faults)

    def _take_fault(self, call: RecordedCall) -> Fault | None:
        with self.lock:
            for fault in self._state.faults:
                if fault.method is not None and fault.method != call.method:
                    continue
                if (
                    fault.match is None
                    or fault.match in call.path
                    or (call.operation is not None and fault.match in call.operation)
                ):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._state.faults.remove(fault)
                    return fault
        return None

    # -- the vendor ----------------------------------------------------------------------------

    def operation(self, body: Any) -> str | None:
        """The GraphQL root field, for fakes that speak GraphQL."""
        return None

    def unauthorized(self) -> Reply:
        return json_reply(401, {"success": False, "error": "auth_error", "msg": "invalid api key"})

    def route(self, call: RecordedCall) -> Reply:  # pragma: no cover - implemented by vendors
        raise NotImplementedError

    def handle(self, method: str, raw_path: str, headers: dict[str, str], raw_body: bytes) -> Reply:
        parts = urlsplit(raw_path)
        query = parse_qs(parts.query)
        auth = headers.get("authorization", "")
        authorized = auth == f"Bearer {self.api_key}" or (
            self.accepts_query_key and query.get("api_key") == [self.api_key]
        )
        if "authorization" in headers:
            headers["authorization"] = f"Bearer {REDACTED}"
        if "api_key" in query:
            query["api_key"] = [REDACTED]
        text = raw_body.decode("utf-8", "replace") if raw_body else ""
        body: Any
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = text
        call = RecordedCall(
            method=method,
            path=parts.path,
            query=query,
            headers=headers,
            body=body,
            authorized=authorized,
            operation=self.operation(body),
        )
        with self.lock:
            self._state.calls.append(call)
        fault = self._take_fault(call)
        if fault is not None and not fault.acted:
            return fault.reply
        if not authorized:
            return self.unauthorized()
        with self.lock:
            reply = self.route(call)
        return reply if fault is None else fault.reply


def _handler_for(fake: FakeVendorServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"fake-{fake.provider}/1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            try:
                reply = fake.handle(self.command, self.path, headers, raw)
            except Exception as exc:  # a bug in the fake: answer 500 and say so
                reply = text_reply(500, f"fake {fake.provider} crashed: {type(exc).__name__}: {exc}")
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            for name, value in reply.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(reply.body)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
