"""The research driver on the real stores (SQLite job table, ledger, budget, rentals, the run's tables, a
local artifact store) with the fleet's effects replaced by lists: what it submits, reserves, records and
resumes, and what it exports to each home that ticks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.artifacts import LocalArtifactStore
from app.budget import Budget
from app.db import init_db, make_engine
from app.jobs import JobStore
from app.ledger import Ledger
from app.rentals import Rentals
from app.research import EXPERIMENT_FIELDS, load_research_file
from app.researchstore import ResearchRunStore
from app.services.research import ResearchService, budget_name, experiment_job_id
from tests.support.jobfiles import sim_needs_section, train_section

RESEARCH = """\
name: unit
job: job.yaml
axes:
  learning_rate: {times: [2.0, 0.5]}
time_box_s: 20
tier: RTX 3090
iterations: 1
mutations: 2
parallelism: 2
budget_usd: 2.0
job_budget_usd: 0.5
"""


class World:
    """A research service over real stores in `tmp`, with submitted and cancelled jobs kept in lists."""

    def __init__(self, tmp: Path, url: str | None = None) -> None:
        (tmp / "model").mkdir()
        (tmp / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (tmp / "job.yaml").write_text(f"name: base\n{train_section()}{sim_needs_section()}")
        (tmp / "research.yaml").write_text(RESEARCH)
        self.engine = make_engine(url or f"sqlite:///{tmp / 'home' / 'tuneharness.db'}")  # the CLI's database too
        init_db(self.engine)
        self.enqueued: list[str] = []
        self.cancelled: list[str] = []
        self.jobs = JobStore(self.engine)
        self.budget = Budget(self.engine)
        self.artifacts = LocalArtifactStore(tmp / "artifacts")
        self.svc = self.service(tmp / "home")
        self.rf = load_research_file(tmp / "research.yaml")
        self.tmp = tmp

    def service(self, home: Path) -> ResearchService:
        """A research service whose files go to `home` (a worker on another machine), on the same database."""
        return ResearchService(
            home=home,
            jobs=self.jobs,
            ledger=Ledger(self.engine),
            budget=self.budget,
            rentals=Rentals(self.engine),
            engine=self.engine,
            artifacts=self.artifacts,
            enqueue=self.enqueued.append,
            cancel=self.cancel,
            clock=lambda: 1000.0,
        )

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
        self.jobs.set_phase(job_id, "cancelled", detail="cancelled")

    def finish(self, job_id: str, val_loss: float | None) -> None:
        """The job's adapter was pulled with this validation loss (None: the job failed)."""
        if val_loss is None:
            self.jobs.set_phase(job_id, "failed", detail="triage: oom")
            return
        meta = self.tmp / f"{job_id}-meta.json"
        meta.write_text(json.dumps({"val_loss": val_loss, "steps": 40, "trained_s": 20.0}))
        self.artifacts.put_file(f"jobs/{job_id}/adapter/trainer_meta.json", meta)
        self.jobs.set_phase(job_id, "done", detail="adapter pulled")

    def store(self, run_id: str) -> ResearchRunStore:
        return self.svc.store(run_id)


def _held(w: World, run_id: str) -> tuple[float, float]:
    (s,) = w.budget.status([budget_name(run_id)])
    return s.reserved_usd, s.spent_usd


def test_a_run_reserves_before_it_submits_and_records_every_experiment(tmp_path: Path) -> None:
    """The baseline's two jobs are reserved on the run's cap and submitted with the time box, the split and the
    tier; their results set the noise; the mutations are judged, recorded and settled; the run finishes."""
    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    assert w.svc.tick(run_id)
    base = [experiment_job_id(run_id, "e000", s) for s in (1, 2)]
    assert w.enqueued == base and _held(w, run_id) == (1.0, 0.0)
    rec = w.jobs.get(base[0])
    assert rec is not None
    train, needs = rec.spec["train"], rec.spec["needs"]
    assert train["time_box_s"] == 20 and train["val_fraction"] == 0.2 and train["seed"] == 1
    assert needs["gpu"] == ["RTX 3090"] and rec.budget_usd == 0.5
    assert w.svc.tick(run_id) and len(w.enqueued) == 2  # nothing ended: nothing new
    w.finish(base[0], 2.0)
    w.finish(base[1], 2.02)
    assert w.svc.tick(run_id)
    muts = w.enqueued[2:]
    assert len(muts) == 2 and _held(w, run_id) == (1.0, 0.0)
    w.finish(muts[0], 1.5)
    w.finish(muts[1], None)
    assert not w.svc.tick(run_id)  # one iteration: finished
    lines = w.store(run_id).experiments()
    assert [r["verdict"] for r in lines] == ["baseline", "accepted", "failed"]
    assert all(tuple(r) == EXPERIMENT_FIELDS for r in lines)
    assert lines[2]["status"].startswith("crashed:") and "oom" in lines[2]["status"]
    best = w.store(run_id).best()
    assert best is not None and best["val_loss"] == 1.5 and best["train"]["learning_rate"] == 4.0e-4
    assert _held(w, run_id) == (0.0, 0.0)  # every reservation settled (these jobs rented nothing)
    assert "| accepted change |" in (w.store(run_id).dir / "board.md").read_text()


