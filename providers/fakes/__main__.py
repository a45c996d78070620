"""`python -m providers.fakes {vast,runpod}`: serve a fake vendor with sample offers until Ctrl-C.

Instances boot on their second status read, so a demo sees loading -> running.
"""

from __future__ import annotations

import argparse
import threading

from providers.fakes.base import FakeVendorServer
from providers.fakes.runpod import FakeRunPod
from providers.fakes.vast import FakeVast, sample_vast_offers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m providers.fakes", description=__doc__)
    parser.add_argument("vendor", choices=["vast", "runpod"])
    parser.add_argument("--api-key", default="fake-key", help="the key the fake accepts (default fake-key)")
    args = parser.parse_args(argv)
    fake: FakeVendorServer
    if args.vendor == "vast":
        vast = FakeVast(api_key=args.api_key, offers=sample_vast_offers())
        vast.auto_boot_after_reads = 1
        fake, prefix = vast, "VAST"
    else:
        runpod = FakeRunPod(api_key=args.api_key)
        runpod.auto_boot_after_reads = 1
        fake, prefix = runpod, "RUNPOD"
    with fake:
        print(f"export {prefix}_API_URL={fake.url} {prefix}_API_KEY={args.api_key}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
