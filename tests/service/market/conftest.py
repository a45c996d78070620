"""Fixtures for the marketplace adapters: fake vendor servers on loopback and adapters on them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from providers import http
from providers.fakes import FakeRunPod, FakeVast, sample_vast_offers
from providers.http import RetryPolicy
from providers.runpod import RunPodMarket
from providers.vast import VastMarket

# Tests retry for real but never sleep: backoff is zeroed, the number of tries is not.
RETRY = RetryPolicy(attempts=4, base_s=0.5, cap_s=8.0, timeout_s=5.0)


@pytest.fixture(autouse=True)
def _zero_backoff() -> Iterator[None]:
    http.set_testing(True)
    yield
    http.set_testing(False)


@pytest.fixture
def fake_vast() -> Iterator[FakeVast]:
    """A fake Vast.ai with the sample offers, on a free loopback port."""
    with FakeVast(offers=sample_vast_offers()) as fake:
        yield fake


@pytest.fixture
def fake_runpod() -> Iterator[FakeRunPod]:
    """A fake RunPod GraphQL endpoint with the sample GPU types."""
    with FakeRunPod() as fake:
        yield fake


@pytest.fixture
def vast(fake_vast: FakeVast) -> Iterator[VastMarket]:
    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url, retry=RETRY)
    yield market
    market.close()


@pytest.fixture
def runpod(fake_runpod: FakeRunPod) -> Iterator[RunPodMarket]:
    market = RunPodMarket(api_key=fake_runpod.api_key, api_url=fake_runpod.url, retry=RETRY)
    yield market
    market.close()


@pytest.fixture
def retry() -> RetryPolicy:
    """The retry policy the adapters under test use (4 tries, zero backoff in tests)."""
    return RETRY
