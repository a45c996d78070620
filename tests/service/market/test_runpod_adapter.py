"""The RunPod adapter against the fake RunPod GraphQL server over real loopback HTTP."""

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
)
from providers.fakes import FakeRunPod
from providers.fakes.runpod import CAPACITY_ERROR as FAKE_CAPACITY_ERROR
from providers.http import RetryPolicy
from providers.runpod import CAPACITY_ERROR, RunPodMarket, runpod_instance

SPEC = LaunchSpec(
    image="runpod/pytorch:2.4.0-py3.11-cuda12.4.1-devel-ubuntu22.04",
    disk_gb=60,
    label="th-job-9",
    ssh_public_key="ssh-ed25519 AAAAC3Nz job-9",
    env={"JOB": "9"},
    onstart="touch /ready",
)


def _offer(runpod: RunPodMarket, name: str, gpus: int = 1) -> Any:
    return next(o for o in runpod.search_offers(OfferQuery(num_gpus=gpus)) if o.gpu_name == name)


def _create(runpod: RunPodMarket, spec: LaunchSpec = SPEC) -> str:
    return runpod.create(_offer(runpod, "RTX 3090"), spec)


def test_adapter_implements_the_market_port(runpod: RunPodMarket) -> None:
    """RunPodMarket satisfies the Market protocol and is named `runpod`."""
    assert isinstance(runpod, Market)
    assert runpod.name == "runpod"


def test_search_prices_per_gpu_times_gpu_count(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """Two GPUs of a $0.22/GPU/h type cost $0.44/h; gpuCount travels in `variables`."""
    offers = runpod.search_offers(OfferQuery(num_gpus=2))
    by_name = {o.gpu_name: o for o in offers}
    assert by_name["RTX 3090"].dph_total == pytest.approx(0.44)
    assert by_name["RTX 3090"].num_gpus == 2 and by_name["RTX 3090"].offer_id == "NVIDIA GeForce RTX 3090"
    assert by_name["RTX 3090"].machine_id is None and by_name["RTX 3090"].gpu_ram_gb == 24
    assert by_name["RTX 3090"].storage_per_gb_month is None  # unknown, not invented
    (call,) = fake_runpod.calls
    assert call.path == "/graphql" and call.operation == "gpuTypes"
    assert call.body["variables"] == {"gpuCount": 2}
    assert call.authorized and call.headers["authorization"] == "Bearer <redacted>"
    assert '"' not in call.body["query"]


def test_search_lists_only_community_types_in_stock(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """No community price (A40) or no stock (an exhausted type) means no offer; the rest cheapest first."""
    fake_runpod.exhaust("NVIDIA GeForce RTX 4090")
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery())] == ["RTX 3090", "A100 PCIe"]


def test_search_filters_by_name_and_vram(runpod: RunPodMarket) -> None:
    """The GPU filter matches the display name or the type id; VRAM is a floor."""
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(gpu_names=("RTX_4090",)))] == ["RTX 4090"]
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(gpu_names=("NVIDIA GeForce RTX 3090",)))] == [
        "RTX 3090"
    ]
    assert [o.gpu_name for o in runpod.search_offers(OfferQuery(min_gpu_ram_gb=40))] == ["A100 PCIe"]


