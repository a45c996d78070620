"""The triage chain: rules -> specialist (when rules are unsure) -> capped LLM (when both are).

    chain = TriageChain(specialist=default_specialist(), escalation=LlmEscalation(cfg, ledger))
    [result] = chain.triage_many([TriageInput("job-1", log_tail, idle_seconds=40)])

Every input gets a state. When the specialist is not confident and escalation is impossible
(no endpoint, the daily cap reached, the endpoint failing), the result is the best guess so far
with `needs_operator=True`. Batches are staged: all rows through the rules, the residue through
the specialist in one call (one model load), what is still unsure through the LLM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.triage.digest import digest
from app.triage.llm import EscalationResult
from app.triage.rules import (
    DEFAULT_STALL_AFTER_S,
    STATES,
    UNSURE,
    Remedy,
    Verdict,
    action_for,
    classify,
    normalise,
    remedy_for,
)
from app.triage.specialist import Specialist, SpecialistFailed

__all__ = ["Escalation", "TriageChain", "TriageInput", "TriageResult"]


class Escalation(Protocol):
    def ask(self, prompt: str, *, row_id: str = "", job: str | None = None) -> EscalationResult: ...


@dataclass(frozen=True, slots=True)
class TriageInput:
    """One log tail: text, or bytes as read from the file (the rules read bytes without decoding
    them all; the specialist and the LLM get it decoded leniently)."""

    id: str
    log: str | bytes
    idle_seconds: float | None = None
    job: str | None = None


@dataclass(frozen=True, slots=True)
class TriageResult:
    id: str
    state: str
    stage: str  # rules | specialist | llm
    confidence: float
    action: str
    evidence: tuple[str, ...]
    needs_operator: bool = False
    notes: tuple[str, ...] = field(default=())

    @property
    def remedy(self) -> Remedy:
        """What the supervisor does about a trainer that died in this state (a named constant)."""
        return remedy_for(self.state, self.evidence)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "state": self.state,
            "stage": self.stage,
            "confidence": round(self.confidence, 4),
            "action": self.action,
            "evidence": list(self.evidence),
        }
        if self.needs_operator:
            out["needs_operator"] = True
        if self.notes:
            out["notes"] = list(self.notes)
        return out


class TriageChain:
    """Compose the three stages; thresholds are the confidence each stage needs to answer alone."""

    def __init__(
        self,
        *,
        specialist: Specialist | None = None,
        escalation: Escalation | None = None,
        rules_min_confidence: float = 0.8,
        specialist_min_confidence: float = 0.7,
        specialist_overrule_confidence: float = 0.9,
        stall_after_s: float = DEFAULT_STALL_AFTER_S,
    ) -> None:
        self.specialist = specialist
        self.escalation = escalation
        self.rules_min_confidence = rules_min_confidence
        self.specialist_min_confidence = specialist_min_confidence
        # A rules verdict that names a state (not "unsure") but below rules_min_confidence is
        # overruled only by a specialist this sure; a less sure disagreement is ambiguity: it goes
        # on to the LLM, and without one comes back as the rules' state marked needs_operator.
        self.specialist_overrule_confidence = specialist_overrule_confidence
        self.stall_after_s = stall_after_s

    def triage(
        self, log: str | bytes, *, idle_seconds: float | None = None, id: str = "log", job: str | None = None
    ) -> TriageResult:
        return self.triage_many([TriageInput(id, log, idle_seconds, job)])[0]

    def triage_many(self, rows: Sequence[TriageInput]) -> list[TriageResult]:
        verdicts = [classify(r.log, idle_seconds=r.idle_seconds, stall_after_s=self.stall_after_s) for r in rows]
        results: list[TriageResult | None] = [None] * len(rows)
        residue: list[int] = []
        for i, (row, v) in enumerate(zip(rows, verdicts, strict=True)):
            if v.sure and v.confidence >= self.rules_min_confidence:
                results[i] = TriageResult(row.id, v.state, "rules", v.confidence, v.action, v.evidence)
            else:
                residue.append(i)
        if not residue:
            return [r for r in results if r is not None]

        digests = {i: digest(_text(rows[i].log), rows[i].idle_seconds) for i in residue}
        # Best guess so far per residue row: (state, confidence, stage, evidence).
        best: dict[int, tuple[str, float, str, tuple[str, ...]]] = {
            i: (_rules_state(verdicts[i]), verdicts[i].confidence, "rules", verdicts[i].evidence) for i in residue
        }
        notes: dict[int, list[str]] = {i: [] for i in residue}
        still: list[int] = list(residue)
        if self.specialist is not None:
            try:
                scores = self.specialist.predict([digests[i] for i in residue])
            except SpecialistFailed as exc:
                scores = []
                for i in residue:
                    notes[i].append(f"specialist unavailable: {exc}")
            if len(scores) != len(residue):
                scores = []
            still = [] if scores else list(residue)
            for i, s in zip(residue, scores, strict=True) if scores else ():
                state, p = _top(s)
                if state is None:
                    still.append(i)
                    continue
                ev = (f"specialist p={p:.2f}", *verdicts[i].evidence[:2])
                v = verdicts[i]
                if v.sure and state != v.state and p < self.specialist_overrule_confidence:
                    notes[i].append(f"specialist disagreed: {state} p={p:.2f}")
                    still.append(i)
                    continue
                if p >= self.specialist_min_confidence:
                    results[i] = TriageResult(
                        rows[i].id, state, "specialist", p, action_for(state, verdicts[i].evidence), ev
                    )
                else:
                    best[i] = (state, p, "specialist", ev)
                    still.append(i)

        for i in still:
            state, conf, stage, ev = best[i]
            answer: EscalationResult | None = None
            if self.escalation is not None:
                answer = self.escalation.ask(_llm_prompt(rows[i], digests[i]), row_id=rows[i].id, job=rows[i].job)
            if answer is not None and answer.state is not None:
                results[i] = TriageResult(
                    rows[i].id,
                    answer.state,
                    "llm",
                    0.8,
                    action_for(answer.state, verdicts[i].evidence),
                    (f"llm (${answer.cost_usd:.5f})", *verdicts[i].evidence[:2]),
                    notes=tuple(notes[i]),
                )
                continue
            why = answer.reason if answer is not None else "no LLM endpoint configured (TUNEHARNESS_LLM_URL)"
            results[i] = TriageResult(
                rows[i].id, state, stage, conf, action_for(state, ev), ev, needs_operator=True, notes=(*notes[i], why)
            )
        return [r for r in results if r is not None]


_LLM_TAIL_CHARS = 3000


def _llm_prompt(row: TriageInput, digest_text: str) -> str:
    """The digest plus the raw end of the log (bounded), so the LLM sees context the digest cut."""
    tail = normalise(_text(row.log), max_chars=_LLM_TAIL_CHARS)
    idle = "unknown" if row.idle_seconds is None else f"{row.idle_seconds:.0f}"
    return f"seconds since the log last grew: {idle}\n\nsalient lines: {digest_text}\n\nlast part of the log:\n{tail}"


def _text(log: str | bytes) -> str:
    return log if isinstance(log, str) else log.decode("utf-8", errors="replace")


def _rules_state(v: Verdict) -> str:
    return v.guess if v.state == UNSURE else v.state


def _top(scores: dict[str, float]) -> tuple[str | None, float]:
    known = {k: v for k, v in scores.items() if k in STATES}
    if not known:
        return None, 0.0
    state = max(known, key=lambda k: known[k])
    return state, known[state]
