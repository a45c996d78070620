"""`tuneharness gate` as a user runs it: a brand-new TUNEHARNESS_HOME, no broker, real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.ledger import Ledger

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"  # not created: the CLI must create what it needs


@pytest.fixture
def env(home: Path) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    e.update(
        TUNEHARNESS_HOME=str(home),
        TUNEHARNESS_BROKER_URL="redis://127.0.0.1:1/0",  # nothing listens: the gate must not need it
        PYTHONPATH=str(REPO),
        HF_HUB_OFFLINE="1",
    )
    return e


def gate(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", "gate", *args],
        env=env, cwd=REPO, text=True, capture_output=True, timeout=120,
    )  # fmt: skip


def ledger(home: Path) -> Ledger:
    eng = make_engine(f"sqlite:///{home / 'tuneharness.db'}")
    init_db(eng)
    return Ledger(eng)


def test_promote_exits_0_and_records_the_decision(env: dict[str, str], home: Path, make_trial) -> None:
    """judge --json on a good trial prints the decision, exits 0 and appends gate_decision."""
    p = gate(env, "judge", str(make_trial()), "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["decision"] == "promote" and out["reasons"] == [] and out["warnings"] == []
    assert out["scores"]["candidate"]["seeds"]["2"]["heldout"] == 0.75
    [row] = ledger(home).rows(kind="gate_decision")
    assert row.payload["trial_hash"] == out["trial"]["hash"]


def test_refuse_exits_1_and_queues_the_alert(env: dict[str, str], home: Path, make_trial) -> None:
    """A refusal exits 1, is in the ledger with its reasons, and gate_refused waits in the outbox."""
    p = gate(env, "judge", str(make_trial(seeds={"1": set()})))
    assert p.returncode == 1, p.stderr
    assert "REFUSE" in p.stdout and "seeds_missing" in p.stdout
    [row] = ledger(home).rows(kind="gate_decision")
    assert row.reason == "refuse: seeds_missing"
    from app.alerts import OutboxNotifier

    [alert] = OutboxNotifier(ledger(home).engine, None).pending()
    assert alert.kind == "gate_refused"


def test_malformed_exits_2_with_one_line_naming_file_and_line(env: dict[str, str], home: Path, make_trial) -> None:
    """Bad input: exit 2, one line on stderr with file:line, no traceback, nothing recorded."""
    d = make_trial()
    with (d / "candidate-seed-1.jsonl").open("a") as f:
        f.write('{"id": "z", "slice": "ood", "expected": "ok", "predicted": "ok"}\n')
    p = gate(env, "judge", str(d))
    assert p.returncode == 2
    assert "candidate-seed-1.jsonl:8" in p.stderr and "unknown slice" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert ledger(home).rows(kind="gate_decision") == []


def test_history_lists_trials_and_production(env: dict[str, str], make_trial) -> None:
    """history --json shows both trials and the promoted one in production; --markdown the table."""
    assert gate(env, "judge", str(make_trial("t1"))).returncode == 0
    assert gate(env, "judge", str(make_trial("t2", seeds={"1": {"c1"}, "2": set()}))).returncode == 1
    data = json.loads(gate(env, "history", "--json").stdout)
    assert [t["decision"] for t in data["trials"]] == ["promote", "refuse"]
    assert data["production"]["triage"]["trial_path"].endswith("t1")
    md = gate(env, "history", "--markdown").stdout
    assert md.startswith("| model | task | baseline |") and "refuse: canary_failed" in md
    text = gate(env, "history").stdout
    assert "in production:" in text and "triage" in text


def test_history_on_a_brand_new_home(env: dict[str, str]) -> None:
    """history with nothing judged says so and exits 0."""
    p = gate(env, "history")
    assert p.returncode == 0 and "no trials judged yet" in p.stdout


PREDICTOR = textwrap.dedent(
    """
    import json, sys
    wrong = set(sys.argv[1:])
    labels = json.load(open(sys.argv[0].replace("predictor.py", "labels.json")))
    for line in sys.stdin:
        row = json.loads(line)
        assert set(row) == {"id", "text"}, row
        print(json.dumps({"id": row["id"], "predicted": "x" if row["id"] in wrong else labels[row["id"]]}))
    """
)


@pytest.fixture
def eval_set(tmp_path: Path) -> dict[str, Path]:
    """An eval set, a gate.json, a predictor program (knows the labels) and baseline predictions."""
    rows = [
        ("h1", "heldout", "oom"), ("h2", "heldout", "nan"), ("h3", "heldout", "ok"), ("h4", "heldout", "ok"),
        ("c1", "canary", "oom"), ("o1", "ood:forum", "ok"),
    ]  # fmt: skip
    ev = tmp_path / "eval.jsonl"
    ev.write_text(
        "".join(json.dumps({"id": i, "slice": s, "expected": e, "text": f"log {i}"}) + "\n" for i, s, e in rows)
    )
    (tmp_path / "labels.json").write_text(json.dumps({i: e for i, _, e in rows}))
    (tmp_path / "predictor.py").write_text(PREDICTOR)
    base = tmp_path / "baseline-preds.jsonl"
    base.write_text("".join(json.dumps({"id": i, "predicted": "ok"}) + "\n" for i, _, _ in rows))
    cfg = tmp_path / "gate.json"
    cfg.write_text(
        json.dumps({"metric": "accuracy", "ood": {"forum": {"floor": 0.9}}, "model": "triage", "min_canaries": 1})
    )
    return {"eval": ev, "predictor": tmp_path / "predictor.py", "baseline": base, "config": cfg}


def run_args(eval_set: dict[str, Path], out: Path, *cands: str) -> list[str]:
    args = ["run", "--out", str(out), "--config", str(eval_set["config"]), "--eval", str(eval_set["eval"]),
            "--baseline", f"predictions:{eval_set['baseline']}", "--json"]  # fmt: skip
    for c in cands:
        args += ["--candidate", c]
    return args


def test_run_evaluates_command_predictors_writes_the_trial_and_judges_it(
    env: dict[str, str], home: Path, tmp_path: Path, eval_set: dict[str, Path]
) -> None:
    """gate run with two candidate programs and baseline predictions writes a judgeable trial and promotes."""
    out = tmp_path / "trials" / "triage-1"
    py = f"command:{sys.executable} {eval_set['predictor']}"
    p = gate(env, *run_args(eval_set, out, f"1={py}", f"2={py} h4"))
    assert p.returncode == 0, p.stderr
    assert "evaluating candidate seed 2" in p.stderr
    assert sorted(x.name for x in out.iterdir()) == [
        "baseline.jsonl",
        "candidate-seed-1.jsonl",
        "candidate-seed-2.jsonl",
        "decision.json",
        "gate.json",
    ]
    decision = json.loads((out / "decision.json").read_text())
    assert decision["decision"] == "promote" and decision["scores"]["candidate"]["worst"]["heldout"] == 0.75
    # The written trial re-judges to the same decision and the same (single) ledger event.
    again = gate(env, "judge", str(out), "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["trial"]["hash"] == decision["trial"]["hash"]
    assert len(ledger(home).rows(kind="gate_decision")) == 1


def test_run_refuses_a_candidate_that_breaks_a_canary(
    env: dict[str, str], tmp_path: Path, eval_set: dict[str, Path]
) -> None:
    """A seed that gets the canary wrong makes gate run exit 1 with canary_failed."""
    py = f"command:{sys.executable} {eval_set['predictor']}"
    p = gate(env, *run_args(eval_set, tmp_path / "t", f"1={py}", f"2={py} c1"))
    assert p.returncode == 1
    assert [r["code"] for r in json.loads(p.stdout)["reasons"]] == ["canary_failed"]


def test_run_with_a_failing_predictor_exits_2_and_writes_nothing(
    env: dict[str, str], tmp_path: Path, eval_set: dict[str, Path]
) -> None:
    """A predictor program that crashes is a one-line error; no trial directory appears."""
    out = tmp_path / "t"
    p = gate(env, *run_args(eval_set, out, f"1=command:{sys.executable} -c 'import sys; sys.exit(3)'"))
    assert p.returncode == 2 and "exited 3" in p.stderr and not out.exists()


def test_run_refuses_to_overwrite_a_trial(env: dict[str, str], tmp_path: Path, eval_set: dict[str, Path]) -> None:
    """A trial is a record: gate run will not write into an existing non-empty directory."""
    out = tmp_path / "t"
    out.mkdir()
    (out / "gate.json").write_text("{}")
    p = gate(env, *run_args(eval_set, out, f"1=predictions:{eval_set['baseline']}"))
    assert p.returncode == 2 and "already exists" in p.stderr


def test_refusal_is_delivered_to_a_configured_webhook(env: dict[str, str], make_trial) -> None:
    """With TUNEHARNESS_ALERT_WEBHOOK_URL set, judge's refusal reaches the receiver before the CLI exits."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[dict[str, object]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        env = {
            **env,
            "TUNEHARNESS_ALERT_WEBHOOK_URL": f"http://127.0.0.1:{server.server_address[1]}/hook/tok3n",
            "TUNEHARNESS_ALERT_FORMAT": "discord",
        }
        p = gate(env, "judge", str(make_trial(seeds={"1": set()})))
        assert p.returncode == 1
        assert len(got) == 1 and "gate_refused" in str(got[0]["content"]) and "tok3n" not in p.stderr + p.stdout
    finally:
        server.shutdown()
        server.server_close()
