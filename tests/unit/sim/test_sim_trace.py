"""Trace validation: a malformed trace is refused naming the host index and the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.errors import UserError
from providers.sim.trace import TRACE_FORMAT, TraceError, load_trace, parse_trace


def trace_with(host: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    good = {"machine_id": "m-1", "offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24, "dph": 0.11}}
    hosts = [good, {**good, "machine_id": "m-2", **(host or {})}]
    return {"format": TRACE_FORMAT, "name": "t", "workload": {"image_gb": 8, "model_gb": 15}, "hosts": hosts, **top}


@pytest.mark.parametrize(
    ("host", "where"),
    [
        ({"truth": {"freeze_at_s": "soon"}}, "hosts[1].truth.freeze_at_s"),
        ({"truth": {"pull_mbps": 0}}, "hosts[1].truth.pull_mbps"),
        ({"truth": {"computes": "no"}}, "hosts[1].truth.computes"),
        ({"truth": {"fatal_at_s": 10}}, "hosts[1].truth.fatal_status"),
        ({"truth": {"fatal_status": "boom"}}, "hosts[1].truth.fatal_at_s"),
        ({"truth": {"freze_at_s": 10}}, "hosts[1].truth.freze_at_s"),
        ({"truth": {"tflops_factor": -1}}, "hosts[1].truth.tflops_factor"),
        ({"offer": {"gpu_name": "RTX 3090", "gpu_ram_gb": 24}}, "hosts[1].offer.dph"),
        ({"offer": {"gpu_name": "", "gpu_ram_gb": 24, "dph": 1}}, "hosts[1].offer.gpu_name"),
        ({"offer": {"gpu_name": "x", "gpu_ram_gb": 24, "dph": 1, "reliability": 1.5}}, "hosts[1].offer.reliability"),
        ({"offer": {"gpu_name": "x", "gpu_ram_gb": 24, "dph": 1, "num_gpus": 1.5}}, "hosts[1].offer.num_gpus"),
        ({"machine_id": "m-1"}, "hosts[1].machine_id"),
        ({"truth": [1]}, "hosts[1].truth"),
    ],
)
def test_malformed_host_is_refused_naming_index_and_field(host: dict[str, Any], where: str) -> None:
    """Each malformed field is reported as hosts[i].<section>.<field> with a fix."""
    with pytest.raises(TraceError) as err:
        parse_trace(trace_with(host), source="bad.json")
    assert where in str(err.value) and "Fix:" in str(err.value)
    assert isinstance(err.value, UserError) and err.value.exit_code == 2


def test_wrong_format_and_empty_hosts_are_refused() -> None:
    """The format tag and a non-empty host list are required."""
    with pytest.raises(TraceError, match="format"):
        parse_trace(trace_with(format="other/1"))
    with pytest.raises(TraceError, match="hosts"):
        parse_trace(trace_with(hosts=[]))
    with pytest.raises(TraceError, match=r"workload\.jobs"):
        parse_trace(trace_with(workload={"jobs": 0}))


def test_unspecified_truth_defaults_to_healthy() -> None:
    """A host without truth delivers what it offers and pulls at its advertised speed."""
    trace = parse_trace(
        trace_with({"offer": {"gpu_name": "RTX 4090", "gpu_ram_gb": 24, "dph": 0.3, "inet_down_mbps": 640}})
    )
    t = trace.hosts[1].truth
    assert (t.computes, t.actual_gpu_name, t.actual_gpu_ram_gb, t.tflops_factor) == (True, "RTX 4090", 24, 1.0)
    assert (t.freeze_at_s, t.fatal_at_s, t.dies_at_s, t.hangs_at_s, t.status_every_s) == (None, None, None, None, 10.0)
    assert t.pull_mbps == 640


def test_load_trace_reports_bad_json_with_its_line(tmp_path: Path) -> None:
    """A file that is not JSON is refused with the line number."""
    p = tmp_path / "t.json"
    p.write_text('{"format":\n  oops}', encoding="utf-8")
    with pytest.raises(TraceError, match="line 2"):
        load_trace(p)
    p.write_text(json.dumps(trace_with()), encoding="utf-8")
    assert load_trace(p).name == "t"
    with pytest.raises(TraceError, match="no shipped trace"):
        load_trace("nonesuch")


def test_shipped_traces_are_what_the_generator_writes() -> None:
    """The committed traces match `python -m providers.sim.make_traces` (seeded)."""
    from providers.sim.make_traces import main

    assert main(["--check"]) == 0


def test_cli_help_names_every_shipped_trace() -> None:
    """`--trace`'s help lists exactly the traces that ship, so a new trace cannot go unmentioned."""
    from app.cli.sim_cmd import TRACE_HELP
    from providers.sim.trace import TRACES_DIR

    named = {n.strip() for n in TRACE_HELP.split(":", 1)[1].split(",")}
    assert named == {p.stem for p in TRACES_DIR.glob("*.json")}
