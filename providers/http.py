"""Shared HTTP plumbing for the vendor adapters: one httpx client, bounded jittered retries,
and the translation of failed responses into `app.market` errors.

An adapter hands every response to its own `translate` function, which returns `None` (success)
or a `Failure` naming the error class and the vendor's message. `ProviderBusy` failures (429,
502, 503, 504, unreachable) are retried here with full-jitter exponential backoff, a bounded
number of times, never sooner than a `Retry-After` the vendor asked for; everything else is
raised at once. A call that is not idempotent (a create)
is retried only when the vendor cannot have acted on it (429, 503, connection refused): after a
read timeout, a dropped connection or another 5xx the instance may exist, and the call raises
`CreateUnconfirmed` (never a plain refusal) so the caller keeps its intent and looks for the
instance by its label.

The API key never leaves this module: it is sent only as a Bearer header, kept out of `repr`,
and scrubbed from every message. Vendor exceptions are raised `from None`, so no httpx request
(headers included) rides along in a traceback.

Test mode: `set_testing(True)` (or `TUNEHARNESS_PROVIDER_BACKOFF_S=0`) zeroes every backoff
while keeping the number of tries, so tests exercise the retry path without sleeping.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from app.errors import SettingsError
from app.market import CreateUnconfirmed, MarketError, ProviderBusy

__all__ = [
    "RETRYABLE_STATUS",
    "Failure",
    "RetryPolicy",
    "Translate",
    "VendorClient",
    "api_settings",
    "backoff_s",
    "body_json",
    "body_text",
    "is_testing",
    "redact",
    "set_testing",
]

log = logging.getLogger(__name__)

RETRYABLE_STATUS = frozenset({429, 502, 503, 504})
# Statuses after which the vendor cannot have carried out the request: safe to retry a create.
_NOT_ACTED_STATUS = frozenset({429, 503})
_MAX_MESSAGE_CHARS = 300

_testing = False


def set_testing(enabled: bool) -> None:
    """Zero every backoff (tries stay the same); for tests and the demo."""
    global _testing
    _testing = enabled


def is_testing() -> bool:
    return _testing


def backoff_s(*, attempt: int, base_s: float, cap_s: float, jitter: float) -> float:
    """Full-jitter exponential backoff: `jitter` (in [0, 1]) times min(cap, base * 2**attempt)."""
    if attempt < 0 or not 0.0 <= jitter <= 1.0:
        raise ValueError("attempt must be >= 0 and jitter in [0, 1]")
    return jitter * min(cap_s, base_s * (2.0**attempt))


def redact(text: str, secret: str) -> str:
    """`text` with `secret` replaced by `***` and cut to a readable length."""
    if secret:
        text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= _MAX_MESSAGE_CHARS else text[: _MAX_MESSAGE_CHARS - 1] + "…"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How hard to try one vendor call. `attempts` counts the first try."""

    attempts: int = 5
    base_s: float = 0.5
    cap_s: float = 8.0
    timeout_s: float = 30.0
    # All tries of one call end within this (plus the last try's own timeout), so the retries of a
    # vendor call always fit inside the task that makes it (the provision task's 120 s soft limit).
    budget_s: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """Read TUNEHARNESS_PROVIDER_RETRIES / _BACKOFF_S / _TIMEOUT_S; unset means default."""
        env = os.environ if env is None else env
        default = cls()
        attempts = _number(env, "TUNEHARNESS_PROVIDER_RETRIES", default.attempts, integer=True)
        base_s = _number(env, "TUNEHARNESS_PROVIDER_BACKOFF_S", default.base_s)
        timeout_s = _number(env, "TUNEHARNESS_PROVIDER_TIMEOUT_S", default.timeout_s)
        if attempts < 1:
            raise SettingsError("TUNEHARNESS_PROVIDER_RETRIES", f"{attempts} tries is none", "set 1 or more")
        if timeout_s <= 0:
            raise SettingsError("TUNEHARNESS_PROVIDER_TIMEOUT_S", "must be positive", "set seconds, e.g. 30")
        return cls(attempts=int(attempts), base_s=base_s, cap_s=max(default.cap_s, base_s), timeout_s=timeout_s)


def _number(env: Mapping[str, str], name: str, default: float, *, integer: bool = False) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SettingsError(name, f"{raw!r} is not {kind}", f"set {kind} or unset it") from None
    if value < 0:
        raise SettingsError(name, f"{raw!r} is negative", "set 0 or more")
    return value


@dataclass(frozen=True, slots=True)
class Failure:
    """What went wrong with one response, as the adapter's `translate` judged it."""

    error: type[MarketError]
    message: str
    retry_after_s: float | None = None  # the vendor's Retry-After: wait at least this before the next try


