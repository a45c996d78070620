"""doctor's vendor check: one read-only call with the configured key, against the vendor fakes."""

from __future__ import annotations

from app.errors import SettingsError
from app.market import Market
from app.vendorcheck import check
from providers.fakes import FakeRunPod, FakeVast
from providers.runpod import RunPodMarket
from providers.vast import VastMarket

SECRET = "wrong-key-0123456789"


def test_an_accepted_key_a_refused_key_and_no_key() -> None:
    """An accepted key is ok (nothing rented), a refused one (401 from the fake) fails naming the fix
    and never the key, and a vendor without a key is reported not configured, which is no failure."""
    with FakeVast(api_key="vast-key-123456789") as vast, FakeRunPod(api_key="runpod-key-123456789") as runpod:
        good = check("vast", lambda _n: VastMarket(api_key="vast-key-123456789", api_url=vast.url))
        bad = check("runpod", lambda _n: RunPodMarket(api_key=SECRET, api_url=runpod.url))
        assert not vast.calls_to("/asks/") and all(c.method == "GET" for c in vast.calls + runpod.calls)

    def unset(_name: str) -> Market:
        raise SettingsError("VAST_API_KEY", "is not set", "export VAST_API_KEY=<key>")

    missing = check("vast", unset)
    assert (good.ok, good.configured) == (True, True)
    assert (bad.ok, bad.configured) == (False, True) and "refused" in bad.detail and SECRET not in bad.detail
    assert bad.fix
    assert (missing.ok, missing.configured) == (True, False) and "VAST_API_KEY" in missing.detail
