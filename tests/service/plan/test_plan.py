"""`tuneharness plan`: hyperscaler, naive and guarded figures with their bands and provenance, from
the real campaign simulator, the shipped price table and a real reputation store (few seeds)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.db import init_db, make_engine
from app.errors import UserError
from app.reputation import ReputationStore
from app.services.plan import (
    FIELD_REPORT_DUD_RATE,
    Band,
    DudRate,
    Plan,
    PlanWorkload,
    choose_dud_rate,
    load_price_table,
    make_plan,
    observed_dud_rate,
    validate_workload,
)
from providers.sim.plan import SimPlanReplay

ROOT = Path(__file__).resolve().parents[3]
SEEDS = 3


def known_gpus() -> list[str]:
    return [*SimPlanReplay().gpu_price_ranges(), *(r.gpu for r in load_price_table())]


def workload(gpu: str = "A100", *, train_hours: float = 0.5, jobs: int = 2) -> PlanWorkload:
    return validate_workload(
        gpu=gpu,
        train_hours=train_hours,
        model_gb=15,
        data_gb=1,
        jobs=jobs,
        seeds=SEEDS,
        dud_rate=None,
        known_gpus=known_gpus(),
    )


def plan_of(w: PlanWorkload, dud_rate: DudRate, *, seeds: int = SEEDS) -> Plan:
    return make_plan(w, dud_rate=dud_rate, seeds=seeds, replay=SimPlanReplay(), prices=load_price_table())


def ordered(b: Band) -> bool:
    assert b.median_usd is not None and b.p10_usd is not None and b.p90_usd is not None
    return b.p10_usd <= b.median_usd <= b.p90_usd


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TUNEHARNESS_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("TUNEHARNESS_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", "plan", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def store(tmp_path: Path) -> ReputationStore:
    engine = make_engine(f"sqlite:///{tmp_path / 'th.db'}")
    init_db(engine)
    return ReputationStore(engine)


def seed_reputation(store: ReputationStore) -> None:
    """Two deliveries (one later lost mid-run, which is no dud), one frozen boot, one stale driver,
    one rental still booting (no verdict yet)."""
    for machine in ("m-good", "m-lost"):
        for event in ("create", "boot", "preflight_passed"):
            store.record("vast", machine, event, now=1.0)
    store.record("vast", "m-lost", "failure", now=2.0, reason="lost", evidence="instance gone")
    store.record("vast", "m-frozen", "create", now=1.0)
    store.record("vast", "m-frozen", "failure", now=2.0, reason="boot_frozen", evidence="status frozen 360s")
    store.record("vast", "m-stale", "create", now=1.0)
    store.record("vast", "m-stale", "failure", now=2.0, reason="no_compute", evidence="CUDA init failed")
    store.record("vast", "m-booting", "create", now=3.0)


def test_every_band_is_ordered() -> None:
    """p10 <= median <= p90 for the hyperscaler, naive and guarded figures of an A100 workload."""
    plan = make_plan(
        workload("A100"),
        dud_rate=choose_dud_rate(override=None, observed=None),
        seeds=SEEDS,
        replay=SimPlanReplay(),
        prices=load_price_table(),
    )
    assert ordered(plan.hyperscaler) and ordered(plan.naive) and ordered(plan.guarded)
    assert plan.hyperscaler.p10_usd is not None and plan.hyperscaler.p90_usd is not None
    # Two sourced A100 providers with different prices: the band has a width.
    assert plan.hyperscaler.p10_usd < plan.hyperscaler.p90_usd


def test_guarded_costs_less_than_naive_on_a_dud_heavy_marketplace() -> None:
    """At an 80% dud rate the guarded median is at most the naive median."""
    plan = make_plan(
        workload("RTX 3090", train_hours=1.0),
        dud_rate=choose_dud_rate(override=0.8, observed=None),
        seeds=SEEDS,
        replay=SimPlanReplay(),
        prices=load_price_table(),
    )
    assert plan.guarded.median_usd is not None and plan.naive.median_usd is not None
    assert plan.guarded.median_usd <= plan.naive.median_usd


def test_the_same_seeds_give_the_same_plan() -> None:
    """Two plans of one workload over the same seeds are identical."""
    first, second = (plan_of(workload("RTX 4090"), DudRate(0.5, "override"), seeds=2) for _ in range(2))
    assert first.to_dict() == second.to_dict()


def test_dud_rate_comes_from_reputation_data(store: ReputationStore) -> None:
    """Duds (boot and preflight failures) among rentals with a verdict: 2 of 4, on 4 machines."""
    assert observed_dud_rate(store.records().values()) is None
    seed_reputation(store)
    observed = observed_dud_rate(store.records().values())
    assert observed == DudRate(0.5, "reputation", duds=2, delivered=2, machines=4)
    assert choose_dud_rate(override=None, observed=observed) is observed
    assert choose_dud_rate(override=0.3, observed=observed) == DudRate(0.3, "override")
    assert "2 duds of 4 rentals on 4 machines" in observed.describe()


def test_field_reports_rate_when_reputation_has_none() -> None:
    """No observation: the field reports' 0.62, and the sentence says so."""
    rate = choose_dud_rate(override=None, observed=None)
    assert (rate.rate, rate.origin) == (FIELD_REPORT_DUD_RATE, "field_reports") == (0.62, "field_reports")
    assert "62 of 100" in rate.describe()


