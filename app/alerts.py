"""Alerts: the Notifier port, a webhook sender, an in-memory fake, and a durable outbox.

`Notifier.notify(alert)` never raises and never waits on the network: the production notifier
(`OutboxNotifier`) writes the alert to the `alert_outbox` table (one short local transaction)
and delivers it from a background thread with short timeouts. An alert that cannot be
delivered stays in the outbox and is retried with backoff by `flush()` (called after every
successful delivery, by `drain()`, and by whoever runs it periodically). Delivery is
at-least-once; an alert with a `key` is recorded (and so delivered) once per key.

Webhook shapes (`TUNEHARNESS_ALERT_FORMAT`): `slack` {"text"}, `discord` {"content"},
`telegram` {"chat_id", "text"} (chat id from `TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID`), `json`
{"kind", "text", "summary", "job", "details"}. The URL (`TUNEHARNESS_ALERT_WEBHOOK_URL`) often
carries a token: it is never logged nor stored; messages name only its host.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.db import read_connection, write_transaction
from app.errors import SettingsError, TuneharnessError

__all__ = [
    "ALERT_FORMATS",
    "ALERT_KINDS",
    "Alert",
    "AlertNotDelivered",
    "AlertOutboxRow",
    "AlertSender",
    "InMemoryNotifier",
    "Notifier",
    "OutboxNotifier",
    "WebhookConfig",
    "WebhookNotifier",
    "render_payload",
    "webhook_config_from_env",
]

log = logging.getLogger("tuneharness.alerts")

ALERT_KINDS: frozenset[str] = frozenset(
    {
        "host_lost",
        "running_again",
        "budget_warning",
        "budget_stop",
        "idle_stopped",
        "ttl_stopped",
        "orphan_stopped",
        "gate_refused",
        "beat_overdue",
        "sweep_failed",
        "price_increase",
        "task_poisoned",
        "job_cancelled",
        "job_blocked",
        "provider_skipped",
    }
)
AlertFormat = Literal["slack", "discord", "telegram", "json"]
ALERT_FORMATS: tuple[AlertFormat, ...] = ("slack", "discord", "telegram", "json")
OUTBOX_LOCK = "tuneharness.alert_outbox"
DISCORD_MAX_CHARS = 2000


class AlertNotDelivered(TuneharnessError):
    """A sender could not deliver an alert; the message holds no secret (no webhook URL)."""


@dataclass(frozen=True, slots=True)
class Alert:
    """Something a person should know now. `key` makes it once-only (e.g. per trial, per host)."""

    kind: str
    summary: str
    job: str | None = None
    details: Mapping[str, str | int | float | bool | None] = field(default_factory=dict)
    key: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {self.kind!r}; known: {', '.join(sorted(ALERT_KINDS))}")

    @property
    def text(self) -> str:
        head = f"[tuneharness] {self.kind}: {self.summary}"
        if self.job:
            head += f" (job {self.job})"
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.details.items()))
        return f"{head} [{extra}]" if extra else head


@runtime_checkable
class Notifier(Protocol):
    """The port: tell a person. Never raises, never blocks a money action on the network."""

    def notify(self, alert: Alert) -> None: ...


@runtime_checkable
class AlertSender(Protocol):
    """A transport: deliver one alert now or raise `AlertNotDelivered`."""

    def send(self, alert: Alert) -> None: ...


class InMemoryNotifier:
    """The fake: keeps what it was told. With `fail=True` its `send` refuses (tests the outbox)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.alerts: list[Alert] = []
        self.fail = fail
        self._lock = threading.Lock()

    def notify(self, alert: Alert) -> None:
        with self._lock:
            self.alerts.append(alert)

    def send(self, alert: Alert) -> None:
        if self.fail:
            raise AlertNotDelivered("in-memory notifier set to fail")
        self.notify(alert)

    def kinds(self) -> list[str]:
        with self._lock:
            return [a.kind for a in self.alerts]


