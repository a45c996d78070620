"""The simulated marketplace reproduces each truth field on a virtual clock (no sleeping)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from app.market import LaunchSpec, Market, OfferGone, OfferQuery
from providers.sim import SimMarket, VirtualClock
from providers.sim.observe import CUDA_DRIVER_ERROR, preflight_report
from providers.sim.trace import TRACE_FORMAT, parse_trace

# 3 GB at 400 Mb/s: the pull takes exactly 60 s.
BASE_OFFER = {
    "gpu_name": "RTX 3090",
    "gpu_ram_gb": 24,
    "dph": 0.36,
    "storage_per_gb_month": 0.15,
    "inet_down_per_gb": 0.02,
    "reliability": 0.99,
}


def make_market(*truths: dict[str, Any], disk_gb: float = 20.0) -> tuple[SimMarket, VirtualClock]:
    hosts = [
        {
            "machine_id": f"m-{i}",
            "offer": {**BASE_OFFER, "dph": BASE_OFFER["dph"] + i / 100},
            "truth": {"pull_mbps": 400, **t},
        }
        for i, t in enumerate(truths)
    ]
    trace = parse_trace(
        {
            "format": TRACE_FORMAT,
            "name": "t",
            "workload": {"image_gb": 2, "model_gb": 1, "disk_gb": disk_gb},
            "hosts": hosts,
        }
    )
    clock = VirtualClock(start_s=1000.0)
    return SimMarket(trace, clock), clock


def spec(label: str = "job-1/a") -> LaunchSpec:
    return LaunchSpec(image="pytorch/pytorch:2.5.1", disk_gb=0, label=label, ssh_public_key="ssh-ed25519 AAAA test")


def rent(market: SimMarket, machine_id: str = "m-0", label: str = "job-1/a") -> str:
    offer = next(o for o in market.search_offers(OfferQuery(limit=0)) if o.machine_id == machine_id)
    return market.create(offer, spec(label))


def test_sim_market_implements_the_port() -> None:
    """SimMarket satisfies the Market protocol."""
    market, _ = make_market({})
    assert isinstance(market, Market)


def test_healthy_host_loads_then_runs_with_progress_every_refresh() -> None:
    """A healthy host reports two-decimal pull progress every status_every_s from t=0, then runs."""
    market, clock = make_market({"status_every_s": 10})
    iid = rent(market)
    first = market.status(iid)
    assert (first.state, first.status_line, first.ssh) == ("loading", "Downloading 0.00/3.00 GB", None)
    clock.advance(9.9)
    assert market.status(iid).status_line == "Downloading 0.00/3.00 GB"
    clock.advance(0.1)
    assert market.status(iid).status_line == "Downloading 0.50/3.00 GB"
    clock.advance(33)  # t=43: last refresh at 40 s -> 2.00 GB
    assert market.status(iid).status_line == "Downloading 2.00/3.00 GB"
    clock.advance(17)  # t=60: pull complete
    inst = market.status(iid)
    assert inst.state == "running" and inst.ssh is not None and inst.gpu_util == 95.0
    assert inst.machine_id == "m-0" and inst.dph_total == pytest.approx(0.36)


def test_slow_reporter_shows_nothing_for_its_whole_cadence_from_the_start() -> None:
    """A host reporting every 150 s shows 0.00 GB for 150 s although it is pulling fine."""
    market, clock = make_market({"status_every_s": 150, "pull_mbps": 40})  # 600 s pull
    iid = rent(market)
    clock.advance(149)
    assert market.status(iid).status_line == "Downloading 0.00/3.00 GB"
    clock.advance(1)
    assert market.status(iid).status_line == "Downloading 0.75/3.00 GB"
    clock.advance(450)
    assert market.status(iid).state == "running"


def test_freeze_stops_the_line_forever_and_never_gets_ready() -> None:
    """freeze_at_s: the status line stops changing and the host never becomes ready."""
    market, clock = make_market({"freeze_at_s": 25})
    iid = rent(market)
    clock.advance(25)
    frozen = market.status(iid).status_line
    assert frozen == "Downloading 1.00/3.00 GB"
    clock.advance(10_000)
    inst = market.status(iid)
    assert (inst.state, inst.status_line) == ("loading", frozen)
    assert market.referee.bill(iid).downloaded_gb == pytest.approx(25 * 400 / 8000)


def test_fatal_status_appears_at_that_instant_not_at_the_next_refresh() -> None:
    """fatal_at_s: the line becomes fatal_status exactly then; state stays loading for ever."""
    market, clock = make_market({"status_every_s": 30, "fatal_at_s": 17, "fatal_status": "OCI runtime create failed"})
    iid = rent(market)
    clock.advance(16.9)
    assert market.status(iid).status_line == "Downloading 0.00/3.00 GB"
    clock.advance(0.1)
    assert market.status(iid).status_line == "OCI runtime create failed"
    clock.advance(3600)
    assert (market.status(iid).state, market.status(iid).status_line) == ("loading", "OCI runtime create failed")


def test_computes_false_boots_healthy_but_preflight_reports_the_cuda_error() -> None:
    """computes:false runs and looks healthy to the market; only a preflight sees the CUDA error."""
    market, clock = make_market({"computes": False})
    iid = rent(market)
    assert market.referee.preflight_report(iid) is None  # not running yet: no SSH
    clock.advance(60)
    assert market.status(iid).state == "running"
    report = market.referee.preflight_report(iid)
    assert report is not None
    assert report["ok"] is False and report["cuda_initialised"] is False and report["error"] == CUDA_DRIVER_ERROR


def test_misreported_hardware_shows_only_in_the_preflight() -> None:
    """The offer claims RTX 3090 with 24 GB; the preflight reports the actual card."""
    market, clock = make_market({"actual_gpu_name": "RTX 3080", "actual_gpu_ram_gb": 10})
    offer = market.search_offers(OfferQuery())[0]
    assert (offer.gpu_name, offer.gpu_ram_gb) == ("RTX 3090", 24)
    iid = market.create(offer, spec())
    clock.advance(60)
    report = market.referee.preflight_report(iid)
    assert report is not None and (report["gpu_name"], report["vram_gb"]) == ("RTX 3080", 10)


def test_tflops_factor_scales_the_measured_throughput() -> None:
    """A 22% throttled host measures 78% of the model's full bf16 TFLOP/s."""
    healthy = preflight_report(make_market({})[0].trace.hosts[0].truth)
    throttled = preflight_report(make_market({"tflops_factor": 0.78})[0].trace.hosts[0].truth)
    assert throttled["tflops_bf16"] == pytest.approx(healthy["tflops_bf16"] * 0.78, rel=1e-3)


