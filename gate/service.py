"""The gate's handlers: judge a trial directory and record it; read the history back.

Judging loads the trial (`gate.trial`), applies the pure rules (`app.policy.gate_rules`),
appends one `gate_decision` ledger event and, on refusal, raises the `gate_refused` alert.

Re-judging the same trial (same files, same hash) records nothing new: the event's idempotency
key is `gate_decision:<trial hash>:<decision>` and the alert's key is `gate_refused:<trial hash>`.
Should the rules ever decide differently on the same files (a new gate version), that decision
gets its own event.

What is in production is derived from the ledger only: for each model, the latest trial whose
decision was `promote`. Nothing else puts a model there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.alerts import Alert, Notifier
from app.ledger import Event, Ledger, LedgerRow
from app.policy.gate_rules import HELDOUT, Verdict, judge
from gate.evaluate import build_trial
from gate.trial import LoadedTrial, load_trial

__all__ = ["GATE_EVENT", "GateService", "History", "HistoryEntry", "Judgement", "render_markdown"]

GATE_EVENT = "gate_decision"


@dataclass(frozen=True, slots=True)
class Judgement:
    """A verdict on a loaded trial, and where the ledger recorded it."""

    loaded: LoadedTrial
    verdict: Verdict
    ledger_seq: int
    recorded_now: bool

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict.promoted else 1

    def write_decision(self) -> Path:
        """decision.json in the trial directory: the judgement as `gate judge --json` prints it."""
        path = self.loaded.path / "decision.json"
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    def as_dict(self) -> dict[str, Any]:
        out = self.verdict.as_dict()
        out["trial"] = {
            "path": str(self.loaded.path),
            "hash": self.loaded.trial_hash,
            "files": list(self.loaded.files),
            "model": self.loaded.meta.model,
            "task": self.loaded.meta.task,
            "baseline_name": self.loaded.meta.baseline_name,
        }
        out["ledger"] = {"seq": self.ledger_seq, "recorded_now": self.recorded_now}
        return out


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One recorded gate decision, as the ledger holds it."""

    seq: int
    at: str
    model: str
    task: str | None
    baseline_name: str | None
    decision: str
    reasons: tuple[str, ...]
    warnings: tuple[str, ...]
    trial_hash: str
    trial_path: str
    metric: str
    worst_heldout: float | None
    baseline_heldout: float | None
    incumbent_heldout: float | None
    ood: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": self.at,
            "model": self.model,
            "task": self.task,
            "baseline_name": self.baseline_name,
            "decision": self.decision,
            "reasons": list(self.reasons),
            "warnings": list(self.warnings),
            "trial_hash": self.trial_hash,
            "trial_path": self.trial_path,
            "metric": self.metric,
            "worst_heldout": self.worst_heldout,
            "baseline_heldout": self.baseline_heldout,
            "incumbent_heldout": self.incumbent_heldout,
            "ood": dict(self.ood),
        }

    @classmethod
    def from_row(cls, row: LedgerRow) -> HistoryEntry:
        p = row.payload
        scores = p.get("scores", {})
        return cls(
            seq=row.seq,
            at=row.at,
            model=str(p.get("model", "?")),
            task=p.get("task"),
            baseline_name=p.get("baseline_name"),
            decision=str(p.get("decision", "?")),
            reasons=tuple(r["code"] for r in p.get("reasons", [])),
            warnings=tuple(w["code"] for w in p.get("warnings", [])),
            trial_hash=str(p.get("trial_hash", "")),
            trial_path=str(p.get("trial_path", "")),
            metric=str(scores.get("metric", "?")),
            worst_heldout=scores.get("candidate", {}).get("worst", {}).get(HELDOUT),
            baseline_heldout=(scores.get("baseline") or {}).get(HELDOUT),
            incumbent_heldout=(scores.get("incumbent") or {}).get(HELDOUT),
            ood=scores.get("ood", {}),
        )


@dataclass(frozen=True, slots=True)
class History:
    """Every gate decision in ledger order, and per model the promoted trial now in production."""

    entries: tuple[HistoryEntry, ...]
    production: Mapping[str, HistoryEntry]

    def latest_by_model(self) -> dict[str, HistoryEntry]:
        latest: dict[str, HistoryEntry] = {}
        for e in self.entries:
            latest[e.model] = e
        return latest

    def as_dict(self) -> dict[str, Any]:
        return {
            "trials": [e.as_dict() for e in self.entries],
            "production": {m: e.as_dict() for m, e in sorted(self.production.items())},
        }


