"""The RunPod adapter against the fake RunPod REST v2 server over real loopback HTTP."""

from __future__ import annotations

from typing import Any

import httpx
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
from providers import http
from providers.fakes import FakeRunPod
from providers.fakes.runpod import CAPACITY_DETAIL, GRAPHQL_GONE
from providers.http import RetryPolicy, VendorClient
from providers.runpod import CAPACITY_WORDS, RunPodMarket, _judge, runpod_instance

SPEC = LaunchSpec(
    image="runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
    disk_gb=60,
    label="th-job-9",
    ssh_public_key="ssh-ed25519 AAAAC3Nz job-9",
    env={"JOB": "9"},
    onstart="touch /ready",
)


def _offer(runpod: RunPodMarket, name: str, gpus: int = 1, *, datacenter_only: bool = False) -> Any:
    query = OfferQuery(num_gpus=gpus, datacenter_only=datacenter_only)
    return next(o for o in runpod.search_offers(query) if o.gpu_name == name)


def _create(runpod: RunPodMarket, spec: LaunchSpec = SPEC) -> str:
    return runpod.create(_offer(runpod, "RTX 3090"), spec)


def test_adapter_implements_the_market_port(runpod: RunPodMarket) -> None:
    """RunPodMarket satisfies the Market protocol, is named `runpod`, and has no price increases."""
    assert isinstance(runpod, Market)
    assert runpod.name == "runpod"
    assert runpod.pending_price_increases() == []


def test_search_reads_the_catalog_with_availability(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """Two GPUs of a $0.22/GPU/h type cost $0.44/h; the catalog is asked for POD availability in COMMUNITY."""
    offers = runpod.search_offers(OfferQuery(num_gpus=2))
    by_name = {o.gpu_name: o for o in offers}
    assert by_name["RTX 3090"].dph_total == pytest.approx(0.44)
    assert by_name["RTX 3090"].num_gpus == 2 and by_name["RTX 3090"].offer_id == "NVIDIA GeForce RTX 3090"
    assert by_name["RTX 3090"].machine_id is None and by_name["RTX 3090"].gpu_ram_gb == 24
    assert by_name["RTX 3090"].storage_per_gb_month is None  # unknown, not invented
    assert by_name["RTX 3090"].raw["cloud"] == "COMMUNITY" and by_name["RTX 3090"].cuda_max == "12.8"
    (call,) = fake_runpod.calls
    assert (call.method, call.path) == ("GET", "/v2/catalog/gpus")
    assert call.query == {"include": ["AVAILABILITY"], "product": ["POD"], "cloud": ["COMMUNITY"], "count": ["2"]}
    assert call.authorized and call.headers["authorization"] == "Bearer <redacted>"


def test_search_lists_only_types_available_in_the_cloud(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """No community price (A40) or availability NONE (an exhausted type) means no offer; the rest cheapest first."""
    fake_runpod.exhaust("NVIDIA GeForce RTX 4090")
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery())] == ["RTX 3090", "A100 PCIe"]


def test_datacenter_only_searches_and_rents_in_the_secure_cloud(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """datacenter_only asks the catalog for SECURE prices and the create carries `cloud: SECURE`."""
    offers = runpod.search_offers(OfferQuery(datacenter_only=True))
    assert [o.gpu_name for o in offers] == ["A40", "RTX 3090", "RTX 4090", "A100 PCIe"]
    assert fake_runpod.calls[-1].query["cloud"] == ["SECURE"]
    pod_id = runpod.create(offers[0], SPEC)
    assert fake_runpod.calls_to("/v2/pods")[-1].body["cloud"] == "SECURE"
    assert fake_runpod.pods[pod_id]["cloud"] == "SECURE" and runpod.status(pod_id).dph_total == pytest.approx(0.35)


def test_search_filters_by_name_and_vram(runpod: RunPodMarket) -> None:
    """The GPU filter matches the display name or the type id; VRAM is a floor."""
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(gpu_names=("RTX_4090",)))] == ["RTX 4090"]
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(gpu_names=("NVIDIA GeForce RTX 3090",)))] == [
        "RTX 3090"
    ]
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(min_gpu_ram_gb=40))] == ["A100 PCIe"]


