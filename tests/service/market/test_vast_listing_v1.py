"""The Vast.ai adapter on the 2026 API: the paged v1 list, datacenter offers, the SSH fallback
endpoint and pending price increases, against the fake Vast server over real loopback HTTP."""

from __future__ import annotations

import json

import httpx
import pytest

from app.market import AuthFailed, OfferQuery, PriceIncrease, ProviderError
from providers.fakes import FakeVast
from providers.fakes.vast import V0_LIST_GONE
from providers.vast import LIST_PAGE_ROWS, VastMarket

ORDER = [{"col": "id", "dir": "asc"}]


def test_sixty_instances_are_listed_across_three_pages(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Sixty instances come back whole, in three calls of at most 25 rows that follow next_token."""
    ids = [fake_vast.add_instance(label=f"th-job-{i}") for i in range(60)]
    listed = vast.list_instances()
    assert [i.instance_id for i in listed] == ids
    calls = fake_vast.calls_to("/api/v1/instances/")
    assert len(calls) == 3
    for n, call in enumerate(calls):
        assert call.method == "GET"
        assert json.loads(call.query["select_filters"][0]) == {}
        assert json.loads(call.query["order_by"][0]) == ORDER
        assert call.query["limit"] == [str(LIST_PAGE_ROWS)]
        assert ("after_token" in call.query) == (n > 0)
    assert all(c.path != "/api/v0/instances/" for c in fake_vast.calls)


def test_the_label_prefix_filters_across_pages(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Only labels with the prefix are returned, from every page."""
    ours = [fake_vast.add_instance(label=f"th-{i}") for i in range(30)]
    for i in range(30):
        fake_vast.add_instance(label=f"other-{i}")
    assert [i.instance_id for i in vast.list_instances("th-")] == ours


def test_an_empty_account_lists_nothing_in_one_call(vast: VastMarket, fake_vast: FakeVast) -> None:
    """No instances: one call, total 0, an empty list."""
    assert vast.list_instances() == []
    assert len(fake_vast.calls_to("/api/v1/instances/")) == 1


def test_a_listing_short_of_total_instances_is_refused(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A last page that leaves rows missing raises a ProviderError naming both counts."""
    fake_vast.add_instance(label="th-a")
    fake_vast.inject(
        200,
        {
            "success": True,
            "instances_found": 1,
            "total_instances": 2,
            "label_counts": {"th-a": 1},
            "next_token": None,
            "instances": [{"id": 1, "label": "th-a", "actual_status": "running"}],
        },
        match="/api/v1/instances/",
    )
    with pytest.raises(ProviderError, match="1 rows gathered but total_instances is 2"):
        vast.list_instances()


def test_a_listing_without_a_total_is_refused(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A page that does not say `total_instances` cannot prove the listing whole."""
    fake_vast.inject(200, {"success": True, "instances": [], "next_token": None}, match="/api/v1/instances/")
    with pytest.raises(ProviderError, match="incomplete"):
        vast.list_instances()


def test_the_fake_refuses_a_token_it_did_not_issue(fake_vast: FakeVast) -> None:
    """after_token that is not the fake's cursor answers 400 invalid_token."""
    fake_vast.add_instance()
    got = httpx.get(
        f"{fake_vast.url}/api/v1/instances/",
        params={"after_token": "bm90LWEtdG9rZW4="},
        headers={"Authorization": f"Bearer {fake_vast.api_key}"},
    )
    assert got.status_code == 400 and got.json()["error"] == "invalid_token"


def test_the_fake_refuses_a_computed_column_and_clamps_the_page(fake_vast: FakeVast) -> None:
    """A filter on dph_total is 400 invalid_request; a limit above 25 still pages by 25."""
    for _ in range(30):
        fake_vast.add_instance()
    auth = {"Authorization": f"Bearer {fake_vast.api_key}"}
    bad = httpx.get(
        f"{fake_vast.url}/api/v1/instances/",
        params={"select_filters": json.dumps({"dph_total": {"lt": 1}})},
        headers=auth,
    )
    assert bad.status_code == 400 and "dph_total is not a valid search key" in bad.json()["msg"]
    page = httpx.get(f"{fake_vast.url}/api/v1/instances/", params={"limit": "100"}, headers=auth).json()
    assert (page["instances_found"], page["total_instances"]) == (25, 30) and page["next_token"]


def test_the_v0_list_answers_410_gone(fake_vast: FakeVast) -> None:
    """The retired v0 list answers Vast's 410 deprecated_endpoint body."""
    got = httpx.get(f"{fake_vast.url}/api/v0/instances/", headers={"Authorization": f"Bearer {fake_vast.api_key}"})
    assert got.status_code == 410 and got.json() == V0_LIST_GONE


def test_datacenter_only_asks_vast_for_datacenter_hosts(vast: VastMarket, fake_vast: FakeVast) -> None:
    """OfferQuery.datacenter_only sends `datacenter: {eq: true}` and only datacenter offers come back."""
    offers = vast.search_offers(OfferQuery(datacenter_only=True))
    assert [o.offer_id for o in offers] == ["5004"]
    assert fake_vast.calls_to("/bundles/")[-1].body["datacenter"] == {"eq": True}
    everything = vast.search_offers(OfferQuery())
    assert len(everything) == 4 and "datacenter" not in fake_vast.calls_to("/bundles/")[-1].body


def test_a_running_instance_carries_the_proxy_as_its_fallback(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Direct port first, the proxy (ssh_host:ssh_port) second; with no direct port the proxy alone."""
    iid = fake_vast.add_instance(label="th-x")
    fake_vast.boot(iid, ip="203.0.113.8")
    fake_vast.set_instance(iid, ssh_host="ssh3.vast.ai", ssh_port=23001)
    got = vast.status(iid)
    assert got.ssh is not None and got.ssh.host == "203.0.113.8"
    assert got.ssh_fallback is not None and (got.ssh_fallback.host, got.ssh_fallback.port) == ("ssh3.vast.ai", 23001)
    fake_vast.set_instance(iid, ports={})
    alone = vast.status(iid)
    assert alone.ssh is not None and alone.ssh.host == "ssh3.vast.ai" and alone.ssh_fallback is None


def test_pending_price_increases_are_read_as_all_in_dollars_per_hour(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A host's increase reads with old and new $/h (per-second rates times 3600) and its start."""
    iid = fake_vast.add_instance(label="th-p", dph_total=0.36)
    pid = fake_vast.raise_price(iid, new_gpu_costpersec=0.0002, new_disk_ram_costpersec=0.00001)
    (inc,) = vast.pending_price_increases()
    assert (inc.provider, inc.increase_id, inc.instance_id) == ("vast", str(pid), iid)
    assert inc.old_dph_total == pytest.approx(0.36)
    assert inc.new_dph_total == pytest.approx((0.0002 + 0.00001) * 3600)
    assert inc.starts_at is not None


def test_accept_and_reject_send_exactly_the_pending_id(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Both answers PUT `{"pending_price_increase_id": n}` and nothing else; accepting applies the price."""
    a = fake_vast.add_instance(dph_total=0.36)
    b = fake_vast.add_instance(dph_total=0.36)
    pa = fake_vast.raise_price(a, new_gpu_costpersec=0.0001)
    pb = fake_vast.raise_price(b, new_gpu_costpersec=0.001)
    by_instance = {i.instance_id: i for i in vast.pending_price_increases()}
    assert vast.answer_price_increase(by_instance[a], accept=True) is True
    assert vast.answer_price_increase(by_instance[b], accept=False) is True
    accept = fake_vast.calls_to("/api/v0/instances/accept-price-increase/")
    reject = fake_vast.calls_to("/api/v0/instances/reject-price-increase/")
    assert [c.method for c in accept + reject] == ["PUT", "PUT"]
    assert accept[0].body == {"pending_price_increase_id": pa}
    assert reject[0].body == {"pending_price_increase_id": pb}
    assert fake_vast.answered_increases == [(pa, "accept"), (pb, "reject")]
    assert fake_vast.instances[a]["dph_total"] == pytest.approx(0.36)
    assert vast.pending_price_increases() == []


def test_a_stale_increase_is_not_an_error(vast: VastMarket, fake_vast: FakeVast) -> None:
    """An increase answered elsewhere (404 no_pending_price_increase, or 409) returns False."""
    stale = PriceIncrease("vast", "999", "1", 0.3, 0.5, None)
    assert vast.answer_price_increase(stale, accept=False) is False
    fake_vast.inject(409, {"success": False, "error": "conflict"}, match="reject-price-increase")
    assert vast.answer_price_increase(stale, accept=False) is False


def test_the_fake_refuses_an_answer_with_extra_keys(fake_vast: FakeVast) -> None:
    """Any key beside pending_price_increase_id is 400, as Vast's extra='forbid' model answers."""
    iid = fake_vast.add_instance(dph_total=0.2)
    pid = fake_vast.raise_price(iid, new_gpu_costpersec=0.0001)
    got = httpx.put(
        f"{fake_vast.url}/api/v0/instances/accept-price-increase/",
        json={"pending_price_increase_id": pid, "instance_id": int(iid)},
        headers={"Authorization": f"Bearer {fake_vast.api_key}"},
    )
    assert got.status_code == 400 and pid in fake_vast.price_increases


def test_a_404_that_says_auth_error_is_a_refused_key_not_a_gone_instance(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A wrong key answered 404 + auth_error raises AuthFailed; it never reads as a gone instance."""
    iid = fake_vast.add_instance(label="th-k")
    fake_vast.inject(404, {"success": False, "error": "auth_error", "msg": "Invalid user key"})
    with pytest.raises(AuthFailed, match="VAST_API_KEY"):
        vast.status(iid)
