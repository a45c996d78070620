"""Escalation to an OpenAI-compatible chat endpoint, inside a daily spend cap.

Configuration (read once, validated, errors name the variable):

| variable | meaning | default |
|---|---|---|
| `TUNEHARNESS_LLM_URL` | base URL; requests go to `<url>/chat/completions` | unset: no escalation |
| `TUNEHARNESS_LLM_KEY` | bearer token; never logged, never in the ledger | none |
| `TUNEHARNESS_LLM_MODEL` | model name sent in the request | `gpt-4o-mini` |
| `TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK` | price of a million prompt tokens | `0.15` |
| `TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK` | price of a million completion tokens | `0.60` |
| `TUNEHARNESS_LLM_DAILY_CAP_USD` | spend cap per UTC day, all processes together (from the ledger) | `1.00` |
| `TUNEHARNESS_LLM_TIMEOUT_S` | request timeout | `20` |

Before each call the worst-case cost (prompt estimate + `max_tokens`) must fit under the cap;
after it, the real cost from the response's `usage` is appended to the ledger as a
`triage.llm_call` event. At the cap the client refuses without calling.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from app.errors import SettingsError
from app.triage.rules import STATES

if TYPE_CHECKING:
    from app.ledger import Ledger

__all__ = ["LLM_EVENT", "EscalationResult", "LlmConfig", "LlmEscalation", "parse_state"]

LLM_EVENT = "triage.llm_call"

_SYSTEM = (
    "You triage the tail of a machine-learning training log. Answer with exactly one JSON object "
    '{"state": S, "reason": R} where S is one of: ' + ", ".join(STATES) + ". "
    "progressing: training advances (warnings allowed). completed: finished successfully. "
    "oom: GPU or host out of memory, including the kernel OOM killer. diverged: NaN/inf loss or "
    "grad norm, loss-scale underflow, exploding loss. cuda_fault: driver/runtime mismatch, no "
    "device, illegal memory access, Xid/ECC, NCCL errors. data_error: dataset, tokenizer, template, "
    "schema or config errors. io_error: disk full, checkpoint write failed, download or network "
    "failures. stalled: collective/watchdog/rendezvous timeouts or a log that stopped growing. "
    "The deciding line is often not the last one: launchers print wrapper tracebacks after the "
    "real error."
)


@dataclass(frozen=True, slots=True)
class LlmConfig:
    url: str
    key: str | None = None
    model: str = "gpt-4o-mini"
    price_in_usd_per_mtok: float = 0.15
    price_out_usd_per_mtok: float = 0.60
    daily_cap_usd: float = 1.0
    timeout_s: float = 20.0
    max_tokens: int = 60

    def __repr__(self) -> str:  # the key never appears in a repr, a log or a traceback
        return f"LlmConfig(url={self.url!r}, model={self.model!r}, daily_cap_usd={self.daily_cap_usd})"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LlmConfig | None:
        """The configuration, or None when no endpoint is configured."""
        url = (env.get("TUNEHARNESS_LLM_URL") or "").strip()
        if not url:
            return None
        if not re.match(r"^https?://[^/\s]+", url):
            raise SettingsError(
                "TUNEHARNESS_LLM_URL",
                f"{url!r} is not an http(s) URL",
                "set it to the API base, e.g. https://api.openai.com/v1",
            )

        def num(name: str, default: float) -> float:
            raw = env.get(name)
            if raw is None or raw == "":
                return default
            try:
                value = float(raw)
            except ValueError:
                raise SettingsError(name, f"{raw!r} is not a number", "set a number, e.g. 0.5") from None
            if not value >= 0 or value == float("inf"):
                raise SettingsError(name, f"{raw!r} must be a finite number >= 0", "set a number, e.g. 0.5")
            return value

        return cls(
            url=url.rstrip("/"),
            key=env.get("TUNEHARNESS_LLM_KEY") or None,
            model=env.get("TUNEHARNESS_LLM_MODEL") or "gpt-4o-mini",
            price_in_usd_per_mtok=num("TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK", 0.15),
            price_out_usd_per_mtok=num("TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK", 0.60),
            daily_cap_usd=num("TUNEHARNESS_LLM_DAILY_CAP_USD", 1.0),
            timeout_s=num("TUNEHARNESS_LLM_TIMEOUT_S", 20.0) or 20.0,
        )

    def cost_usd(self, *, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_in_usd_per_mtok + completion_tokens * self.price_out_usd_per_mtok) / 1e6


@dataclass(frozen=True, slots=True)
class EscalationResult:
    """What the escalation stage returned; `state` is None when it declined or failed."""

    state: str | None
    reason: str
    cost_usd: float = 0.0


def parse_state(content: str) -> str | None:
    """One of the 8 states from a model's answer (JSON first, then the first state named)."""
    text = content.strip()
    m = re.search(r"\{.*\}", text, re.DOTALL)
    if m:
        try:
            obj = json.loads(m.group(0))
            state = str(obj.get("state", "")).strip().lower() if isinstance(obj, dict) else ""
            if state in STATES:
                return state
        except ValueError:
            pass
    low = text.lower()
    found = [(low.find(s), s) for s in STATES if re.search(rf"\b{s}\b", low)]
    return min(found)[1] if found else None