def test_a_tick_repeated_after_a_crash_submits_and_records_nothing_twice(tmp_path: Path) -> None:
    """A tick that applied its actions but died before saving the state is repeated: the same jobs are not
    submitted again, the same reservation is returned, and no experiment is appended twice."""
    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    w.svc.tick(run_id)
    store = w.store(run_id)
    before = store.state()
    for job_id in list(w.enqueued):
        w.finish(job_id, 2.0)
    w.svc.tick(run_id)
    assert len(w.enqueued) == 4 and len(store.experiments()) == 1
    assert before is not None
    store.save_state(before)  # the crash: effects applied, the state not saved
    w.svc.tick(run_id)
    assert len(w.enqueued) == 4 and len(store.experiments()) == 1
    assert _held(w, run_id) == (1.0, 0.0)


def test_a_host_lost_and_recovered_is_written_down_and_the_result_counts(tmp_path: Path) -> None:
    """A seed whose job lost a host and finished elsewhere: status says so, and its metric is judged."""
    from app.ledger import Event

    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    w.svc.tick(run_id)
    first, second = list(w.enqueued)
    w.svc.ledger.append(Event(kind="host_lost", job=first, machine="m-1", reason="gone"))
    w.finish(first, 2.0)
    w.finish(second, 2.1)
    w.svc.tick(run_id)
    (line,) = w.store(run_id).experiments()
    assert line["status"] == "lost and recovered (1 host(s))" and line["verdict"] == "baseline"


def test_stop_cancels_the_experiments_in_flight_and_keeps_the_best(tmp_path: Path) -> None:
    """A stop cancels the running jobs, records them as cancelled, settles their reservations, finishes."""
    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    w.svc.tick(run_id)
    state = w.svc.stop(run_id, reason="operator")
    assert state.finished_reason == "operator" and sorted(w.cancelled) == sorted(w.enqueued)
    (line,) = w.store(run_id).experiments()
    assert line["verdict"] == "cancelled" and line["status"] == "cancelled"
    assert w.store(run_id).best() is not None and not w.svc.active(run_id)
    assert _held(w, run_id) == (0.0, 0.0)


def test_only_the_current_tick_of_a_run_goes_on(tmp_path: Path) -> None:
    """Tick numbers: a duplicated tick is refused, the next number is claimed once."""
    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    assert w.svc.claim_tick(run_id, 0) and not w.svc.claim_tick(run_id, 0) and w.svc.claim_tick(run_id, 1)
    assert w.svc.stale(run_id, older_than_s=3600) is None and w.svc.stale(run_id, older_than_s=-1) == 2


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_homes_on_one_database_tick_a_run_in_turn_and_its_history_is_whole_and_single(
    tmp_path: Path, db_url: str
) -> None:
    """Workers on two machines (two homes, one database) tick the same run alternately, some ticks repeated
    after a crash: every experiment is recorded once, in order, and each home's experiments.jsonl is that
    whole history."""
    w = World(tmp_path, db_url)
    home_a, home_b = tmp_path / "machine-a", tmp_path / "machine-b"
    a, b = w.service(home_a), w.service(home_b)
    run_id = a.create(w.rf)
    assert a.tick(run_id) and b.tick(run_id)  # b finds the baseline submitted: nothing new
    assert len(w.enqueued) == 2
    for job_id in list(w.enqueued):
        w.finish(job_id, 2.0)
    saved = b.store(run_id).state()
    assert b.tick(run_id)  # b records the baseline and launches the mutations
    assert saved is not None
    b.store(run_id).save_state(saved)  # b died before its state was saved: a repeats the tick
    assert a.tick(run_id) and b.tick(run_id)
    muts = w.enqueued[2:]
    assert len(muts) == 2 and len(set(w.enqueued)) == 4
    w.finish(muts[0], 1.5)
    assert a.tick(run_id)
    w.finish(muts[1], 2.1)
    assert not b.tick(run_id) and not a.tick(run_id)
    history = a.store(run_id).experiments()
    assert [r["exp"] for r in history] == ["e000", "e001", "e002"]
    assert [r["verdict"] for r in history] == ["baseline", "accepted", "rejected"]
    for home in (home_a, home_b):
        run_dir = home / "research" / run_id
        assert _lines(run_dir / "experiments.jsonl") == history
        assert json.loads((run_dir / "best.json").read_text())["val_loss"] == 1.5
        assert "| e002 |" in (run_dir / "board.md").read_text()
    assert _held(w, run_id) == (0.0, 0.0)


