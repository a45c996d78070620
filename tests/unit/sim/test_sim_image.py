"""A trace host's image: bare hosts report only torch, the bootstrap installs the stack in `install_s`."""

from __future__ import annotations

from typing import Any

import pytest

from app.policy.preflight import PreflightReport, judge_preflight
from providers.sim.campaign import Campaign
from providers.sim.observe import bootstrap_s, preflight_report
from providers.sim.trace import TRACE_FORMAT, TraceError, parse_trace


def trace(**truth: Any) -> Any:
    return parse_trace(
        {
            "format": TRACE_FORMAT,
            "name": "image",
            "workload": {"jobs": 1, "image_gb": 1, "model_gb": 1, "train_seconds": 600},
            "hosts": [
                {
                    "machine_id": "m-1",
                    "offer": {"gpu_name": "RTX 4090", "gpu_ram_gb": 24, "dph": 0.4},
                    "truth": {"pull_mbps": 1000, **truth},
                }
            ],
        }
    )


def judged(truth: Any, *, bootstrapped: bool = False) -> str | None:
    report = PreflightReport.from_mapping(preflight_report(truth, bootstrapped=bootstrapped))
    return judge_preflight(report, offered_gpu_name="RTX 4090", offered_gpu_ram_gb=24).failure


def test_hosts_default_to_the_trainer_image() -> None:
    """A trace that says nothing of images offers the trainer image: today's traces run unchanged."""
    truth = trace().hosts[0].truth
    assert (truth.image, bootstrap_s(truth), judged(truth)) == ("trainer", 0.0, None)


def test_a_bare_host_fails_stack_missing_until_bootstrapped() -> None:
    """A bare image reports only torch (`stack_missing`); after the bootstrap, the whole stack."""
    truth = trace(image="bare", install_s=95).hosts[0].truth
    assert judged(truth) == "stack_missing"
    assert judged(truth, bootstrapped=True) is None
    assert (bootstrap_s(truth), bootstrap_s(truth, cached=True)) == (95.0, 0.0)


def test_an_unknown_image_is_refused_by_field() -> None:
    """`image` must name an image the simulator knows; the message says which field and the fix."""
    with pytest.raises(TraceError, match=r"hosts\[0\]\.truth\.image.*Fix"):
        trace(image="cuda-devel")


def run(image: str, *, bootstrap: bool) -> Campaign:
    c = Campaign(
        trace(image=image, install_s=95), "guarded", jobs=None, seed=0, trace_label="image", bootstrap=bootstrap
    )
    c.run()
    return c


def started_at(c: Campaign) -> float:
    return float(min(e["t_s"] for e in c.ledger if e["kind"] == "training_started"))


def test_the_campaign_bootstraps_a_bare_host_in_its_install_time() -> None:
    """Bare and trainer hosts both train; on the bare one training starts `install_s` later."""
    bare, ready = run("bare", bootstrap=True), run("trainer", bootstrap=True)
    assert not bare.failed and not ready.failed
    assert started_at(bare) - started_at(ready) == pytest.approx(95.0)


def test_without_the_bootstrap_a_bare_host_fails_stack_missing() -> None:
    """With the bootstrap off, the bare host's preflight fails by name and training never starts there."""
    c = run("bare", bootstrap=False)
    assert any(e.get("reason") == "stack_missing" for e in c.ledger)
    assert not any(e["kind"] == "training_started" for e in c.ledger)
