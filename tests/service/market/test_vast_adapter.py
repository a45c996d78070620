"""The Vast.ai adapter against the fake Vast server over real loopback HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import SettingsError
from app.market import (
    AuthFailed,
    LaunchSpec,
    Market,
    OfferGone,
    OfferQuery,
    ProviderBusy,
    ProviderError,
    QuotaExhausted,
)
from providers.fakes import FakeVast
from providers.http import RetryPolicy
from providers.vast import VastMarket, vast_instance

SPEC = LaunchSpec(
    image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime",
    disk_gb=60,
    label="th-job-7",
    ssh_public_key="ssh-ed25519 AAAAC3Nz job-7",
    env={"JOB": "7"},
    onstart="touch /ready",
)


def _offer(vast: VastMarket, offer_id: str) -> Any:
    return next(o for o in vast.search_offers(OfferQuery()) if o.offer_id == offer_id)


def test_adapter_implements_the_market_port(vast: VastMarket) -> None:
    """VastMarket satisfies the Market protocol and is named `vast`."""
    assert isinstance(vast, Market)
    assert vast.name == "vast"


def test_search_normalises_offers_and_pushes_filters(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Offers come back cheapest first with gpu_ram in GB; the request carries Bearer auth and Vast's filters."""
    offers = vast.search_offers(OfferQuery(min_gpu_ram_gb=24, disk_gb=50))
    assert [o.offer_id for o in offers] == ["5003", "5001", "5002", "5004"]
    first = offers[0]
    assert (first.provider, first.machine_id, first.gpu_name, first.num_gpus) == ("vast", "43", "RTX 3090", 1)
    assert first.gpu_ram_gb == pytest.approx(24.58)  # 24576 MB
    assert (first.dph_total, first.storage_per_gb_month, first.inet_down_per_gb) == (0.09, 0.40, 0.020)
    assert (first.inet_down_mbps, first.reliability, first.cuda_max) == (90.0, 0.91, "12.4")
    assert first.raw["host_id"] == 943
    (call,) = fake_vast.calls
    assert (call.method, call.path) == ("POST", "/api/v0/bundles/")
    assert call.authorized and call.headers["authorization"] == "Bearer <redacted>"
    assert call.body["gpu_ram"] == {"gte": 24000.0}  # GB filter sent in MB
    assert call.body["rentable"] == {"eq": True} and call.body["rented"] == {"eq": False}
    assert call.body["verified"] == {"eq": True} and call.body["external"] == {"eq": False}
    assert call.body["order"] == [["dph_total", "asc"]] and call.body["type"] == "on-demand"
    assert call.body["allocated_storage"] == 50


def test_search_accepts_gpu_names_with_underscores(vast: VastMarket, fake_vast: FakeVast) -> None:
    """`RTX_4090` is sent as Vast's spaced name and only that GPU comes back."""
    offers = vast.search_offers(OfferQuery(gpu_names=("RTX_4090",)))
    assert [o.gpu_name for o in offers] == ["RTX 4090"]
    assert fake_vast.calls[0].body["gpu_name"] == {"eq": "RTX 4090"}


def test_search_skips_malformed_offers(vast: VastMarket, fake_vast: FakeVast) -> None:
    """An offer without a price is left out instead of breaking the whole search."""
    fake_vast.add_offer(id=6001, dph_total=None)
    assert "6001" not in [o.offer_id for o in vast.search_offers(OfferQuery())]


