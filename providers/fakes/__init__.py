"""Fake vendor servers that ship in the package: real HTTP on 127.0.0.1, a free port, a thread.

They replay the documented shapes and quirks of Vast.ai (the paged v1 instance list, v0 for the
rest) and RunPod's REST API v2 (../shared/reference/providers-2026.md), record every call, and
take injected faults (429 in text or JSON, 5xx, 401, quota exceeded, offer gone, instance null).
The tests and the demo use the same fakes:

    with FakeVast(offers=sample_vast_offers()) as vast:
        market = VastMarket(api_key=vast.api_key, api_url=vast.url)

From a shell: `python -m providers.fakes vast` prints the variables to export and serves.
"""

from providers.fakes.base import FakeVendorServer, Fault, RecordedCall, Reply
from providers.fakes.runpod import FakeRunPod, sample_runpod_gpu_types
from providers.fakes.vast import FakeVast, sample_vast_offers

__all__ = [
    "FakeRunPod",
    "FakeVast",
    "FakeVendorServer",
    "Fault",
    "RecordedCall",
    "Reply",
    "sample_runpod_gpu_types",
    "sample_vast_offers",
]