# --- webhook ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    url: str = field(repr=False)
    format: AlertFormat = "slack"
    telegram_chat_id: str | None = None
    timeout_s: float = 3.0

    @property
    def host(self) -> str:
        """The only part of the URL that may appear in logs."""
        return urlsplit(self.url).hostname or "?"


def webhook_config_from_env(env: Mapping[str, str]) -> WebhookConfig | None:
    """The webhook named by TUNEHARNESS_ALERT_*; None when no URL is set."""
    url = env.get("TUNEHARNESS_ALERT_WEBHOOK_URL") or ""
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(
            "TUNEHARNESS_ALERT_WEBHOOK_URL",
            "not an http(s) URL",
            "set the webhook URL your chat service gave you, e.g. https://hooks.slack.com/services/...",
        )
    raw_format = (env.get("TUNEHARNESS_ALERT_FORMAT") or "slack").lower()
    if raw_format not in ALERT_FORMATS:
        raise SettingsError(
            "TUNEHARNESS_ALERT_FORMAT", f"unknown format {raw_format!r}", f"use one of {', '.join(ALERT_FORMATS)}"
        )
    fmt = next(f for f in ALERT_FORMATS if f == raw_format)
    chat_id = env.get("TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID") or None
    if fmt == "telegram" and not chat_id:
        raise SettingsError(
            "TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID",
            "the telegram format needs a chat id",
            "set it to the chat's numeric id (or @channel name)",
        )
    raw_timeout = env.get("TUNEHARNESS_ALERT_TIMEOUT_S") or "3"
    try:
        timeout_s = float(raw_timeout)
    except ValueError:
        timeout_s = -1.0
    if not 0 < timeout_s <= 30:
        raise SettingsError(
            "TUNEHARNESS_ALERT_TIMEOUT_S", f"{raw_timeout!r} is not a timeout", "use seconds from 0.1 to 30"
        )
    return WebhookConfig(url=url, format=fmt, telegram_chat_id=chat_id, timeout_s=timeout_s)


def render_payload(alert: Alert, fmt: AlertFormat, *, telegram_chat_id: str | None = None) -> dict[str, Any]:
    """The JSON body for a chat service's incoming webhook."""
    if fmt == "slack":
        return {"text": alert.text}
    if fmt == "discord":
        return {"content": alert.text[:DISCORD_MAX_CHARS]}
    if fmt == "telegram":
        return {"chat_id": telegram_chat_id, "text": alert.text}
    return {
        "kind": alert.kind,
        "text": alert.text,
        "summary": alert.summary,
        "job": alert.job,
        "details": dict(alert.details),
    }


class WebhookNotifier:
    """Sender: JSON POST to a chat webhook with short timeouts; errors name only the host."""

    def __init__(self, config: WebhookConfig) -> None:
        self.config = config

    def send(self, alert: Alert) -> None:
        import httpx

        body = render_payload(alert, self.config.format, telegram_chat_id=self.config.telegram_chat_id)
        timeout = httpx.Timeout(self.config.timeout_s, connect=min(self.config.timeout_s, 2.0))
        try:
            response = httpx.post(self.config.url, json=body, timeout=timeout)
        except httpx.HTTPError as exc:
            # httpx messages may quote the URL (and its token): keep only the exception's type.
            raise AlertNotDelivered(f"webhook at {self.config.host}: {type(exc).__name__}") from None
        if response.status_code >= 300:
            raise AlertNotDelivered(f"webhook at {self.config.host} answered HTTP {response.status_code}")

    def notify(self, alert: Alert) -> None:
        """Send now; on failure log one line (without the URL) and carry on."""
        try:
            self.send(alert)
        except AlertNotDelivered as exc:
            log.warning("alert %s not delivered: %s", alert.kind, exc)


# --- outbox ----------------------------------------------------------------------------------


