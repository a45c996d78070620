"""Secrets never reach a log line, whoever logs it.

httpx logs every request's full URL at INFO (`HTTP Request: POST https://hooks.slack.com/services/
T0/B0/XXXX "HTTP/1.1 200 OK"`), and a Slack or Discord webhook's URL, or a Telegram bot's, is its
secret. `configure_logging()` (called when a worker or beat sets up its logging) turns httpx and
httpcore down to WARNING and puts `SecretScrubber` on every handler of the root logger, so that a
line naming a webhook URL, a bearer token, an `api_key=` query value or the value of any secret
setting in this process's environment is written with that part replaced by `[redacted]`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping

from app.settings_catalogue import secret_names

__all__ = ["REDACTED", "SecretScrubber", "configure_logging", "scrub"]

REDACTED = "[redacted]"

_PATTERNS = (
    # Slack incoming webhooks: /services/T.../B.../<token>
    re.compile(r"(hooks\.slack\.com/services/)[^\s\"'<>]+"),
    # Discord webhooks: /api/webhooks/<id>/<token>
    re.compile(r"(discord(?:app)?\.com/api/webhooks/)[^\s\"'<>]+"),
    # Telegram bots: /bot<token>/method
    re.compile(r"(api\.telegram\.org/bot)[^/\s\"'<>]+"),
    re.compile(r"((?:api[_-]?key|token|access_token|key)=)[^&\s\"'<>]+", re.IGNORECASE),
    re.compile(r"((?:Bearer|Basic)\s+)[A-Za-z0-9._~+/=-]{8,}"),
    # user:password@ in any URL
    re.compile(r"(://[^/\s:@]+:)[^@\s/]+(?=@)"),
)


def _secret_values(env: Mapping[str, str], names: Iterable[str]) -> tuple[str, ...]:
    # Short values would redact innocent text; a real key or webhook is long.
    return tuple(sorted({v for n in names if len(v := env.get(n, "")) >= 8}, key=len, reverse=True))


def scrub(text: str, *, secrets: Iterable[str] = ()) -> str:
    """`text` with webhook paths, tokens, passwords in URLs and the given secret values redacted."""
    for value in secrets:
        text = text.replace(value, REDACTED)
    for pat in _PATTERNS:
        text = pat.sub(lambda m: m.group(1) + REDACTED, text)
    return text


class SecretScrubber(logging.Filter):
    """A handler filter that rewrites each record's message with `scrub` (never drops a record)."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        super().__init__()
        self.secrets = _secret_values(os.environ if env is None else env, secret_names())

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is logging's problem, not ours
            return True
        clean = scrub(message, secrets=self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def configure_logging(root: logging.Logger | None = None) -> None:
    """httpx/httpcore to WARNING; a SecretScrubber on every root handler (idempotent)."""
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    root = root or logging.getLogger()
    for handler in root.handlers:
        if not any(isinstance(f, SecretScrubber) for f in handler.filters):
            handler.addFilter(SecretScrubber())
