"""The triage chain: rules -> specialist -> capped LLM, against a real local fake endpoint and a real ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.errors import SettingsError
from app.ledger import Ledger
from app.triage.chain import TriageChain, TriageInput
from app.triage.fake_llm import FakeLlmServer
from app.triage.llm import LLM_EVENT, LlmConfig, LlmEscalation, parse_state
from app.triage.specialist import StaticSpecialist

REPO = Path(__file__).resolve().parents[3]
KEY = "sk-test-SECRET-abc123"
OBVIOUS_OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n"
AMBIGUOUS = "Segmentation fault (core dumped)\n"


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    eng = make_engine(f"sqlite:///{tmp_path / 'tuneharness.db'}")
    init_db(eng)
    return Ledger(eng)


@pytest.fixture
def fake() -> Iterator[FakeLlmServer]:
    with FakeLlmServer(key=KEY, answer=lambda prompt: "cuda_fault") as server:
        yield server


def _config(url: str, **kw: object) -> LlmConfig:
    env = {
        "TUNEHARNESS_LLM_URL": url,
        "TUNEHARNESS_LLM_KEY": KEY,
        "TUNEHARNESS_LLM_MODEL": "fake-1",
        "TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK": "1000",
        "TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK": "2000",
        **{k: str(v) for k, v in kw.items()},
    }
    cfg = LlmConfig.from_env(env)
    assert cfg is not None
    return cfg


def _unsure_specialist() -> StaticSpecialist:
    return StaticSpecialist(lambda _t: {"oom": 0.4, "cuda_fault": 0.35, "stalled": 0.25})


def test_confident_rules_answer_alone(fake: FakeLlmServer, ledger: Ledger) -> None:
    """An obvious OOM is decided by the rules: no specialist call, no LLM call, no ledger event."""
    spec = _unsure_specialist()
    chain = TriageChain(specialist=spec, escalation=LlmEscalation(_config(fake.url), ledger))
    res = chain.triage(OBVIOUS_OOM)
    assert (res.state, res.stage) == ("oom", "rules")
    assert spec.calls == [] and fake.requests == [] and ledger.rows() == []


def test_a_confident_specialist_answers_the_rules_residue() -> None:
    """When the rules are unsure, a specialist above its threshold decides (stage 'specialist')."""
    spec = StaticSpecialist(lambda _t: {"cuda_fault": 0.9, "oom": 0.1})
    res = TriageChain(specialist=spec).triage(AMBIGUOUS)
    assert (res.state, res.stage, res.needs_operator) == ("cuda_fault", "specialist", False)
    assert res.action == "replace the host, record it against the machine"


def test_bytes_as_read_from_a_file_reach_the_specialist_and_the_llm_decoded(
    fake: FakeLlmServer, ledger: Ledger
) -> None:
    """A log handed over as the bytes read (invalid UTF-8 in it) goes through every stage as text."""
    seen: list[str] = []
    spec = StaticSpecialist(lambda t: seen.append(t) or {"oom": 0.4, "cuda_fault": 0.35, "stalled": 0.25})
    chain = TriageChain(specialist=spec, escalation=LlmEscalation(_config(fake.url), ledger))
    res = chain.triage(b"step 10 \xff\xfe ok\n" + AMBIGUOUS.encode())
    assert (res.state, res.stage) == ("cuda_fault", "llm")
    assert "\ufffd" in seen[0] and "Segmentation fault" in seen[0]
    assert "Segmentation fault" in fake.requests[0]["messages"][-1]["content"]
    assert chain.triage(OBVIOUS_OOM.encode()).stage == "rules"


LOSS_ZERO = "".join(
    f"{{'loss': {v}, 'grad_norm': {g}, 'epoch': {e}}}\n"
    for v, g, e in (("1.2", "3.0", "0.1"), ("0.9", "2.0", "0.2"), ("0.0", "0.0", "0.3"), ("0.0", "0.0", "0.4"))
)


def test_a_weak_rules_verdict_is_overruled_only_by_a_very_sure_specialist(fake: FakeLlmServer, ledger: Ledger) -> None:
    """The rules say diverged at 0.6 (loss collapsed to 0.0): a specialist at 0.8 for another state
    is a disagreement (the LLM is asked; without one, the rules' state for an operator); at 0.95
    it overrules; agreeing at 0.8, it answers."""

    def specialist(state: str, p: float) -> StaticSpecialist:
        return StaticSpecialist(lambda _t: {state: p, "oom": 1 - p})

    res = TriageChain(specialist=specialist("progressing", 0.8)).triage(LOSS_ZERO, idle_seconds=5)
    assert (res.state, res.stage, res.needs_operator) == ("diverged", "rules", True)
    assert any("specialist disagreed: progressing p=0.80" in n for n in res.notes)
    asked = TriageChain(
        specialist=specialist("progressing", 0.8), escalation=LlmEscalation(_config(fake.url), ledger)
    ).triage(LOSS_ZERO, idle_seconds=5)
    assert (asked.state, asked.stage) == ("cuda_fault", "llm") and len(fake.requests) == 1
    sure = TriageChain(specialist=specialist("progressing", 0.95)).triage(LOSS_ZERO, idle_seconds=5)
    assert (sure.state, sure.stage, sure.needs_operator) == ("progressing", "specialist", False)
    agree = TriageChain(specialist=specialist("diverged", 0.8)).triage(LOSS_ZERO, idle_seconds=5)
    assert (agree.state, agree.stage, agree.needs_operator) == ("diverged", "specialist", False)


def test_batches_load_the_specialist_once(fake: FakeLlmServer) -> None:
    """A batch sends all residue rows to the specialist in one call (one model load)."""
    spec = StaticSpecialist(lambda _t: {"stalled": 0.95})
    rows = [TriageInput(str(i), AMBIGUOUS if i % 2 else OBVIOUS_OOM) for i in range(10)]
    out = TriageChain(specialist=spec).triage_many(rows)
    assert [r.id for r in out] == [str(i) for i in range(10)]
    assert spec.calls == [5]


def test_escalation_calls_the_endpoint_records_the_cost_and_never_the_key(fake: FakeLlmServer, ledger: Ledger) -> None:
    """An unsure specialist escalates over real HTTP; the cost lands in the ledger; the key appears nowhere in it."""
    chain = TriageChain(specialist=_unsure_specialist(), escalation=LlmEscalation(_config(fake.url), ledger))
    res = chain.triage(AMBIGUOUS, id="job-7-tail", job="job-7")
    assert (res.state, res.stage, res.needs_operator) == ("cuda_fault", "llm", False)
    assert fake.auth_headers == [f"Bearer {KEY}"]
    assert fake.requests[0]["model"] == "fake-1"
    [row] = ledger.rows(kind=LLM_EVENT)
    assert row.job == "job-7" and row.amount_usd is not None and row.amount_usd > 0
    assert row.payload["prompt_tokens"] > 0 and row.payload["state"] == "cuda_fault"
    assert KEY not in json.dumps([r.as_dict() for r in ledger.rows()])
    assert KEY not in repr(_config(fake.url))


def test_at_the_daily_cap_the_chain_returns_the_specialists_guess_for_an_operator(
    fake: FakeLlmServer, ledger: Ledger
) -> None:
    """Given a cap that one call's worst case exceeds, nothing is sent and the result needs an operator."""
    chain = TriageChain(
        specialist=_unsure_specialist(),
        escalation=LlmEscalation(_config(fake.url, TUNEHARNESS_LLM_DAILY_CAP_USD="0.0001"), ledger),
    )
    res = chain.triage(AMBIGUOUS)
    assert (res.state, res.stage, res.needs_operator) == ("oom", "specialist", True)
    assert any("cap" in n for n in res.notes)
    assert fake.requests == [] and ledger.rows() == []


def test_spend_counts_across_calls_until_the_cap_stops_them(fake: FakeLlmServer, ledger: Ledger) -> None:
    """Calls are made while today's ledger spend leaves room for the worst case, then refused."""
    esc = LlmEscalation(_config(fake.url, TUNEHARNESS_LLM_DAILY_CAP_USD="3.0"), ledger)
    chain = TriageChain(specialist=_unsure_specialist(), escalation=esc)
    results = chain.triage_many([TriageInput(str(i), AMBIGUOUS) for i in range(12)])
    calls = len(fake.requests)
    assert 1 <= calls < 12
    assert [r.stage for r in results].count("llm") == calls
    assert all(r.needs_operator for r in results if r.stage != "llm")
    assert esc.spent_today_usd() <= 3.0
    assert len(ledger.rows(kind=LLM_EVENT)) == calls


def test_yesterdays_spend_does_not_count_against_today(fake: FakeLlmServer, ledger: Ledger) -> None:
    """The cap is per UTC day: spend recorded yesterday leaves today's budget whole."""
    from app.ledger import Event

    ledger.append(Event(kind=LLM_EVENT, amount_usd=100.0, at=datetime(2020, 1, 1, tzinfo=UTC)))
    esc = LlmEscalation(_config(fake.url, TUNEHARNESS_LLM_DAILY_CAP_USD="5"), ledger)
    assert esc.spent_today_usd() == 0.0
    assert esc.ask("Segmentation fault").state == "cuda_fault"


def test_no_endpoint_or_a_failing_endpoint_means_needs_operator(ledger: Ledger) -> None:
    """Without TUNEHARNESS_LLM_URL, or with an endpoint answering 500 or refusing the key, the guess
    goes to an operator."""
    assert LlmConfig.from_env({}) is None
    res = TriageChain(specialist=_unsure_specialist()).triage(AMBIGUOUS)
    assert res.needs_operator and "TUNEHARNESS_LLM_URL" in res.notes[-1]
    with FakeLlmServer(key=KEY, status=500) as broken:
        res = TriageChain(
            specialist=_unsure_specialist(), escalation=LlmEscalation(_config(broken.url), ledger)
        ).triage(AMBIGUOUS)
        assert res.needs_operator and "HTTP 500" in res.notes[-1]
    with FakeLlmServer(key="another-key") as strict:
        res = TriageChain(
            specialist=_unsure_specialist(), escalation=LlmEscalation(_config(strict.url), ledger)
        ).triage(AMBIGUOUS)
        assert res.needs_operator and "HTTP 401" in res.notes[-1]
    assert ledger.rows() == []


def test_without_any_specialist_the_rules_guess_is_returned() -> None:
    """Empty or binary input with no specialist and no LLM still yields one of the eight states."""
    for text in ("", "\x00\xff" * 100, "just some words"):
        res = TriageChain().triage(text, idle_seconds=5)
        assert res.state == "progressing" and res.needs_operator
        assert TriageChain().triage(text, idle_seconds=99999).state == "stalled"


def test_llm_settings_are_validated_with_the_variable_named() -> None:
    """A bad URL or a negative price is refused naming the variable."""
    with pytest.raises(SettingsError, match="TUNEHARNESS_LLM_URL"):
        LlmConfig.from_env({"TUNEHARNESS_LLM_URL": "ftp://x"})
    with pytest.raises(SettingsError, match="TUNEHARNESS_LLM_DAILY_CAP_USD"):
        LlmConfig.from_env({"TUNEHARNESS_LLM_URL": "http://x", "TUNEHARNESS_LLM_DAILY_CAP_USD": "-1"})


@pytest.mark.parametrize(
    ("content", "state"),
    [
        ('{"state": "oom", "reason": "x"}', "oom"),
        ("The run is stalled (watchdog).", "stalled"),
        ('```json\n{"state": "io_error"}\n```', "io_error"),
        ("I think data_error, maybe io_error", "data_error"),
        ("no idea", None),
    ],
)
def test_answers_are_parsed_into_one_of_the_states(content: str, state: str | None) -> None:
    """JSON answers, prose and fenced JSON are parsed into a state; nonsense is None."""
    assert parse_state(content) == state


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", "triage", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_jsonl_writes_one_line_per_row_and_records_llm_spend(tmp_path: Path, fake: FakeLlmServer) -> None:
    """`triage --jsonl` answers each row (rules or llm stage) and the LLM's spend is in the ledger of
    TUNEHARNESS_HOME."""
    home = tmp_path / "home"
    rows = [
        {"id": "a", "log": OBVIOUS_OOM},
        {"id": "b", "log": AMBIGUOUS, "idle_seconds": 3},
        {"id": "c", "log": "\x00\x01garbage"},
    ]
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    env = {
        **os.environ,
        "TUNEHARNESS_HOME": str(home),
        "TUNEHARNESS_LLM_URL": fake.url,
        "TUNEHARNESS_LLM_KEY": KEY,
        "TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK": "1",
        "TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK": "1",
    }
    proc = _cli(["--jsonl", str(inp), "--no-specialist"], env)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [o["id"] for o in out] == ["a", "b", "c"]
    assert {k for o in out for k in o} >= {"id", "state", "stage", "confidence", "action", "evidence"}
    assert out[0]["stage"] == "rules" and out[0]["state"] == "oom"
    assert out[1]["stage"] == "llm" and out[1]["state"] == "cuda_fault"
    assert KEY not in proc.stdout + proc.stderr
    led = Ledger(make_engine(f"sqlite:///{home / 'tuneharness.db'}"))
    assert len(led.rows(kind=LLM_EVENT)) == 2


def test_cli_file_prints_one_verdict_and_refuses_a_missing_file(tmp_path: Path) -> None:
    """`triage FILE --json` prints one JSON verdict; a missing file is one line on stderr and exit 2."""
    log = tmp_path / "train.log"
    log.write_bytes(b"\x1b[32m 5%|\xe2\x96\x8c | 5/100\r\x1b[0m\nOSError: [Errno 28] No space left on device\n")
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home")}
    env.pop("TUNEHARNESS_LLM_URL", None)
    proc = _cli([str(log), "--idle-seconds", "10", "--json"], env)
    assert proc.returncode == 0, proc.stderr
    res = json.loads(proc.stdout)
    assert (res["state"], res["stage"], res["action"]) == ("io_error", "rules", "replace the host (disk)")
    proc = _cli([str(tmp_path / "missing.log")], env)
    assert proc.returncode == 2 and proc.stderr.startswith("error: cannot read")


def test_cli_verdict_without_an_llm_never_imports_the_database_layer(tmp_path: Path) -> None:
    """A rules-only `triage FILE` has no spend to record, so it skips the ~0.4 s of sqlalchemy/sqlmodel
    imports; with an endpoint configured, the ledger (and so the database layer) is loaded."""
    log = tmp_path / "train.log"
    log.write_text("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp_path / "home")}
    env.pop("TUNEHARNESS_LLM_URL", None)

    def imported(extra_env: dict[str, str]) -> set[str]:
        proc = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "app.cli.main", "triage", str(log), "--no-specialist"],
            cwd=REPO,
            env={**env, **extra_env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("oom")
        return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}

    assert not {"sqlalchemy", "sqlmodel", "app.budget", "app.ledger"} & imported({})
    assert {"sqlalchemy", "app.ledger"} <= imported(
        {"TUNEHARNESS_LLM_URL": "http://127.0.0.1:9/v1", "TUNEHARNESS_LLM_KEY": "k", "TUNEHARNESS_LLM_MODEL": "m"}
    )
