"""train.log triage: rules first, then the specialist model, then a capped escalation LLM.

`app.triage.rules` is pure and stdlib-only; `app.triage.chain` composes the three stages.
"""

from __future__ import annotations

from app.triage.rules import ACTIONS, STATES, UNSURE, Verdict, classify, read_tail, read_tail_bytes

__all__ = ["ACTIONS", "STATES", "UNSURE", "Verdict", "classify", "read_tail", "read_tail_bytes"]