def test_create_sends_the_launch_spec_and_attaches_the_ssh_key(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Create PUTs the ask with image, disk, env, onstart and label, then POSTs the job's SSH key."""
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    put = fake_vast.calls_to("/api/v0/asks/5001/")[0]
    assert put.method == "PUT"
    assert put.body == {
        "client_id": "me",
        "image": SPEC.image,
        "disk": 60,
        "env": {"JOB": "7"},
        "onstart": "touch /ready",
        "runtype": "ssh_direc ssh_proxy",
        "label": "th-job-7",
        "cancel_unavail": True,
    }
    ssh = fake_vast.calls_to(f"/api/v0/instances/{instance_id}/ssh/")[0]
    assert ssh.body == {"ssh_key": "ssh-ed25519 AAAAC3Nz job-7"}
    got = vast.status(instance_id)
    assert (got.state, got.ssh, got.label, got.machine_id, got.dph_total) == ("pending", None, "th-job-7", "41", 0.11)


def test_a_failed_key_upload_does_not_lose_the_new_instance(vast: VastMarket, fake_vast: FakeVast) -> None:
    """The instance exists once the ask is accepted: create returns its id even if the SSH key upload fails."""
    fake_vast.inject(500, {"success": False, "error": "internal", "msg": "oops"}, match="/ssh/")
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    assert instance_id in fake_vast.instances


def test_create_of_a_taken_offer_is_offer_gone_and_not_retried(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Between search and create someone rents the offer: 404 no_such_ask becomes OfferGone after one call."""
    offer = _offer(vast, "5002")
    fake_vast.take_offer("5002")
    fake_vast.clear_calls()
    with pytest.raises(OfferGone, match="no_such_ask"):
        vast.create(offer, SPEC)
    assert len(fake_vast.calls) == 1


def test_running_instance_has_direct_ssh_from_the_string_host_port(vast: VastMarket, fake_vast: FakeVast) -> None:
    """HostPort arrives as a string; the endpoint is public_ipaddr with that port as an int."""
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    fake_vast.boot(instance_id, ip="203.0.113.50", status_msg="success, running pytorch/pytorch_2.4")
    raw_port = fake_vast.instances[instance_id]["ports"]["22/tcp"][0]["HostPort"]
    assert isinstance(raw_port, str)
    got = vast.status(instance_id)
    assert got.state == "running"
    assert got.ssh is not None and (got.ssh.host, got.ssh.port, got.ssh.user) == ("203.0.113.50", int(raw_port), "root")
    assert got.status_line == "success, running pytorch/pytorch_2.4"
    assert got.gpu_util == 0.0 and got.started_at is not None
    status_call = fake_vast.calls_to(f"/api/v0/instances/{instance_id}/")[-1]
    assert status_call.query == {"owner": ["me"]}


def test_ssh_falls_back_to_the_proxy_without_a_direct_port(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A running instance with no 22/tcp mapping is reached through ssh_host:ssh_port."""
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    fake_vast.boot(instance_id)
    fake_vast.set_instance(instance_id, ports={}, ssh_host="ssh4.vast.ai", ssh_port=22714)
    got = vast.status(instance_id)
    assert got.ssh is not None and (got.ssh.host, got.ssh.port) == ("ssh4.vast.ai", 22714)


def test_an_instance_reported_null_under_the_plural_key_is_gone(vast: VastMarket, fake_vast: FakeVast) -> None:
    """`{"instances": null}` (Vast's answer once the host is gone) reads as state gone."""
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    fake_vast.vanish(instance_id)
    got = vast.status(instance_id)
    assert (got.state, got.instance_id, got.ssh) == ("gone", instance_id, None)


def test_an_instance_answered_404_is_gone(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A 404 on the instance is gone too, not an error."""
    fake_vast.gone_as_404 = True
    assert vast.status("123").state == "gone"


@pytest.mark.parametrize(
    ("fields", "state"),
    [
        ({"actual_status": None, "intended_status": "running"}, "pending"),
        ({"actual_status": "created", "intended_status": "running"}, "pending"),
        ({"actual_status": "loading", "intended_status": "running"}, "loading"),
        ({"actual_status": "rebooting", "intended_status": "running"}, "loading"),
        ({"actual_status": "running", "intended_status": "running"}, "running"),
        ({"actual_status": "exited", "intended_status": "running"}, "exited"),
        ({"actual_status": "exited", "intended_status": "stopped"}, "stopped"),
        ({"actual_status": "stopped", "intended_status": "stopped"}, "stopped"),
        ({"actual_status": "offline", "intended_status": "running"}, "unknown"),
        ({"actual_status": "unknown", "intended_status": "running"}, "unknown"),
    ],
)
def test_vast_statuses_map_to_our_states(fields: dict[str, Any], state: str) -> None:
    """Each documented actual_status maps to one of our instance states."""
    assert vast_instance({"id": 1, **fields}, "1").state == state


def test_ssh_is_withheld_until_running() -> None:
    """A loading instance already has proxy fields but no usable endpoint yet."""
    rec = {"id": 1, "actual_status": "loading", "ssh_host": "ssh1.vast.ai", "ssh_port": 1234, "ports": {}}
    assert vast_instance(rec, "1").ssh is None


def test_plain_text_429_is_retried_until_it_passes(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Two plain-text 429s, then success: three calls, no error."""
    fake_vast.inject(429, "API requests too frequent", times=2)
    assert vast.search_offers(OfferQuery())
    assert len(fake_vast.calls) == 3


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (429, {"detail": "Too many requests"}),
        (429, {"success": False, "error": "rate_limit_exceeded", "msg": "slow down"}),
        (502, "<html>Bad Gateway</html>"),
        (503, "Service Unavailable"),
        (504, "Gateway Timeout"),
    ],
)
def test_busy_answers_are_retried_a_bounded_number_of_times(
    vast: VastMarket, fake_vast: FakeVast, retry: RetryPolicy, status: int, body: Any
) -> None:
    """A vendor that stays busy costs exactly `attempts` calls, then ProviderBusy says it gave up."""
    fake_vast.inject(status, body, times=100)
    with pytest.raises(ProviderBusy, match="gave up after 4 tries") as err:
        vast.list_instances()
    assert err.value.status_code == status and err.value.provider == "vast"
    assert len(fake_vast.calls) == retry.attempts


def test_daily_search_quota_is_not_retried(vast: VastMarket, fake_vast: FakeVast) -> None:
    """search_quota_exceeded (a 429) becomes QuotaExhausted after one call."""
    fake_vast.quota_exceeded = True
    with pytest.raises(QuotaExhausted, match="daily"):
        vast.search_offers(OfferQuery())
    assert len(fake_vast.calls) == 1


def test_a_refused_key_is_auth_failed_and_never_shown(fake_vast: FakeVast, retry: RetryPolicy) -> None:
    """A wrong key gets 401 -> AuthFailed naming VAST_API_KEY; the key is in no message or repr."""
    secret = "sk-wrong-0123456789"
    market = VastMarket(api_key=secret, api_url=fake_vast.url, retry=retry)
    with pytest.raises(AuthFailed, match="VAST_API_KEY") as err:
        market.search_offers(OfferQuery())
    assert err.value.__cause__ is None and err.value.__suppress_context__
    assert secret not in str(err.value) and secret not in repr(market)
    assert len(fake_vast.calls) == 1 and not fake_vast.calls[0].authorized
    assert secret not in repr(fake_vast.calls[0])


def test_a_vendor_message_echoing_the_key_is_redacted(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Whatever the vendor says, the key does not reach our error message."""
    fake_vast.inject(400, {"success": False, "error": "bad_request", "msg": f"key {fake_vast.api_key} is odd"})
    with pytest.raises(ProviderError) as err:
        vast.list_instances()
    assert fake_vast.api_key not in str(err.value) and "***" in str(err.value)


def test_a_create_is_not_retried_after_a_502(vast: VastMarket, fake_vast: FakeVast) -> None:
    """After a 502 the instance may exist: create raises ProviderBusy after one call instead of renting twice."""
    offer = _offer(vast, "5001")
    fake_vast.clear_calls()
    fake_vast.inject(502, "Bad Gateway", match="/asks/")
    with pytest.raises(ProviderBusy):
        vast.create(offer, SPEC)
    assert len(fake_vast.calls_to("/asks/")) == 1


def test_a_create_is_retried_after_a_429(vast: VastMarket, fake_vast: FakeVast) -> None:
    """A 429 means the vendor did nothing: the create is tried again and succeeds."""
    offer = _offer(vast, "5001")
    fake_vast.inject(429, "API requests too frequent", match="/asks/")
    assert vast.create(offer, SPEC)
    assert len(fake_vast.calls_to("/asks/")) == 2


def test_stop_start_and_destroy(vast: VastMarket, fake_vast: FakeVast) -> None:
    """Stop and start PUT the state; destroy DELETEs, and destroying again is not an error."""
    instance_id = vast.create(_offer(vast, "5001"), SPEC)
    fake_vast.boot(instance_id)
    vast.stop(instance_id)
    assert vast.status(instance_id).state == "stopped"
    vast.start(instance_id)
    assert vast.status(instance_id).state == "loading"
    puts = [c.body for c in fake_vast.calls_to(f"/api/v0/instances/{instance_id}/") if c.method == "PUT"]
    assert puts == [{"state": "stopped"}, {"state": "running"}]
    vast.destroy(instance_id)
    vast.destroy(instance_id)
    assert vast.status(instance_id).state == "gone"


def test_stopping_a_gone_instance_says_so(vast: VastMarket) -> None:
    """Stop of an instance Vast does not know is a ProviderError with status 404."""
    with pytest.raises(ProviderError, match="gone") as err:
        vast.stop("999")
    assert err.value.status_code == 404


def test_list_filters_by_label_prefix(vast: VastMarket) -> None:
    """Only instances whose label starts with the prefix are listed."""
    a = vast.create(_offer(vast, "5001"), SPEC)
    vast.create(_offer(vast, "5002"), LaunchSpec(image="x", disk_gb=10, label="other-1", ssh_public_key=""))
    assert [i.instance_id for i in vast.list_instances("th-")] == [a]
    assert len(vast.list_instances()) == 2


def test_from_env_requires_the_key_and_a_url() -> None:
    """Missing VAST_API_KEY or a bad VAST_API_URL is a SettingsError naming the variable."""
    with pytest.raises(SettingsError, match="VAST_API_KEY"):
        VastMarket.from_env({})
    with pytest.raises(SettingsError, match="VAST_API_URL"):
        VastMarket.from_env({"VAST_API_KEY": "k", "VAST_API_URL": "console.vast.ai"})
    market = VastMarket.from_env({"VAST_API_KEY": "k"})
    assert "console.vast.ai" in repr(market) and "'k'" not in repr(market)
