"""GateService: judging records one ledger event per decision, refusals alert, production follows promotions."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from app.alerts import InMemoryNotifier, OutboxNotifier
from app.db import init_db, make_engine
from app.ledger import Ledger
from gate.service import GateService
from gate.trial import MalformedTrial


@pytest.fixture
def engine(sqlite_url: str) -> Engine:
    eng = make_engine(sqlite_url)
    init_db(eng)
    return eng


@pytest.fixture
def alerts() -> InMemoryNotifier:
    return InMemoryNotifier()


@pytest.fixture
def gate(engine: Engine, alerts: InMemoryNotifier) -> GateService:
    return GateService(ledger=Ledger(engine), notifier=alerts)


def test_promotion_is_one_ledger_event_with_the_trial_hash(
    gate: GateService, make_trial, alerts: InMemoryNotifier
) -> None:
    """A promoting trial appends gate_decision with decision, hash and scores, and raises no alert."""
    j = gate.judge(make_trial())
    assert j.verdict.decision == "promote" and j.exit_code == 0
    [row] = gate.ledger.rows(kind="gate_decision")
    assert row.payload["decision"] == "promote" and row.payload["trial_hash"] == j.loaded.trial_hash
    assert row.payload["reasons"] == [] and row.payload["model"] == "triage"
    assert row.payload["scores"]["candidate"]["worst"]["heldout"] == 0.75
    assert row.reason == "promote" and alerts.alerts == []


def test_refusal_records_reasons_and_raises_gate_refused(
    gate: GateService, make_trial, alerts: InMemoryNotifier
) -> None:
    """A refused trial records its reason codes and raises one gate_refused alert."""
    j = gate.judge(make_trial(seeds={"1": set(), "2": {"c1"}}))
    assert j.exit_code == 1
    [row] = gate.ledger.rows(kind="gate_decision")
    assert row.reason == "refuse: canary_failed"
    assert row.payload["reasons"][0]["code"] == "canary_failed" and "c1" in row.payload["reasons"][0]["detail"]
    assert alerts.kinds() == ["gate_refused"] and "canary_failed" in alerts.alerts[0].summary


def test_rejudging_the_same_trial_records_and_alerts_once(engine: Engine, make_trial) -> None:
    """Same files, same hash, same decision: one ledger event, one outbox alert."""
    outbox = OutboxNotifier(engine, None, background=False)
    gate = GateService(ledger=Ledger(engine), notifier=outbox)
    trial = make_trial(seeds={"1": set()})
    first, second = gate.judge(trial), gate.judge(trial)
    assert first.recorded_now and not second.recorded_now and first.ledger_seq == second.ledger_seq
    assert len(gate.ledger.rows(kind="gate_decision")) == 1
    assert [r.kind for r in outbox.recorded()] == ["gate_refused"]


def test_changed_files_are_a_new_trial(gate: GateService, make_trial) -> None:
    """Editing a prediction gives a new hash and a new event."""
    d = make_trial()
    gate.judge(d)
    (d / "candidate-seed-2.jsonl").write_text((d / "candidate-seed-1.jsonl").read_text())
    gate.judge(d)
    hashes = {r.payload["trial_hash"] for r in gate.ledger.rows(kind="gate_decision")}
    assert len(hashes) == 2


def test_malformed_trial_records_nothing(gate: GateService, make_trial, alerts: InMemoryNotifier) -> None:
    """A malformed trial raises MalformedTrial before anything is written."""
    d = make_trial()
    (d / "baseline.jsonl").write_text('{"id": "h1"}\n')
    with pytest.raises(MalformedTrial):
        gate.judge(d)
    assert gate.ledger.rows(kind="gate_decision") == [] and alerts.alerts == []


def test_production_changes_only_on_promotion(gate: GateService, make_trial) -> None:
    """A later refusal leaves production alone; a later promotion replaces it."""
    first = gate.judge(make_trial("t1"))
    gate.judge(make_trial("t2", seeds={"1": {"h1", "h2", "h3"}, "2": set()}))
    hist = gate.history()
    assert hist.production["triage"].trial_hash == first.loaded.trial_hash
    assert [e.decision for e in hist.entries] == ["promote", "refuse"]
    third = gate.judge(make_trial("t3", seeds={"1": set(), "2": set()}, incumbent_wrong={"h3"}))
    assert third.verdict.promoted
    assert gate.history().production["triage"].trial_hash == third.loaded.trial_hash
    assert gate.ledger.verify().ok


def test_models_are_kept_apart_and_named_by_dir_without_model_field(gate: GateService, make_trial) -> None:
    """Without "model" in gate.json the trial directory's name is the model's name."""
    gate.judge(make_trial("triage-v1"))
    gate.judge(make_trial("summariser", gate={"metric": "macro_f1", "min_canaries": 1}))
    prod = gate.history().production
    assert sorted(prod) == ["summariser", "triage"]


def test_markdown_table_shows_task_baseline_worst_seed_ood_and_decision(gate: GateService, make_trial) -> None:
    """The README table has one row per model with the columns the issue asks for."""
    gate.judge(make_trial("t1"))
    gate.judge(make_trial("t2", seeds={"1": set(), "2": {"o1", "o2"}}))
    md = gate.markdown(gate.history())
    header, _rule, row = md.strip().splitlines()
    assert (
        "task" in header
        and "baseline" in header
        and "worst-seed" in header
        and "OOD" in header
        and "decision" in header
    )
    assert row.startswith("| triage | train.log triage | rules 0.500 | 1.000 accuracy | forum 0.000 / 0.500")
    assert "refuse: ood_below_floor (production: trial" in row


def test_history_as_dict_is_json_ready(gate: GateService, make_trial) -> None:
    """history().as_dict() lists trials and production."""
    import json

    gate.judge(make_trial())
    data = json.loads(json.dumps(gate.history().as_dict()))
    assert data["trials"][0]["decision"] == "promote" and "triage" in data["production"]


def test_judge_output_carries_decision_reasons_warnings_scores(gate: GateService, make_trial) -> None:
    """The judgement's dict has the four fields of the interface plus trial and ledger."""
    out = gate.judge(make_trial()).as_dict()
    assert {"decision", "reasons", "warnings", "scores", "trial", "ledger"} <= set(out)
    assert set(out["scores"]["candidate"]["seeds"]) == {"1", "2"}
    assert out["scores"]["baseline"]["heldout"] == 0.5 and out["scores"]["incumbent"] is None


def test_write_decision_is_not_part_of_the_hash(gate: GateService, make_trial) -> None:
    """decision.json beside the trial does not change its hash."""
    d: Path = make_trial()
    j = gate.judge(d)
    j.write_decision()
    assert gate.judge(d).loaded.trial_hash == j.loaded.trial_hash