def test_dies_at_s_makes_it_gone_stops_billing_and_relists_the_machine() -> None:
    """dies_at_s: state gone, no SSH, billing stops at that instant, the offer is listed again."""
    market, clock = make_market({"dies_at_s": 300})
    iid = rent(market)
    assert market.search_offers(OfferQuery()) == []
    clock.advance(299)
    assert market.status(iid).state == "running"
    clock.advance(1)
    inst = market.status(iid)
    assert (inst.state, inst.ssh) == ("gone", None)
    clock.advance(3600)
    bill = market.referee.bill(iid)
    assert bill.ended_at == 1300.0 and bill.end_reason == "died"
    assert bill.gpu_seconds == pytest.approx(300)
    assert [o.machine_id for o in market.search_offers(OfferQuery())] == ["m-0"]
    assert market.list_instances() == []


def test_hangs_at_s_keeps_it_running_with_zero_gpu_utilisation() -> None:
    """hangs_at_s: the host is alive and billed, GPU utilisation 0."""
    market, clock = make_market({"hangs_at_s": 200})
    iid = rent(market)
    clock.advance(199)
    assert market.status(iid).gpu_util == 95.0
    clock.advance(1)
    inst = market.status(iid)
    assert (inst.state, inst.gpu_util) == ("running", 0.0)


def test_destroyed_machine_is_relisted_with_the_same_truth() -> None:
    """After destroy the machine's offer returns (new offer id) and a dud stays a dud."""
    market, clock = make_market({"freeze_at_s": 5})
    first = market.search_offers(OfferQuery())[0]
    iid = market.create(first, spec())
    clock.advance(10)
    market.destroy(iid)
    again = market.search_offers(OfferQuery())[0]
    assert again.machine_id == first.machine_id and again.offer_id != first.offer_id
    with pytest.raises(OfferGone):
        market.create(first, spec())  # the old ask is gone
    iid2 = market.create(again, spec())
    clock.advance(3600)
    assert market.status(iid2).state == "loading"
    assert market.referee.truth_of(iid2) == market.referee.truth_of(iid)


def test_renting_a_taken_offer_raises_offer_gone() -> None:
    """An offer taken between search and create raises OfferGone."""
    market, _ = make_market({})
    offer = market.search_offers(OfferQuery())[0]
    market.create(offer, spec())
    with pytest.raises(OfferGone):
        market.create(offer, spec())


def test_billing_arithmetic_gpu_storage_traffic() -> None:
    """GPU bills create->stop (pull included), storage create->destroy (also stopped), traffic per GB."""
    market, clock = make_market({}, disk_gb=72.0)
    iid = rent(market)
    clock.advance(1800)  # 30 min running (pull included)
    market.stop(iid)
    assert market.status(iid).state == "stopped"
    clock.advance(3600)  # 1 h stopped: storage only
    market.start(iid)
    clock.advance(1800)
    market.destroy(iid)
    clock.advance(7200)  # nothing after destroy
    bill = market.referee.bill(iid)
    assert bill.gpu_seconds == pytest.approx(3600)
    assert bill.gpu_usd == pytest.approx(0.36)
    assert bill.storage_usd == pytest.approx(0.15 * 72 * 2 / 720)  # 2 h of life
    assert bill.traffic_usd == pytest.approx(0.02 * 3.0)
    assert bill.total_usd == pytest.approx(0.36 + 0.03 + 0.06)
    assert (bill.created_at, bill.ended_at, bill.end_reason) == (1000.0, 8200.0, "destroyed")
    assert market.status(iid).state == "gone"