class AlertOutboxRow(SQLModel, table=True):
    """Every alert raised, until and after delivery. `delivered_at` empty = still owed."""

    __tablename__ = "alert_outbox"

    id: str = Field(primary_key=True)
    key: str = Field(unique=True)
    created_at: str = Field(index=True)
    kind: str = Field(index=True)
    summary: str
    job: str | None = None
    details: str = "{}"
    attempts: int = 0
    last_error: str | None = None
    next_attempt_at: str = Field(index=True)
    claimed_until: str | None = None
    delivered_at: str | None = Field(default=None, index=True)


_OUTBOX = AlertOutboxRow.__table__  # type: ignore[attr-defined]


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _row_to_alert(r: Any) -> Alert:
    return Alert(kind=r.kind, summary=r.summary, job=r.job, details=json.loads(r.details), key=r.key)


class OutboxNotifier:
    """The production Notifier: record durably, deliver in the background, retry with backoff.

    `sender` None means no webhook is configured: alerts are kept in the outbox (owed) until
    one is. `background=False` delivers inline (still never raising) for callers with no
    deadline, e.g. a CLI that is about to exit.
    """

    def __init__(
        self,
        engine: Engine,
        sender: AlertSender | None,
        *,
        background: bool = True,
        claim_s: float = 60.0,
        backoff_base_s: float = 30.0,
        backoff_max_s: float = 3600.0,
        batch: int = 20,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.engine = engine
        self.sender = sender
        self.background = background
        self.claim_s = claim_s
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.batch = batch
        self._now = now
        self._threads: list[threading.Thread] = []
        self._threads_lock = threading.Lock()

    # The port.
    def notify(self, alert: Alert) -> None:
        try:
            row_id = self._record(alert)
        except Exception as exc:  # the database is down: still try to tell someone
            log.warning("alert %s not recorded in the outbox: %s", alert.kind, type(exc).__name__)
            self._send_unrecorded(alert)
            return
        if row_id is None:
            return  # this key was raised before
        if self.background:
            t = threading.Thread(target=self._deliver_ids, args=([row_id],), name="alert-delivery", daemon=True)
            with self._threads_lock:
                self._threads.append(t)
            t.start()
        else:
            self._deliver_ids([row_id])

    def drain(self, *, timeout_s: float = 5.0) -> None:
        """Wait (at most `timeout_s`) for background deliveries started by this notifier."""
        with self._threads_lock:
            threads, self._threads = self._threads, []
        deadline = datetime.now(UTC) + timedelta(seconds=timeout_s)
        for t in threads:
            t.join(max(0.0, (deadline - datetime.now(UTC)).total_seconds()))

    def flush(self, *, include_not_due: bool = False) -> int:
        """Deliver owed alerts whose retry time has come (or all owed ones); return how many."""
        try:
            ids = self._claim_due(include_not_due=include_not_due)
        except Exception as exc:
            log.warning("alert outbox unreadable: %s", type(exc).__name__)
            return 0
        return self._deliver_ids(ids, chain=False)

    def pending(self) -> list[AlertOutboxRow]:
        """Alerts still owed, oldest first."""
        with read_connection(self.engine) as conn:
            rows = conn.execute(
                select(_OUTBOX).where(_OUTBOX.c.delivered_at.is_(None)).order_by(_OUTBOX.c.created_at, _OUTBOX.c.id)
            ).all()
        return [AlertOutboxRow(**r._mapping) for r in rows]

    def recorded(self) -> list[AlertOutboxRow]:
        """Every alert in the outbox, delivered or not, oldest first."""
        with read_connection(self.engine) as conn:
            rows = conn.execute(select(_OUTBOX).order_by(_OUTBOX.c.created_at, _OUTBOX.c.id)).all()
        return [AlertOutboxRow(**r._mapping) for r in rows]

    # Internals.
    def _record(self, alert: Alert) -> str | None:
        now = self._now()
        row_id = uuid.uuid4().hex
        key = alert.key or f"auto:{row_id}"
        with write_transaction(self.engine, lock=OUTBOX_LOCK) as conn:
            if conn.execute(select(_OUTBOX.c.id).where(_OUTBOX.c.key == key)).first() is not None:
                return None
            conn.execute(
                _OUTBOX.insert().values(
                    id=row_id,
                    key=key,
                    created_at=_iso(now),
                    kind=alert.kind,
                    summary=alert.summary,
                    job=alert.job,
                    details=json.dumps(dict(alert.details), sort_keys=True, default=str),
                    attempts=0,
                    next_attempt_at=_iso(now),
                    # the new row is claimed by this notifier's own delivery attempt
                    claimed_until=_iso(now + timedelta(seconds=self.claim_s)),
                )
            )
        return row_id

    def _send_unrecorded(self, alert: Alert) -> None:
        if self.sender is None:
            return
        try:
            self.sender.send(alert)
        except Exception as exc:
            log.warning("alert %s lost: not recorded and not delivered (%s)", alert.kind, exc)

    def _claim_due(self, *, include_not_due: bool) -> list[str]:
        now = self._now()
        now_s = _iso(now)
        with write_transaction(self.engine, lock=OUTBOX_LOCK) as conn:
            q = select(_OUTBOX.c.id).where(_OUTBOX.c.delivered_at.is_(None))
            q = q.where((_OUTBOX.c.claimed_until.is_(None)) | (_OUTBOX.c.claimed_until < now_s))
            if not include_not_due:
                q = q.where(_OUTBOX.c.next_attempt_at <= now_s)
            ids = [r.id for r in conn.execute(q.order_by(_OUTBOX.c.created_at, _OUTBOX.c.id).limit(self.batch))]
            if ids:
                conn.execute(
                    _OUTBOX.update()
                    .where(_OUTBOX.c.id.in_(ids))
                    .values(claimed_until=_iso(now + timedelta(seconds=self.claim_s)))
                )
        return ids

    def _deliver_ids(self, ids: list[str], *, chain: bool = True) -> int:
        """Deliver claimed rows; after a success, also flush what else is owed (once)."""
        delivered = 0
        try:
            for row_id in ids:
                with read_connection(self.engine) as conn:
                    r = conn.execute(select(_OUTBOX).where(_OUTBOX.c.id == row_id)).first()
                if r is None or r.delivered_at is not None:
                    continue
                error = self._try_send(_row_to_alert(r))
                self._settle(row_id, attempts=r.attempts + 1, error=error)
                if error is None:
                    delivered += 1
            if chain and delivered:
                delivered += self.flush(include_not_due=True)
        except Exception as exc:  # never let a background thread or a caller see this
            log.warning("alert outbox delivery stopped: %s", type(exc).__name__)
        return delivered

    def _try_send(self, alert: Alert) -> str | None:
        if self.sender is None:
            return "no webhook configured (set TUNEHARNESS_ALERT_WEBHOOK_URL)"
        try:
            self.sender.send(alert)
        except AlertNotDelivered as exc:
            log.warning("alert %s not delivered, kept in the outbox: %s", alert.kind, exc)
            return str(exc)
        except Exception as exc:
            log.warning("alert %s not delivered, kept in the outbox: %s", alert.kind, type(exc).__name__)
            return type(exc).__name__
        return None

    def _settle(self, row_id: str, *, attempts: int, error: str | None) -> None:
        now = self._now()
        values: dict[str, Any] = {"attempts": attempts, "claimed_until": None}
        if error is None:
            values.update(delivered_at=_iso(now), last_error=None)
        else:
            wait_s = min(self.backoff_base_s * 2 ** min(attempts - 1, 20), self.backoff_max_s)
            values.update(last_error=error[:500], next_attempt_at=_iso(now + timedelta(seconds=wait_s)))
        with write_transaction(self.engine, lock=OUTBOX_LOCK) as conn:
            conn.execute(_OUTBOX.update().where(_OUTBOX.c.id == row_id).values(**values))