def test_create_posts_a_pod_with_direct_ssh(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """The create body: label as name, community cloud, `ports: ["22/tcp"]`, env as a map with PUBLIC_KEY."""
    pod_id = runpod.create(_offer(runpod, "RTX 4090", gpus=2), SPEC)
    call = fake_runpod.calls_to("/v2/pods")[-1]
    assert (call.method, call.path) == ("POST", "/v2/pods")
    assert call.body == {
        "name": "th-job-9",
        "image": SPEC.image,
        "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 2},
        "cloud": "COMMUNITY",
        "disk": 60,
        "ports": ["22/tcp"],
        "startSsh": True,
        "env": {"JOB": "9", "PUBLIC_KEY": "ssh-ed25519 AAAAC3Nz job-9", "TUNEHARNESS_ONSTART": "touch /ready"},
    }
    got = runpod.status(pod_id)
    assert (got.label, got.dph_total, got.state, got.machine_id) == ("th-job-9", pytest.approx(0.68), "pending", None)


def test_no_capacity_is_a_400_read_as_offer_gone(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """A 400 whose detail says there is no capacity becomes OfferGone after one call."""
    offer = _offer(runpod, "RTX 3090")
    fake_runpod.exhaust("NVIDIA GeForce RTX 3090")
    with pytest.raises(OfferGone, match="no longer any instances available"):
        runpod.create(offer, SPEC)
    assert len([c for c in fake_runpod.calls_to("/v2/pods") if c.method == "POST"]) == 1
    assert any(w in CAPACITY_DETAIL.lower() for w in CAPACITY_WORDS)


def test_another_400_is_a_provider_error(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """A 400 for a cross-field rule is a ProviderError with the vendor's detail, not OfferGone."""
    offer = _offer(runpod, "RTX 3090")
    fake_runpod.inject(
        400, {"title": "Bad Request", "status": 400, "detail": "gpu and cpu are exclusive"}, match="/v2/pods"
    )
    with pytest.raises(ProviderError, match="gpu and cpu are exclusive") as err:
        runpod.create(offer, SPEC)
    assert not isinstance(err.value, OfferGone)


def test_a_422_is_permanent_and_names_the_schema_error(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """422 (the schema refused the body) is raised at once with RunPod's `errors` line."""
    fake_runpod.inject(
        422,
        {
            "title": "Unprocessable Entity",
            "status": 422,
            "detail": "Request validation failed.",
            "errors": ["$: additional properties 'gpuTypeId' not allowed"],
        },
    )
    with pytest.raises(ProviderError, match="gpuTypeId"):
        runpod.list_instances()
    assert len(fake_runpod.calls) == 1


def test_the_fake_refuses_graphql_era_fields(fake_runpod: FakeRunPod) -> None:
    """A create body with GraphQL's `gpuTypeId` answers 422 with the additional-properties line."""
    got = httpx.post(
        f"{fake_runpod.url}/pods",
        json={"name": "x", "image": "y", "gpuTypeId": "NVIDIA A40"},
        headers={"Authorization": f"Bearer {fake_runpod.api_key}"},
    )
    assert got.status_code == 422 and "additional properties 'gpuTypeId'" in got.json()["errors"][0]
    assert got.headers["content-type"] == "application/problem+json"


def test_no_balance_is_quota_exhausted(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """402 is QuotaExhausted, not retried."""
    offer = _offer(runpod, "RTX 3090")
    fake_runpod.inject(402, {"title": "Payment Required", "status": 402, "detail": "Insufficient balance"})
    with pytest.raises(QuotaExhausted, match="add funds"):
        runpod.create(offer, SPEC)


def test_pod_is_ready_only_when_running_with_direct_ssh(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """PROVISIONING is pending; RUNNING without a public 22 is loading; ssh.direct makes it running."""
    pod_id = _create(runpod)
    first = runpod.status(pod_id)
    assert (first.state, first.ssh, first.gpu_util, first.started_at) == ("pending", None, None, None)
    assert first.raw["status"] == "PROVISIONING"
    fake_runpod.boot(pod_id, public=False)
    assert runpod.status(pod_id).state == "loading"
    fake_runpod.boot(pod_id, ip="198.51.100.77", util=35.0)
    ready = runpod.status(pod_id)
    assert ready.state == "running"
    assert ready.ssh is not None and (ready.ssh.host, ready.ssh.user) == ("198.51.100.77", "root")
    assert ready.ssh.port == fake_runpod.pods[pod_id]["ssh"]["direct"]["port"]
    assert ready.gpu_util == 35.0 and ready.started_at is not None
    assert ready.machine_id is None and ready.status_line == "RUNNING"
    assert fake_runpod.calls[-1].path == f"/v2/pods/{pod_id}"


def test_runtime_ports_are_the_fallback_for_ssh() -> None:
    """Without `ssh.direct`, a public 22/tcp in runtime.ports is the endpoint."""
    pod = {
        "id": "p",
        "status": "RUNNING",
        "ssh": {"direct": None, "proxy": {"host": "ssh.runpod.io", "port": 22}},
        "runtime": {"ports": [{"private": 22, "public": 40100, "type": "tcp", "ip": "198.51.100.3"}]},
    }
    got = runpod_instance(pod, "p")
    assert got.state == "running" and got.ssh is not None and (got.ssh.host, got.ssh.port) == ("198.51.100.3", 40100)


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", "pending"),
        ("STARTING", "loading"),
        ("RUNNING", "loading"),
        ("EXITED", "stopped"),
        ("ERROR", "exited"),
        ("TERMINATED", "gone"),
        ("WEIRD", "unknown"),
    ],
)
def test_pod_status_maps_to_our_states(status: str, state: str) -> None:
    """`status` is observed state; RUNNING without an SSH door is still loading."""
    assert runpod_instance({"id": "p", "status": status, "runtime": None}, "p").state == state


def test_an_unknown_pod_is_gone(runpod: RunPodMarket) -> None:
    """A 404 reads as state gone."""
    assert runpod.status("nosuchpod").state == "gone"


def test_stop_start_and_terminate(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """Stop leaves EXITED (stopped), start is an action, terminate answers 204 and twice is fine."""
    pod_id = _create(runpod)
    fake_runpod.boot(pod_id)
    runpod.stop(pod_id)
    assert runpod.status(pod_id).state == "stopped"
    runpod.stop(pod_id)  # 409: already stopped is what we wanted
    runpod.start(pod_id)
    assert runpod.status(pod_id).state == "loading"
    runpod.destroy(pod_id)
    assert runpod.status(pod_id).state == "gone"
    runpod.destroy(pod_id)  # 404 is what we wanted
    actions = [c.body for c in fake_runpod.calls_to(f"/v2/pods/{pod_id}/action")]
    assert actions == [{"action": a} for a in ("stop", "stop", "start", "terminate", "terminate")]


def test_a_refused_action_is_a_provider_error(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """Starting a pod that is still provisioning (409, not yet startable) says so."""
    pod_id = _create(runpod)
    fake_runpod.set_pod(pod_id, status="PROVISIONING")
    runpod.start(pod_id)  # provisioning is on its way up: nothing to do
    fake_runpod.set_pod(pod_id, status="RUNNING", ssh={"direct": None, "proxy": None})
    fake_runpod.inject(409, {"title": "Conflict", "status": 409, "detail": "busy"}, match="/action")
    fake_runpod.set_pod(pod_id, status="STARTING")
    with pytest.raises(ProviderError, match="HTTP 409"):
        runpod.stop(pod_id)


def test_stopping_a_gone_pod_is_a_provider_error(runpod: RunPodMarket) -> None:
    """Stop of a pod RunPod does not know says it is gone."""
    with pytest.raises(ProviderError, match="gone") as err:
        runpod.stop("nosuchpod")
    assert err.value.status_code == 404


def test_list_filters_by_name_prefix(runpod: RunPodMarket) -> None:
    """Our label lives in the pod's name; list keeps only the prefix."""
    a = _create(runpod)
    _create(runpod, LaunchSpec(image="x", disk_gb=5, label="someone-else", ssh_public_key=""))
    assert [i.instance_id for i in runpod.list_instances("th-")] == [a]
    assert len(runpod.list_instances()) == 2


def test_a_refused_key_is_auth_failed_and_never_shown(fake_runpod: FakeRunPod, retry: RetryPolicy) -> None:
    """HTTP 401 becomes AuthFailed after one call; the key is in no message or repr."""
    secret = "rp-wrong-0123456789"
    market = RunPodMarket(api_key=secret, api_url=fake_runpod.url, retry=retry)
    with pytest.raises(AuthFailed) as err:
        market.search_offers(OfferQuery())
    assert secret not in str(err.value) and secret not in repr(market)
    assert len(fake_runpod.calls) == 1 and not fake_runpod.calls[0].authorized


def test_a_key_in_the_query_is_not_accepted(fake_runpod: FakeRunPod) -> None:
    """REST v2 takes the key as a Bearer header only: `?api_key=` is 401."""
    got = httpx.get(f"{fake_runpod.url}/pods", params={"api_key": fake_runpod.api_key})
    assert got.status_code == 401 and got.json()["detail"] == "missing bearer token"


def test_the_graphql_path_is_gone(fake_runpod: FakeRunPod) -> None:
    """POST /graphql answers 410, read as "unset RUNPOD_API_URL"; the GraphQL URL is refused at start."""
    got = httpx.post(
        f"http://127.0.0.1:{fake_runpod.port}/graphql",
        json={"query": "query { myself { id } }"},
        headers={"Authorization": f"Bearer {fake_runpod.api_key}"},
    )
    assert got.status_code == 410 and got.json()["detail"] == GRAPHQL_GONE
    failure = _judge(got)
    assert failure is not None and failure.error is ProviderError and "unset RUNPOD_API_URL" in failure.message
    with pytest.raises(SettingsError, match="retired GraphQL"):
        RunPodMarket.from_env({"RUNPOD_API_KEY": "k", "RUNPOD_API_URL": "https://api.runpod.io/graphql"})


@pytest.mark.parametrize(("status", "body"), [(429, "Too Many Requests"), (503, "upstream unavailable"), (504, "")])
def test_busy_answers_are_retried_then_pass(
    runpod: RunPodMarket, fake_runpod: FakeRunPod, status: int, body: str
) -> None:
    """Transient answers are retried: two failures, then the list succeeds on the third call."""
    fake_runpod.inject(status, body, times=2)
    assert runpod.list_instances() == []
    assert len(fake_runpod.calls) == 3


def test_busy_forever_gives_up_after_the_bounded_tries(
    runpod: RunPodMarket, fake_runpod: FakeRunPod, retry: RetryPolicy
) -> None:
    """A vendor that answers 502 forever costs exactly `attempts` calls."""
    fake_runpod.inject(502, "Bad Gateway", times=100)
    with pytest.raises(ProviderBusy, match="gave up"):
        runpod.status("p1")
    assert len(fake_runpod.calls) == retry.attempts


def test_a_429_waits_at_least_its_retry_after(fake_runpod: FakeRunPod) -> None:
    """Retry-After: 7 on a 429 makes the next try wait at least 7 s (the sleep is recorded, not slept)."""
    slept: list[float] = []
    client = VendorClient(
        provider="runpod",
        base_url=fake_runpod.url,
        api_key=fake_runpod.api_key,
        retry=RetryPolicy(attempts=3, base_s=0.01, cap_s=0.02),
        sleep=slept.append,
        jitter=lambda: 0.0,
    )
    fake_runpod.inject(429, {"title": "Too Many Requests", "status": 429}, headers={"Retry-After": "7"})
    http.set_testing(False)
    try:
        assert client.request("GET", "/pods", translate=_judge).status_code == 200
    finally:
        http.set_testing(True)
        client.close()
    assert slept == [7.0]


def test_from_env_requires_the_key() -> None:
    """Missing RUNPOD_API_KEY is a SettingsError naming it; the default URL is RunPod's REST v2."""
    with pytest.raises(SettingsError, match="RUNPOD_API_KEY"):
        RunPodMarket.from_env({"RUNPOD_API_URL": "http://127.0.0.1:1/v2"})
    assert "api.runpod.io/v2" in repr(RunPodMarket.from_env({"RUNPOD_API_KEY": "k"}))