Translate = Callable[[httpx.Response], Failure | None]


def _jitter() -> float:
    return random.random()  # backoff jitter, not cryptography


class VendorClient:
    """One vendor's HTTP endpoint with Bearer auth, bounded retries and error translation."""

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        api_key: str,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        jitter: Callable[[], float] = _jitter,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.provider = provider
        self._monotonic = monotonic
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._key = api_key
        self._sleep = sleep
        self._jitter = jitter
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {api_key}",
                "Accept": "application/json",
                "User-Agent": "tuneharness",
            },
            timeout=httpx.Timeout(self.retry.timeout_s, connect=min(10.0, self.retry.timeout_s)),
            follow_redirects=False,
        )

    def __repr__(self) -> str:
        return f"VendorClient(provider={self.provider!r}, base_url={self.base_url!r}, api_key=<redacted>)"

    def close(self) -> None:
        self._http.close()

    def redact(self, text: str) -> str:
        return redact(text, self._key)

    def request(
        self,
        method: str,
        path: str,
        *,
        translate: Translate,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotent: bool = True,
    ) -> httpx.Response:
        """Send one call, retrying transient failures; return the successful response.

        Raises the `MarketError` subclass `translate` chose, with the vendor's (redacted) message.
        """
        attempts = self.retry.attempts
        started = self._monotonic()
        for attempt in range(attempts):
            status: int | None = None
            try:
                response = self._http.request(method, path, json=json, params=params)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = Failure(ProviderBusy, f"cannot reach {self.base_url}: {type(exc).__name__}")
                may_retry = True
            except httpx.TimeoutException as exc:
                failure = Failure(ProviderBusy, f"{method} {path} timed out ({type(exc).__name__})")
                may_retry = idempotent
            except httpx.HTTPError as exc:
                failure = Failure(ProviderBusy, f"{method} {path} failed in transport ({type(exc).__name__})")
                may_retry = idempotent
            else:
                status = response.status_code
                judged = translate(response)
                if judged is None:
                    return response
                failure = judged
                may_retry = failure.error is ProviderBusy and (idempotent or status in _NOT_ACTED_STATUS)
            delay = (
                0.0
                if _testing
                else max(
                    backoff_s(attempt=attempt, base_s=self.retry.base_s, cap_s=self.retry.cap_s, jitter=self._jitter()),
                    failure.retry_after_s or 0.0,
                )
            )
            out_of_time = self._monotonic() - started + delay >= self.retry.budget_s
            last = attempt == attempts - 1 or out_of_time
            if not idempotent and failure.error is ProviderBusy and not may_retry:
                # sent, and maybe acted on: not a refusal (a create must not be abandoned and sent again)
                raise CreateUnconfirmed(
                    self.redact(failure.message) + " (the vendor may have acted on it)",
                    provider=self.provider,
                    status_code=status,
                ) from None
            if failure.error is not ProviderBusy or not may_retry or last:
                message = self.redact(failure.message)
                if failure.error is ProviderBusy:
                    tries = f"{attempt + 1} {'try' if attempt == 0 else 'tries'}"
                    message += f" (gave up after {tries}; wait and run it again)"
                raise failure.error(message, provider=self.provider, status_code=status) from None
            log.warning(
                "%s %s %s: %s; retry %d of %d in %.2fs",
                self.provider,
                method,
                path,
                self.redact(failure.message),
                attempt + 1,
                attempts - 1,
                delay,
            )
            if delay > 0:
                self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover


def body_text(response: httpx.Response) -> str:
    """The response body as text, whatever its content type claims."""
    try:
        return response.text
    except (UnicodeDecodeError, LookupError):
        return response.content.decode("utf-8", "replace")


def body_json(response: httpx.Response) -> Any:
    """The body as JSON, or None when it is not JSON (vendors answer some errors in plain text)."""
    try:
        return response.json()
    except ValueError:
        return None


def api_settings(
    env: Mapping[str, str] | None, *, key_var: str, url_var: str, default_url: str, key_fix: str
) -> tuple[str, str]:
    """(api_key, api_url) from the environment, validated; errors name the variable and the fix."""
    env = os.environ if env is None else env
    key = (env.get(key_var) or "").strip()
    if not key:
        raise SettingsError(key_var, "is not set", key_fix)
    url = (env.get(url_var) or "").strip() or default_url
    try:
        parts = httpx.URL(url) if "://" in url else None
    except httpx.InvalidURL:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.host:
        raise SettingsError(url_var, f"{url!r} is not an http(s) URL", f"unset it to use {default_url}")
    return key, url
