"""A webhook URL, a bearer token or a secret setting's value never reaches a log line."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import httpx
import pytest

from app.logscrub import REDACTED, SecretScrubber, configure_logging, scrub


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ("POST https://hooks.slack.com/services/T000/B000/XXXXsecretXXXX", "XXXXsecretXXXX"),
        ("POST https://discord.com/api/webhooks/123/tok-en_secret", "tok-en_secret"),
        ("GET https://api.telegram.org/bot123456:ABC-secret/sendMessage", "123456:ABC-secret"),
        ("GET https://console.vast.ai/api/v0/asks/?api_key=abcdef123456", "abcdef123456"),
        ("Authorization: Bearer rp_abcdefghijklmnop", "rp_abcdefghijklmnop"),
        ("postgresql://th:hunter22@db:5432/th", "hunter22"),
    ],
)
def test_scrub_removes_the_secret_part(line: str, secret: str) -> None:
    """Each known secret shape is replaced, the rest of the line kept."""
    out = scrub(line)
    assert secret not in out and REDACTED in out


def test_secret_setting_values_are_redacted_anywhere() -> None:
    """The value of a secret setting is redacted even in a shape no pattern knows."""
    f = SecretScrubber({"VAST_API_KEY": "zz-vast-key-0123", "TUNEHARNESS_HOME": "/home/not-secret"})
    rec = logging.LogRecord(
        "x", logging.INFO, __file__, 1, "key is %s and home %s", ("zz-vast-key-0123", "/home/not-secret"), None
    )
    assert f.filter(rec)
    assert rec.getMessage() == f"key is {REDACTED} and home /home/not-secret"


class _Ok(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = HTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def test_httpx_request_line_leaks_nothing_after_configure(server: str) -> None:
    """A worker's root logger at INFO, after configure_logging, shows no webhook token from httpx."""
    root = logging.getLogger("th-test-root")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    root.addHandler(handler)
    httpx_log = logging.getLogger("httpx")
    before = httpx_log.level
    httpx_log.addHandler(handler)
    try:
        httpx_log.setLevel(logging.INFO)
        httpx.post(f"{server}/services/T000/B000/tok3nSECRET?token=abcdefgh99")
        leaked_before = "abcdefgh99" in stream.getvalue()
        stream.truncate(0)
        configure_logging(root)
        httpx.post(f"{server}/services/T000/B000/tok3nSECRET?token=abcdefgh99")
        assert "abcdefgh99" not in stream.getvalue()
        assert leaked_before  # the test would have seen a leak
        # and a record that does reach the scrubbing handler is redacted
        root.warning("webhook https://hooks.slack.com/services/T/B/tok3nSECRET failed")
        assert "tok3nSECRET" not in stream.getvalue() and REDACTED in stream.getvalue()
    finally:
        httpx_log.removeHandler(handler)
        httpx_log.setLevel(before)
        root.removeHandler(handler)
