"""Alerts: webhook shapes against a real local HTTP receiver, and the durable outbox when it is down."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from app.alerts import (
    Alert,
    AlertNotDelivered,
    InMemoryNotifier,
    OutboxNotifier,
    WebhookConfig,
    WebhookNotifier,
    webhook_config_from_env,
)
from app.db import init_db, make_engine
from app.errors import SettingsError
from support.services import wait_until

SECRET = "T000/B000/s3cr3t-t0ken"


class Receiver:
    """A chat service's incoming webhook on loopback: records POSTs, answers `status`."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.status = 200
        self.stall = threading.Event()  # set = answer immediately
        self.stall.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                outer.stall.wait(10)
                outer.posts.append((self.path, json.loads(body)))
                self.send_response(outer.status)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/services/{SECRET}"

    def stop(self) -> None:
        self.stall.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def engine(sqlite_url: str) -> Engine:
    eng = make_engine(sqlite_url)
    init_db(eng)
    return eng


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/services/{SECRET}"


ALERT = Alert(kind="host_lost", summary="host 4411 stopped answering", job="job-7", details={"instance": "i-1"})


@pytest.mark.parametrize(
    ("fmt", "expected_keys"),
    [
        ("slack", {"text"}),
        ("discord", {"content"}),
        ("telegram", {"chat_id", "text"}),
        ("json", {"kind", "text", "summary", "job", "details"}),
    ],
)
def test_webhook_posts_each_chat_shape(receiver: Receiver, fmt: str, expected_keys: set[str]) -> None:
    """Each format POSTs its chat service's JSON shape to the configured URL."""
    env = {
        "TUNEHARNESS_ALERT_WEBHOOK_URL": receiver.url,
        "TUNEHARNESS_ALERT_FORMAT": fmt,
        "TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID": "-100123",
    }
    config = webhook_config_from_env(env)
    assert config is not None
    WebhookNotifier(config).send(ALERT)
    path, body = receiver.posts[0]
    assert path == f"/services/{SECRET}"
    assert set(body) == expected_keys
    text = body.get("text") or body.get("content")
    assert "host_lost" in text and "host 4411" in text and "job-7" in text
    if fmt == "telegram":
        assert body["chat_id"] == "-100123"


def test_webhook_error_names_the_host_never_the_token(receiver: Receiver) -> None:
    """A refused POST raises AlertNotDelivered whose message holds the host and status, not the URL."""
    receiver.status = 500
    with pytest.raises(AlertNotDelivered) as info:
        WebhookNotifier(WebhookConfig(url=receiver.url)).send(ALERT)
    assert "HTTP 500" in str(info.value) and "127.0.0.1" in str(info.value)
    assert SECRET not in str(info.value) and "s3cr3t" not in repr(WebhookConfig(url=receiver.url))


def test_outbox_delivers_and_records(engine: Engine, receiver: Receiver) -> None:
    """With the receiver up, an alert is delivered once and marked delivered in the outbox."""
    n = OutboxNotifier(engine, WebhookNotifier(WebhookConfig(url=receiver.url)), background=False)
    n.notify(ALERT)
    assert len(receiver.posts) == 1
    [row] = n.recorded()
    assert row.delivered_at is not None and row.attempts == 1 and n.pending() == []


