"""bench/scale.py's pieces that decide what it reports: the simulated fleet's edge (market and
probe answered from one truth file) and the growth exponent. No bench runs and no timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

from app.services.supervisor import _probe_command, parse_probe_output
from bench.scale import exponent, plot, tables
from bench.scale_worker import EdgeMarket, EdgeShell, Truth, instance_of


def _truth(tmp_path: Path) -> Truth:
    return Truth(
        {
            "n": 3,
            "t0": 1000.0,
            "edge": True,
            "losses": {instance_of(1): 0.0},
            "hangs": {instance_of(2): 1030.0},
            "labels": {instance_of(0): "th-scale-j00000-a1"},
            "dir": str(tmp_path),
            "ssh": None,
        }
    )


def test_the_edge_market_reports_a_lost_host_gone_and_a_hung_one_idle(tmp_path: Path) -> None:
    """A host past its loss moment is gone; a hung one runs with its GPU idle; others run busy."""
    market = EdgeMarket(_truth(tmp_path))
    healthy, lost, hung = (market.status(instance_of(i)) for i in range(3))
    assert lost.state == "gone"
    assert healthy.state == "running" and healthy.gpu_util == 97.0 and healthy.label == "th-scale-j00000-a1"
    assert hung.state == "running" and hung.gpu_util == 0.0
    assert market.status("sim-s00099").state == "gone"  # not in the fleet


def test_the_edge_probe_reads_like_the_trainer_and_freezes_at_a_hang(tmp_path: Path) -> None:
    """The probe's answer parses as the supervisor parses a host's; a hung trainer's step and heartbeat stop."""
    truth = _truth(tmp_path)
    command = _probe_command("tuneharness-jobs/scale-j00002")
    first = parse_probe_output(EdgeShell(truth, instance_of(0)).run(command).stdout)
    assert first["alive"] and first["status"]["phase"] == "training" and first["status"]["step"] >= 1
    hung = [parse_probe_output(EdgeShell(truth, instance_of(2)).run(command).stdout)["status"] for _ in range(2)]
    assert hung[0]["step"] == hung[1]["step"] == 10 and hung[0]["updated_at"] == hung[1]["updated_at"]


def _run(n: int, cpu: float) -> dict[str, object]:
    return {
        "n": n,
        "transport": "edge",
        "cpu_s_per_job_hour": cpu,
        "cpu_ms_per_poll": 1.0,
        "redis_cmds_per_job_minute": 10.0,
        "db_rows_per_job_hour": 100.0,
        "ledger_rows_per_job_hour": 0.0,
        "db_kib_per_job_hour": 5.0,
        "lag_s_p50": 0.1,
        "lag_s_p99": 1.0,
        "loss_detect_s_p99": 30.0,
        "hang_detect_s_p99": 80.0,
        "longest_sweep_s": 1.0,
        "longest_sweep": "reaper",
        "polls_per_s": 3.3,
        "polls_needed_per_s": 3.3,
        "processes_needed": 1,
        "workers": 1,
        "concurrency": 2,
        "window_s": 100.0,
    }


def test_a_flat_cost_per_job_grows_with_exponent_one_and_a_doubling_cost_shows() -> None:
    """Per-job cost flat in N: exponent 1.0; per-job cost growing as N: exponent 2.0."""
    flat = [_run(n, 2.0) for n in (100, 1000, 10000)]
    assert exponent(flat, "cpu_s_per_job_hour") == 1.0
    growing = [_run(n, n / 100) for n in (100, 1000, 10000)]
    assert exponent(growing, "cpu_s_per_job_hour") == 2.0
    assert exponent(flat[:1], "cpu_s_per_job_hour") is None


def test_the_tables_and_the_plot_hold_every_run(tmp_path: Path) -> None:
    """One row per N in the scale table, the growth exponents in its note, and a plot with a point per N."""
    runs = [_run(n, 2.0) for n in (100, 1000)]
    (scale,) = tables(runs)  # type: ignore[arg-type]
    assert [r[0] for r in scale["rows"]] == [100, 1000] and "Growth exponents" in scale["note"]
    svg = tmp_path / "scale.svg"
    plot(runs, svg)  # type: ignore[arg-type]
    assert svg.read_text().count("<circle") == 2 * 6
    json.dumps(scale)  # a results file holds it as JSON