class GateService:
    """Judge trials and read the gate's history through the ledger and notifier ports."""

    def __init__(self, *, ledger: Ledger, notifier: Notifier) -> None:
        self.ledger = ledger
        self.notifier = notifier

    def judge(self, trial_dir: Path) -> Judgement:
        loaded = load_trial(trial_dir)
        verdict = judge(loaded.trial)
        key = f"{GATE_EVENT}:{loaded.trial_hash}:{verdict.decision}"
        before = {r.idempotency_key: r.seq for r in self.ledger.rows(kind=GATE_EVENT)}
        codes = [f.code for f in verdict.reasons]
        row = self.ledger.append(
            Event(
                kind=GATE_EVENT,
                reason=verdict.decision + (": " + ", ".join(codes) if codes else ""),
                payload={
                    "decision": verdict.decision,
                    "model": loaded.meta.model,
                    "task": loaded.meta.task,
                    "baseline_name": loaded.meta.baseline_name,
                    "trial_hash": loaded.trial_hash,
                    "trial_path": str(loaded.path),
                    "files": list(loaded.files),
                    "reasons": [f.as_dict() for f in verdict.reasons],
                    "warnings": [f.as_dict() for f in verdict.warnings],
                    "scores": dict(verdict.scores),
                },
                idempotency_key=key,
            )
        )
        if not verdict.promoted:
            self.notifier.notify(
                Alert(
                    kind="gate_refused",
                    summary=f"model {loaded.meta.model} refused by the deploy gate ({', '.join(codes)})",
                    details={"trial": loaded.trial_hash[:16]},
                    key=f"gate_refused:{loaded.trial_hash}",
                )
            )
        return Judgement(loaded=loaded, verdict=verdict, ledger_seq=row.seq, recorded_now=key not in before)

    def run(
        self,
        out: Path,
        *,
        config_path: Path,
        eval_paths: Sequence[Path],
        baseline: str,
        candidates: Sequence[str],
        incumbent: str | None = None,
        base_model: Path | None = None,
        timeout_s: float = 3600.0,
        progress: Callable[[str], None] = lambda _m: None,
        train_paths: Sequence[Path] = (),
    ) -> Judgement:
        """Evaluate predictors into a new trial directory (see `gate.evaluate.build_trial`), judge
        it, and write `decision.json` beside it (not part of the trial's hash)."""
        build_trial(
            out,
            config_path=config_path,
            eval_paths=eval_paths,
            baseline=baseline,
            candidates=candidates,
            incumbent=incumbent,
            base_model=base_model,
            timeout_s=timeout_s,
            progress=progress,
            train_paths=train_paths,
        )
        judgement = self.judge(out)
        judgement.write_decision()
        return judgement

    @staticmethod
    def markdown(history: History) -> str:
        return render_markdown(history)

    def history(self) -> History:
        entries = tuple(HistoryEntry.from_row(r) for r in self.ledger.rows(kind=GATE_EVENT))
        production: dict[str, HistoryEntry] = {}
        for e in entries:
            if e.decision == "promote":
                production[e.model] = e
        return History(entries=entries, production=production)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def render_markdown(history: History) -> str:
    """The README's table of models: one row per model, from its latest gate decision."""
    lines = [
        "| model | task | baseline | worst-seed held-out | OOD slices (worst seed / floor) | decision |",
        "|---|---|---|---|---|---|",
    ]
    for model, e in sorted(history.latest_by_model().items()):
        baseline = f"{e.baseline_name or 'baseline'} {_num(e.baseline_heldout)}"
        ood_parts = []
        for name, o in sorted(e.ood.items()):
            flag = "" if o.get("blocking", True) else " advisory"
            ood_parts.append(f"{name} {_num(o.get('worst'))} / {_num(o.get('floor'))}{flag}")
        decision = e.decision if not e.reasons else f"{e.decision}: {', '.join(e.reasons)}"
        prod = history.production.get(model)
        if prod is not None and prod.seq == e.seq:
            decision += " (in production)"
        elif prod is not None:
            decision += f" (production: trial {prod.trial_hash[:12]})"
        lines.append(
            f"| {model} | {e.task or '—'} | {baseline} | {_num(e.worst_heldout)} {e.metric} "
            f"| {'; '.join(ood_parts) or '—'} | {decision} |"
        )
    return "\n".join(lines) + "\n"