def test_create_deploys_through_variables(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """The deploy input carries label as name, community cloud, public 22/tcp, and the SSH key as PUBLIC_KEY."""
    pod_id = runpod.create(_offer(runpod, "RTX 4090", gpus=2), SPEC)
    call = fake_runpod.calls_to("podFindAndDeployOnDemand")[0]
    assert '"' not in call.body["query"]
    deploy = call.body["variables"]["input"]
    assert deploy == {
        "name": "th-job-9",
        "imageName": SPEC.image,
        "cloudType": "COMMUNITY",
        "gpuTypeId": "NVIDIA GeForce RTX 4090",
        "gpuCount": 2,
        "containerDiskInGb": 60,
        "volumeInGb": 0,
        "ports": "22/tcp",
        "supportPublicIp": True,
        "startSsh": True,
        "env": [
            {"key": "JOB", "value": "9"},
            {"key": "PUBLIC_KEY", "value": "ssh-ed25519 AAAAC3Nz job-9"},
            {"key": "TUNEHARNESS_ONSTART", "value": "touch /ready"},
        ],
    }
    got = runpod.status(pod_id)
    assert (got.label, got.dph_total, got.state) == ("th-job-9", pytest.approx(0.68), "loading")


def test_capacity_error_inside_http_200_is_offer_gone(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """The capacity message (HTTP 200, under `errors`) becomes OfferGone after one call."""
    offer = _offer(runpod, "RTX 3090")
    fake_runpod.exhaust("NVIDIA GeForce RTX 3090")
    with pytest.raises(OfferGone, match="no longer any instances available"):
        runpod.create(offer, SPEC)
    assert len(fake_runpod.calls_to("podFindAndDeployOnDemand")) == 1
    assert CAPACITY_ERROR in FAKE_CAPACITY_ERROR  # the fake answers the text the adapter knows


def test_pod_is_ready_only_with_runtime_and_a_public_22(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """RUNNING with runtime null, or with only a private 22, is loading; a public 22/tcp makes it running."""
    pod_id = _create(runpod)
    first = runpod.status(pod_id)
    assert (first.state, first.ssh, first.gpu_util, first.started_at) == ("loading", None, None, None)
    assert first.raw["desiredStatus"] == "RUNNING"
    fake_runpod.boot(pod_id, public=False)
    assert runpod.status(pod_id).state == "loading"
    fake_runpod.boot(pod_id, ip="198.51.100.77", util=35.0)
    ready = runpod.status(pod_id)
    assert ready.state == "running"
    assert ready.ssh is not None and (ready.ssh.host, ready.ssh.user) == ("198.51.100.77", "root")
    assert ready.ssh.port == fake_runpod.pods[pod_id]["runtime"]["ports"][1]["publicPort"]
    assert ready.gpu_util == 35.0 and ready.started_at is not None
    assert ready.machine_id == fake_runpod.pods[pod_id]["machineId"]
    assert ready.status_line is not None and ready.status_line.startswith("Rented by User")
    assert fake_runpod.calls_to("pod")[-1].body["variables"] == {"podId": pod_id}


@pytest.mark.parametrize(
    ("desired", "state"),
    [
        ("RUNNING", "loading"),
        ("EXITED", "stopped"),
        ("TERMINATED", "gone"),
        ("CREATED", "pending"),
        ("WEIRD", "unknown"),
    ],
)
def test_desired_status_maps_to_our_states(desired: str, state: str) -> None:
    """desiredStatus is intent: without a runtime even RUNNING is only loading."""
    assert runpod_instance({"id": "p", "desiredStatus": desired, "runtime": None}, "p").state == state


def test_an_unknown_pod_is_gone(runpod: RunPodMarket) -> None:
    """`pod: null` reads as state gone."""
    assert runpod.status("nosuchpod").state == "gone"


def test_stop_start_and_terminate(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """Stop leaves EXITED (stopped), resume passes the pod's GPU count, terminate twice is fine."""
    pod_id = _create(runpod)
    fake_runpod.boot(pod_id)
    runpod.stop(pod_id)
    assert runpod.status(pod_id).state == "stopped"
    runpod.start(pod_id)
    assert fake_runpod.calls_to("podResume")[0].body["variables"] == {"podId": pod_id, "gpuCount": 1}
    assert runpod.status(pod_id).state == "loading"
    runpod.destroy(pod_id)
    assert runpod.status(pod_id).state == "gone"
    runpod.destroy(pod_id)  # "Pod not found" is what we wanted


def test_stopping_a_gone_pod_is_a_provider_error(runpod: RunPodMarket) -> None:
    """Stop of a pod RunPod does not know carries the vendor's message."""
    with pytest.raises(ProviderError, match="not found"):
        runpod.stop("nosuchpod")


def test_list_filters_by_name_prefix(runpod: RunPodMarket) -> None:
    """Our label lives in the pod's name; list keeps only the prefix."""
    a = _create(runpod)
    _create(runpod, LaunchSpec(image="x", disk_gb=5, label="someone-else", ssh_public_key=""))
    assert [i.instance_id for i in runpod.list_instances("th-")] == [a]
    assert len(runpod.list_instances()) == 2


def test_graphql_errors_in_http_200_are_provider_errors(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """An `errors` list inside HTTP 200 is an error with the vendor's message, not data."""
    fake_runpod.inject(200, {"errors": [{"message": "Something odd happened"}], "data": None})
    with pytest.raises(ProviderError, match="Something odd happened"):
        runpod.list_instances()


def test_unauthorized_inside_http_200_is_auth_failed(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """An `Unauthorized` GraphQL error is AuthFailed naming RUNPOD_API_KEY."""
    fake_runpod.inject(200, {"errors": [{"message": "Unauthorized"}]})
    with pytest.raises(AuthFailed, match="RUNPOD_API_KEY"):
        runpod.list_instances()


def test_a_refused_key_is_auth_failed_and_never_shown(fake_runpod: FakeRunPod, retry: RetryPolicy) -> None:
    """HTTP 401 becomes AuthFailed after one call; the key is in no message or repr."""
    secret = "rp-wrong-0123456789"
    market = RunPodMarket(api_key=secret, api_url=fake_runpod.url, retry=retry)
    with pytest.raises(AuthFailed) as err:
        market.search_offers(OfferQuery())
    assert secret not in str(err.value) and secret not in repr(market)
    assert len(fake_runpod.calls) == 1 and not fake_runpod.calls[0].authorized


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


def test_rate_limit_message_inside_http_200_is_retried(runpod: RunPodMarket, fake_runpod: FakeRunPod) -> None:
    """A rate-limit GraphQL error is transient like a 429."""
    fake_runpod.inject(200, {"errors": [{"message": "Rate limit exceeded, too many requests"}]})
    assert runpod.list_instances() == []
    assert len(fake_runpod.calls) == 2


def test_the_fake_refuses_string_formatted_queries(fake_runpod: FakeRunPod) -> None:
    """The fake answers a query with a literal in it with an error, so the adapter's use of variables is checked."""
    import httpx

    reply = httpx.post(
        fake_runpod.url,
        json={"query": 'query { pod(input: {podId: "x"}) { id } }'},
        headers={"Authorization": f"Bearer {fake_runpod.api_key}"},
    )
    assert reply.status_code == 200 and "variables" in reply.json()["errors"][0]["message"]


def test_from_env_requires_the_key() -> None:
    """Missing RUNPOD_API_KEY is a SettingsError naming it; the default URL is RunPod's GraphQL."""
    with pytest.raises(SettingsError, match="RUNPOD_API_KEY"):
        RunPodMarket.from_env({"RUNPOD_API_URL": "http://127.0.0.1:1/graphql"})
    assert "api.runpod.io/graphql" in repr(RunPodMarket.from_env({"RUNPOD_API_KEY": "k"}))