def test_receiver_down_queues_durably_without_raising_or_leaking(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    """Connection refused: notify returns quickly, the alert waits in the outbox, no token anywhere."""
    caplog.set_level(logging.DEBUG)
    n = OutboxNotifier(engine, WebhookNotifier(WebhookConfig(url=dead_url(), timeout_s=1.0)), background=False)
    started = time.monotonic()
    n.notify(ALERT)
    assert time.monotonic() - started < 2.5
    [row] = n.pending()
    assert row.attempts == 1 and row.last_error and "127.0.0.1" in row.last_error
    assert SECRET not in (row.last_error or "") and SECRET not in caplog.text
    assert "s3cr3t" not in json.dumps([r.model_dump() for r in n.recorded()])


def test_queued_alert_is_retried_after_backoff_when_receiver_is_back(engine: Engine, receiver: Receiver) -> None:
    """A queued alert is not retried before its backoff, then delivered by flush once it is due."""
    clock = [datetime(2026, 1, 1, tzinfo=UTC)]
    down = OutboxNotifier(engine, InMemoryNotifier(fail=True), background=False, now=lambda: clock[0])
    down.notify(ALERT)
    up = OutboxNotifier(
        engine,
        WebhookNotifier(WebhookConfig(url=receiver.url)),
        background=False,
        now=lambda: clock[0],
        backoff_base_s=30,
    )
    assert up.flush() == 0 and receiver.posts == []
    clock[0] += timedelta(seconds=31)
    assert up.flush() == 1
    assert len(receiver.posts) == 1 and up.pending() == []
    assert up.recorded()[0].attempts == 2


def test_a_delivered_alert_also_clears_the_backlog(engine: Engine, receiver: Receiver) -> None:
    """When the receiver is back, the next alert delivered pulls the owed ones after it."""
    receiver.status = 503
    n = OutboxNotifier(engine, WebhookNotifier(WebhookConfig(url=receiver.url)), background=False)
    n.notify(Alert(kind="budget_warning", summary="80% of the daily cap"))
    assert len(n.pending()) == 1
    receiver.status = 200
    n.notify(Alert(kind="budget_stop", summary="100% of the daily cap"))
    assert n.pending() == []
    kinds = [body["text"].split(":")[0] for _, body in receiver.posts]
    assert kinds == ["[tuneharness] budget_warning", "[tuneharness] budget_stop", "[tuneharness] budget_warning"]


def test_alert_with_a_key_is_raised_once(engine: Engine) -> None:
    """The same key twice is one outbox row and one delivery."""
    mem = InMemoryNotifier()
    n = OutboxNotifier(engine, mem, background=False)
    a = Alert(kind="gate_refused", summary="refused", key="gate_refused:abc")
    n.notify(a)
    n.notify(a)
    assert len(n.recorded()) == 1 and mem.kinds() == ["gate_refused"]


def test_background_delivery_never_blocks_the_caller(engine: Engine, receiver: Receiver) -> None:
    """A stalled receiver does not delay notify(); the alert is delivered once it answers."""
    receiver.stall.clear()
    n = OutboxNotifier(engine, WebhookNotifier(WebhookConfig(url=receiver.url, timeout_s=5.0)))
    started = time.monotonic()
    n.notify(ALERT)
    assert time.monotonic() - started < 0.5
    receiver.stall.set()
    n.drain(timeout_s=10)
    assert wait_until(lambda: n.pending() == [], timeout_s=10)
    assert len(receiver.posts) == 1


def test_no_webhook_configured_keeps_alerts_owed(engine: Engine) -> None:
    """Without a webhook URL alerts are kept, marked with the fix, until one is configured."""
    n = OutboxNotifier(engine, None, background=False)
    n.notify(ALERT)
    [row] = n.pending()
    assert "TUNEHARNESS_ALERT_WEBHOOK_URL" in (row.last_error or "")


def test_database_down_still_tries_to_deliver(tmp_path: Path) -> None:
    """If the outbox cannot be written (here: no tables), the alert is still sent directly and nothing raises."""
    eng = make_engine(f"sqlite:///{tmp_path / 'uninitialised.db'}")
    mem = InMemoryNotifier()
    OutboxNotifier(eng, mem, background=False).notify(ALERT)
    assert mem.kinds() == ["host_lost"]


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"TUNEHARNESS_ALERT_WEBHOOK_URL": "hooks.slack.com/x"}, "TUNEHARNESS_ALERT_WEBHOOK_URL"),
        (
            {"TUNEHARNESS_ALERT_WEBHOOK_URL": "https://h/x", "TUNEHARNESS_ALERT_FORMAT": "teams"},
            "TUNEHARNESS_ALERT_FORMAT",
        ),
        (
            {"TUNEHARNESS_ALERT_WEBHOOK_URL": "https://h/x", "TUNEHARNESS_ALERT_FORMAT": "telegram"},
            "TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID",
        ),
        (
            {"TUNEHARNESS_ALERT_WEBHOOK_URL": "https://h/x", "TUNEHARNESS_ALERT_TIMEOUT_S": "600"},
            "TUNEHARNESS_ALERT_TIMEOUT_S",
        ),
    ],
)
def test_bad_alert_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    """Each bad alert setting is refused naming its variable."""
    with pytest.raises(SettingsError) as info:
        webhook_config_from_env(env)
    assert info.value.variable == variable


def test_no_url_means_no_webhook() -> None:
    """Unset URL: no webhook (alerts stay in the outbox)."""
    assert webhook_config_from_env({}) is None


def test_unknown_alert_kind_is_a_programming_error() -> None:
    """Alert kinds are a closed set."""
    with pytest.raises(ValueError):
        Alert(kind="gpu_on_fire", summary="?")