def test_provenance_names_each_figures_source() -> None:
    """One sentence per figure: the dated, sourced rows; the replays, policy and dud rate."""
    plan = make_plan(
        workload("A100"),
        dud_rate=DudRate(0.4, "override"),
        seeds=SEEDS,
        replay=SimPlanReplay(),
        prices=load_price_table(),
    )
    hyper = plan.hyperscaler.provenance
    for row in (r for r in load_price_table() if r.gpu == "A100"):
        assert row.source in hyper and row.as_of in hyper
    for policy, band in (("naive", plan.naive), ("guarded", plan.guarded)):
        assert f"{SEEDS} seeded replays of the campaign simulator ({policy} policy" in band.provenance
        assert "dud rate 0.40 as given by --dud-rate" in band.provenance
    for band in (plan.hyperscaler, plan.naive, plan.guarded):
        assert band.provenance.endswith(".") and band.provenance.count(". ") == 0


def test_a_model_without_a_sourced_price_gets_no_figure() -> None:
    """RTX 3090: no hyperscaler row; H100: no simulated marketplace offers; neither is estimated."""
    rate = DudRate(0.62, "field_reports")
    consumer = plan_of(workload("RTX 3090"), rate, seeds=1)
    assert consumer.hyperscaler == Band(None, None, None, consumer.hyperscaler.provenance)
    assert consumer.hyperscaler.provenance.startswith("No sourced price")
    h100 = plan_of(workload("h100 sxm"), rate, seeds=1)
    assert h100.workload.gpu == "H100" and h100.hyperscaler.median_usd is not None
    assert h100.naive.median_usd is None and h100.guarded.median_usd is None
    assert "lists no H100 offers" in h100.naive.provenance


def test_price_table_rows_are_dated_and_sourced() -> None:
    """Every row of the shipped table has a positive price, a date and a page."""
    rows = load_price_table()
    assert {r.gpu for r in rows} >= {"H100", "A100", "L4", "A10G"}
    for r in rows:
        assert r.usd_per_gpu_hour > 0 and r.as_of[:4].isdigit() and r.source.startswith("https://")


@pytest.mark.parametrize(
    ("change", "option"),
    [
        ({"train_hours": math.nan}, "--train-hours"),
        ({"train_hours": -1.0}, "--train-hours"),
        ({"model_gb": -5.0}, "--model-gb"),
        ({"data_gb": math.inf}, "--data-gb"),
        ({"jobs": 0}, "--jobs"),
        ({"seeds": 0}, "--seeds"),
        ({"dud_rate": 1.0}, "--dud-rate"),
        ({"dud_rate": math.nan}, "--dud-rate"),
        ({"gpu": "Voodoo 2"}, "--gpu"),
    ],
)
def test_bad_input_is_refused_with_the_fix(change: dict[str, object], option: str) -> None:
    """NaN, negative, out-of-range or unknown inputs: a UserError naming the option and the fix."""
    args: dict[str, object] = {
        "gpu": "A100",
        "train_hours": 1.0,
        "model_gb": 15.0,
        "data_gb": 1.0,
        "jobs": 1,
        "seeds": 1,
        "dud_rate": None,
        **change,
    }
    with pytest.raises(UserError) as e:
        validate_workload(known_gpus=known_gpus(), **args)  # type: ignore[arg-type]
    assert str(e.value).startswith(option) and "Fix:" in str(e.value)


def test_cli_json_reads_the_dud_rate_from_the_home_reputation_store(tmp_path: Path) -> None:
    """`plan --json` on a home whose store saw 2 duds in 4 rentals: rate 0.5, and the JSON's shape."""
    home = tmp_path / "home"
    engine = make_engine(f"sqlite:///{home / 'tuneharness.db'}")
    init_db(engine)
    seed_reputation(ReputationStore(engine))
    out = cli(home, "--gpu", "A100", "--train-hours", "0.5", "--jobs", "2", "--seeds", "2", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data) == {"workload", "dud_rate", "seeds", "hyperscaler", "naive", "guarded", "unfinished_runs"}
    assert data["dud_rate"] == {"rate": 0.5, "origin": "reputation", "duds": 2, "delivered": 2, "machines": 4}
    assert data["workload"] == {"gpu": "A100", "train_hours": 0.5, "model_gb": 15.0, "data_gb": 1.0, "jobs": 2}
    for key in ("hyperscaler", "naive", "guarded"):
        assert set(data[key]) == {"median_usd", "p10_usd", "p90_usd", "provenance"}
        assert all(isinstance(data[key][k], float) for k in ("median_usd", "p10_usd", "p90_usd"))
    assert set(data["unfinished_runs"]) == {"naive", "guarded"}


def test_cli_table_on_a_fresh_home(tmp_path: Path) -> None:
    """A brand-new home: the field reports' 0.62, a table of three rows, a provenance line each."""
    out = cli(tmp_path / "home", "--gpu", "RTX 3090", "--train-hours", "0.5", "--seeds", "2")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "dud rate 0.62 from the field reports' 62 of 100" in lines[0]
    rows = {line.split()[0]: line for line in lines[2:5]}
    assert set(rows) == {"hyperscaler", "naive", "guarded"}
    assert "no sourced price" in rows["hyperscaler"]
    assert [line.split(":")[0] for line in lines[5:8]] == ["hyperscaler", "naive", "guarded"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--gpu", "A100", "--train-hours", "nan"], "--train-hours"),
        (["--gpu", "A100", "--train-hours", "-2"], "--train-hours"),
        (["--gpu", "Voodoo 2", "--train-hours", "1"], "--gpu"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], option: str) -> None:
    """The CLI refuses NaN, negative and unknown input with one line holding the fix, exit code 2."""
    out = cli(tmp_path / "home", *args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(f"error: {option}") and "Fix:" in out.stderr