def test_storage_keeps_billing_while_stopped_until_the_campaign_asks() -> None:
    """A stopped, undestroyed instance bills storage up to now and no GPU."""
    market, clock = make_market({}, disk_gb=720.0)
    iid = rent(market)
    market.stop(iid)
    clock.advance(3600)
    bill = market.referee.bill(iid)
    assert (bill.gpu_usd, bill.ended_at) == (0.0, None)
    assert bill.storage_usd == pytest.approx(0.15)


def test_list_instances_by_label_prefix_and_no_truth_in_what_renters_see() -> None:
    """Listing filters by label prefix; Offer and Instance records carry no truth."""
    market, clock = make_market({"computes": False}, {}, {})
    a = rent(market, "m-0", "job-1/a")
    b = rent(market, "m-1", "job-1/b")
    c = rent(market, "m-2", "job-2/a")
    assert {i.instance_id for i in market.list_instances("job-1/")} == {a, b}
    assert {i.instance_id for i in market.list_instances()} == {a, b, c}
    market.destroy(b)
    assert {i.instance_id for i in market.list_instances("job-1/")} == {a}
    clock.advance(60)
    seen = repr(market.status(a)) + repr(dict(market.status(a).raw))
    market.destroy(a)
    seen += "".join(repr(o) + repr(dict(o.raw)) for o in market.search_offers(OfferQuery()))
    for secret in ("computes", "pull_mbps", "tflops", "freeze", "truth", "actual_gpu"):
        assert secret not in seen


def test_search_filters_and_sorts_by_price() -> None:
    """Search honours GPU name, VRAM, max price and limit, cheapest first."""
    market, _ = make_market({}, {}, {})
    assert [o.machine_id for o in market.search_offers(OfferQuery())] == ["m-0", "m-1", "m-2"]
    assert [o.machine_id for o in market.search_offers(OfferQuery(max_dph=0.365))] == ["m-0"]
    assert market.search_offers(OfferQuery(gpu_names=("RTX 4090",))) == []
    assert market.search_offers(OfferQuery(min_gpu_ram_gb=48)) == []
    assert len(market.search_offers(OfferQuery(limit=2))) == 2


def test_unknown_instance_is_gone_and_destroy_is_idempotent() -> None:
    """An unknown id reports gone; destroying twice is not an error; stop on gone is a no-op."""
    market, _ = make_market({})
    assert market.status("sim-999").state == "gone"
    iid = rent(market)
    market.destroy(iid)
    market.destroy(iid)
    market.stop(iid)
    assert market.status(iid).state == "gone"


def test_both_freeze_and_fatal_the_earlier_wins() -> None:
    """With freeze before fatal, the line freezes and the fatal text never appears."""
    market, clock = make_market({"freeze_at_s": 10, "fatal_at_s": 40, "fatal_status": "boom"})
    iid = rent(market)
    clock.advance(100)
    assert market.status(iid).status_line == "Downloading 0.50/3.00 GB"


def test_shipped_traces_load_and_marketplace_has_62_duds() -> None:
    """The shipped traces validate; 62 of the marketplace's 100 hosts never deliver a working GPU."""
    from providers.sim import load_trace

    assert [h.machine_id for h in load_trace("smoke").hosts] == ["m-frozen", "m-fatal", "m-stale", "m-good"]
    trace = load_trace("marketplace")
    assert len(trace.hosts) == 100

    def dud(h: Any) -> bool:
        t, o = h.truth, h.offer
        pull = trace.workload.download_gb * 8000 / t.pull_mbps
        return (
            t.freeze_at_s is not None
            or t.fatal_at_s is not None
            or not t.computes
            or t.actual_gpu_name != o.gpu_name
            or t.actual_gpu_ram_gb < 0.95 * o.gpu_ram_gb
            or t.tflops_factor < 0.85
            or (t.dies_at_s is not None and t.dies_at_s <= pull)
        )

    assert sum(dud(h) for h in trace.hosts) == 62
    assert any(h.truth.tflops_factor == 0.78 and h.offer.reliability == 1.0 for h in trace.hosts)
    adv = load_trace("adversarial")
    cheapest = sorted(adv.hosts, key=lambda h: h.offer.dph)[:10]
    assert all(dud(h) for h in cheapest)


def test_trace_copy_is_unaffected_by_renting() -> None:
    """Renting never mutates the trace (a dud stays a dud across markets)."""
    market, clock = make_market({"freeze_at_s": 5})
    before = copy.deepcopy(market.trace)
    rent(market)
    clock.advance(100)
    assert market.trace == before