def test_the_experiments_table_refuses_updates_and_deletes(tmp_path: Path, db_url: str) -> None:
    """A recorded experiment cannot be changed or removed: the database refuses it, as it does for the ledger."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    w = World(tmp_path, db_url)
    run_id = w.svc.create(w.rf)
    w.svc.tick(run_id)
    for job_id in list(w.enqueued):
        w.finish(job_id, 2.0)
    w.svc.tick(run_id)
    for sql in ("UPDATE research_experiments SET verdict = 'accepted'", "DELETE FROM research_experiments"):
        with pytest.raises(DBAPIError, match="append-only"), w.engine.begin() as conn:
            conn.execute(text(sql))
    assert [r["verdict"] for r in w.store(run_id).experiments()] == ["baseline"]


def test_one_writer_at_a_time_and_a_stale_save_is_refused(tmp_path: Path, db_url: str) -> None:
    """While one writer holds a run, another is told it is busy; a state saved over a newer one is refused."""
    from app.researchstore import ResearchBusy, ResearchConflict

    w = World(tmp_path, db_url)
    run_id = w.svc.create(w.rf)
    first, second = w.store(run_id), w.service(tmp_path / "machine-b").store(run_id)
    with first.locked(), pytest.raises(ResearchBusy), second.locked(wait_s=0):
        pass
    with second.locked(wait_s=0):  # released: the other writer gets it
        state, seq = second.load()
        assert state is None
    second.save_state({"phase": "searching"}, expect_seq=seq)
    with pytest.raises(ResearchConflict):
        first.save_state({"phase": "finished"}, expect_seq=seq)
    assert first.state() == {"phase": "searching"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (("tier: RTX 3090", "tier: ''"), "tier"),
        (("budget_usd: 2.0", "budget_usd: .nan"), "budget_usd"),
        (("budget_usd: 2.0", "budget_usd: 0.6"), "budget_usd"),
        (("{times: [2.0, 0.5]}", "{times: [2.0], plus: [1]}"), "axes.learning_rate"),
        (("learning_rate: {", "depth: {"), "axes.depth"),
        (("job: job.yaml", "job: nope.yaml"), "job"),
        (("name: unit", "name: Bad Name"), "name"),
        (("time_box_s: 20", "time_box_s: -1"), "time_box_s"),
        (("iterations: 1", "iterations: 1\nbaseline_seeds: [1]"), "baseline_seeds"),
        (("iterations: 1", "iterations: 1\nfoo: 2"), "foo"),
    ],
)
def test_a_bad_research_file_is_one_line_naming_the_field(tmp_path: Path, change: tuple[str, str], field: str) -> None:
    """Every refusal names the file, the field and the fix, in one line."""
    from app.jobs import JobFileError

    World(tmp_path)
    (tmp_path / "research.yaml").write_text(RESEARCH.replace(*change))
    with pytest.raises(JobFileError) as err:
        load_research_file(tmp_path / "research.yaml")
    msg = str(err.value)
    assert err.value.field == field and "Fix:" in msg and "\n" not in msg, msg


def test_the_cli_refuses_a_bad_research_file_with_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    """`research start` on a bad file: one line on stderr, exit 2, no run directory."""
    World(tmp_path)
    (tmp_path / "research.yaml").write_text(RESEARCH.replace("job_budget_usd: 0.5", "job_budget_usd: .inf"))
    out = _cli(tmp_path, "start", str(tmp_path / "research.yaml"))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1 and "job_budget_usd" in out.stderr
    assert not (tmp_path / "home" / "research").exists()


def _cli(tmp_path: Path, *args: str) -> Any:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env["TUNEHARNESS_HOME"] = str(tmp_path / "home")
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", "research", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).resolve().parents[3],
    )


def test_board_and_show_read_a_run_and_name_a_missing_one_in_one_line(tmp_path: Path) -> None:
    """`research board` and `show` print a run's board and state; no run or an unknown one: one line, exit 2."""
    out = _cli(tmp_path, "board")
    assert out.returncode == 2 and "no research runs yet" in out.stderr and len(out.stderr.splitlines()) == 1
    w = World(tmp_path)
    run_id = w.svc.create(w.rf)
    w.svc.tick(run_id)
    for job_id in list(w.enqueued):
        w.finish(job_id, 2.0)
    w.svc.tick(run_id)
    board = _cli(tmp_path, "board")
    assert board.returncode == 0 and f"research run {run_id}" in board.stdout and "| e000 |" in board.stdout
    as_json = json.loads(_cli(tmp_path, "board", run_id, "--json").stdout)
    assert as_json["phase"] == "searching" and as_json["best_val_loss"] == 2.0 and len(as_json["experiments"]) == 1
    show = _cli(tmp_path, "show", run_id)
    assert show.returncode == 0 and "searching" in show.stdout and "reserved $1.0000 of $2" in show.stdout
    missing = _cli(tmp_path, "show", "no-such-run")
    assert missing.returncode == 2 and "no research run 'no-such-run'" in missing.stderr


def test_the_tick_period_setting_is_checked() -> None:
    """TUNEHARNESS_RESEARCH_TICK_S: unset is 10 s, a number is taken, anything else is refused naming it."""
    from app.errors import SettingsError
    from workers.research import tick_s

    assert tick_s({}) == 10.0 and tick_s({"TUNEHARNESS_RESEARCH_TICK_S": "2"}) == 2.0
    for raw in ("soon", "nan", "0", "-1"):
        with pytest.raises(SettingsError, match="TUNEHARNESS_RESEARCH_TICK_S"):
            tick_s({"TUNEHARNESS_RESEARCH_TICK_S": raw})
