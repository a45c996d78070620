"""The shared vendor HTTP client: bounded jittered backoff, settings, and the fakes' recording."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app import bootstrap
from app.errors import SettingsError, UserError
from app.market import ProviderBusy
from providers import http
from providers.fakes import FakeVast
from providers.http import Failure, RetryPolicy, VendorClient, backoff_s, body_json

REPO = Path(__file__).resolve().parents[3]


def _busy_unless_ok(response: httpx.Response) -> Failure | None:
    return Failure(ProviderBusy, f"HTTP {response.status_code}") if response.status_code >= 500 else None


def test_backoff_grows_exponentially_up_to_the_cap() -> None:
    """Full jitter: at jitter 1 the waits are base, 2*base, 4*base... never above the cap."""
    waits = [backoff_s(attempt=a, base_s=0.5, cap_s=3.0, jitter=1.0) for a in range(5)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff_s(attempt=3, base_s=0.5, cap_s=3.0, jitter=0.25) == 0.75


def test_client_sleeps_the_jittered_backoff_between_tries(fake_vast: FakeVast) -> None:
    """Outside test mode the client waits backoff_s between tries, and only between them."""
    http.set_testing(False)
    slept: list[float] = []
    client = VendorClient(
        provider="vast",
        base_url=fake_vast.url,
        api_key=fake_vast.api_key,
        retry=RetryPolicy(attempts=4, base_s=0.5, cap_s=1.5),
        sleep=slept.append,
        jitter=lambda: 1.0,
    )
    fake_vast.inject(503, "busy", times=10)
    with pytest.raises(ProviderBusy, match="gave up after 4 tries"):
        client.request("GET", "/api/v1/instances/", translate=_busy_unless_ok)
    assert slept == [0.5, 1.0, 1.5]
    client.close()


def test_all_tries_of_a_call_end_within_its_time_budget(fake_vast: FakeVast) -> None:
    """Each try and each wait counts against `budget_s`: a vendor that keeps answering 503 (or asks
    for a long Retry-After) is given up on in time, however many tries are left."""
    http.set_testing(False)
    t = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        t[0] += s

    client = VendorClient(
        provider="vast",
        base_url=fake_vast.url,
        api_key=fake_vast.api_key,
        retry=RetryPolicy(attempts=20, base_s=4.0, cap_s=16.0, budget_s=30.0),
        sleep=sleep,
        jitter=lambda: 1.0,
        monotonic=lambda: t[0],
    )
    fake_vast.inject(503, "busy", times=50)
    with pytest.raises(ProviderBusy, match="gave up after 4 tries"):
        client.request("GET", "/api/v1/instances/", translate=_busy_unless_ok)
    assert slept == [4.0, 8.0, 16.0] and sum(slept) < 30.0
    client.close()


def test_the_default_retry_budget_fits_inside_the_provision_task() -> None:
    """Every try of a create (budget plus the last try's own timeout) ends before the task's soft limit."""
    from workers.config import TASK_TIME_LIMITS_S

    policy = RetryPolicy()
    assert policy.budget_s + policy.timeout_s < TASK_TIME_LIMITS_S["provision"][0]


def test_test_mode_keeps_the_tries_but_not_the_waits(fake_vast: FakeVast) -> None:
    """set_testing(True) zeroes the waits; the client still tries until it succeeds."""
    slept: list[float] = []
    client = VendorClient(
        provider="vast",
        base_url=fake_vast.url,
        api_key=fake_vast.api_key,
        retry=RetryPolicy(attempts=3),
        sleep=slept.append,
    )
    fake_vast.inject(502, "bad gateway", times=2)
    response = client.request("GET", "/api/v1/instances/", translate=_busy_unless_ok)
    assert body_json(response)["instances"] == [] and slept == [] and len(fake_vast.calls) == 3
    client.close()


def test_an_unreachable_vendor_is_provider_busy() -> None:
    """Connection refused is transient: retried, then ProviderBusy naming the URL, never the key."""
    with FakeVast() as fake:
        url = fake.url
    client = VendorClient(provider="vast", base_url=url, api_key="sk-secret", retry=RetryPolicy(attempts=2))
    with pytest.raises(ProviderBusy, match="cannot reach") as err:
        client.request("GET", "/api/v1/instances/", translate=_busy_unless_ok)
    assert "sk-secret" not in str(err.value) and "sk-secret" not in repr(client)
    assert err.value.__suppress_context__


def test_retry_settings_come_from_the_environment() -> None:
    """TUNEHARNESS_PROVIDER_RETRIES / _BACKOFF_S are read and validated with the variable named."""
    policy = RetryPolicy.from_env({"TUNEHARNESS_PROVIDER_RETRIES": "2", "TUNEHARNESS_PROVIDER_BACKOFF_S": "0"})
    assert (policy.attempts, policy.base_s) == (2, 0.0)
    assert RetryPolicy.from_env({}) == RetryPolicy()
    with pytest.raises(SettingsError, match="TUNEHARNESS_PROVIDER_RETRIES"):
        RetryPolicy.from_env({"TUNEHARNESS_PROVIDER_RETRIES": "0"})
    with pytest.raises(SettingsError, match="TUNEHARNESS_PROVIDER_BACKOFF_S"):
        RetryPolicy.from_env({"TUNEHARNESS_PROVIDER_BACKOFF_S": "soon"})


def test_bootstrap_builds_markets_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """bootstrap.market builds vast/runpod from the environment and refuses unknown names listing the choices."""
    monkeypatch.setenv("VAST_API_KEY", "k")
    monkeypatch.setenv("RUNPOD_API_KEY", "k")
    assert bootstrap.market("vast").name == "vast"
    assert bootstrap.market("runpod").name == "runpod"
    with pytest.raises(UserError, match="vast, runpod, sim"):
        bootstrap.market("lambda")
    monkeypatch.delenv("VAST_API_KEY")
    with pytest.raises(SettingsError, match="VAST_API_KEY"):
        bootstrap.market("vast")


def test_the_fake_records_calls_without_the_key(fake_vast: FakeVast) -> None:
    """Every call is recorded with method, path, query, headers and body; the key's value is not kept."""
    httpx.post(f"{fake_vast.url}/api/v0/bundles/?api_key={fake_vast.api_key}", json={"limit": 1})
    (call,) = fake_vast.calls
    assert (call.method, call.path, call.body, call.authorized) == ("POST", "/api/v0/bundles/", {"limit": 1}, True)
    assert call.query["api_key"] == ["<redacted>"] and fake_vast.api_key not in repr(call)


def test_the_demo_entry_serves_a_fake_until_interrupted() -> None:
    """`python -m providers.fakes vast` prints the variables to export and answers on that URL."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "providers.fakes", "vast", "--api-key", "demo"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split("VAST_API_URL=")[1].split()[0]
        offers = httpx.post(f"{url}/api/v0/bundles/", json={}, headers={"Authorization": "Bearer demo"}).json()
        assert len(offers["offers"]) == 4
    finally:
        proc.terminate()
        proc.wait(timeout=10)