def _utc_day_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


class LlmEscalation:
    """Ask the endpoint for a state, within the daily cap; every call is a ledger event."""

    def __init__(self, config: LlmConfig, ledger: Ledger, *, now: Any = None) -> None:
        self.config = config
        self.ledger = ledger
        self._now = now or (lambda: datetime.now(UTC))

    def spent_today_usd(self) -> float:
        since = _utc_day_start(self._now())
        rows = self.ledger.rows(kind=LLM_EVENT, since=since)
        return sum(r.amount_usd or 0.0 for r in rows)

    def _worst_case_usd(self, prompt: str) -> float:
        prompt_tokens = (len(_SYSTEM) + len(prompt)) // 3 + 20
        return self.config.cost_usd(prompt_tokens=prompt_tokens, completion_tokens=self.config.max_tokens)

    def ask(self, prompt: str, *, row_id: str = "", job: str | None = None) -> EscalationResult:
        """The model's state for `prompt` (a log digest), or state None with the reason why not."""
        import httpx

        spent = self.spent_today_usd()
        worst = self._worst_case_usd(prompt)
        if spent + worst > self.config.daily_cap_usd:
            return EscalationResult(
                None, f"daily LLM cap reached: ${spent:.4f} of ${self.config.daily_cap_usd:.2f} spent"
            )
        headers = {"Content-Type": "application/json"}
        if self.config.key:
            headers["Authorization"] = f"Bearer {self.config.key}"
        body = {
            "model": self.config.model,
            "temperature": 0,
            "max_tokens": self.config.max_tokens,
            "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}],
        }
        try:
            resp = httpx.post(
                f"{self.config.url}/chat/completions", json=body, headers=headers, timeout=self.config.timeout_s
            )
        except httpx.HTTPError as exc:
            return EscalationResult(None, f"LLM endpoint unreachable: {type(exc).__name__}")
        if resp.status_code != 200:
            return EscalationResult(None, f"LLM endpoint answered HTTP {resp.status_code}")
        try:
            data = resp.json()
            content = str(data["choices"][0]["message"]["content"])
            usage = data.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", 0))
            completion_tokens = int(usage.get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError):
            return EscalationResult(None, "LLM endpoint returned a malformed answer")
        if prompt_tokens == 0 and completion_tokens == 0:
            # No usage reported: charge the worst case rather than nothing.
            cost = worst
        else:
            cost = self.config.cost_usd(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens)
        state = parse_state(content)
        from app.ledger import Event

        self.ledger.append(
            Event(
                kind=LLM_EVENT,
                job=job,
                provider="llm",
                amount_usd=cost,
                reason=f"triage escalation{' of ' + row_id if row_id else ''}",
                payload={
                    "model": self.config.model,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "state": state,
                    "row": row_id,
                },
            )
        )
        if state is None:
            return EscalationResult(None, "LLM answer named no known state", cost)
        return EscalationResult(state, "llm", cost)
