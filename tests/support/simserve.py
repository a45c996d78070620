"""`tuneharness sim serve` for the tests that need the simulated marketplace as a real process, and
the traces of RTX 3090 hosts they serve it on.

`sim_serve` starts the server from the repository root with its state under `work/sim`, waits for
the URL it writes to `work/sim-url`, yields that URL and stops the server on the way out.
`rtx3090_hosts` makes the usual hosts (m-0, m-1, ... priced cheapest first) and `write_trace`
writes a trace file around them."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from providers.sim.trace import TRACE_FORMAT
from tests.support.services import wait_until

ROOT = Path(__file__).resolve().parents[2]

# A bare RTX 3090 listing: the card, its download speed and its reliability.
RTX3090: Mapping[str, Any] = {
    "gpu_name": "RTX 3090",
    "num_gpus": 1,
    "gpu_ram_gb": 24,
    "inet_down_mbps": 800,
    "reliability": 0.995,
}
# The same listing with the storage and transfer prices and the CUDA version a real market shows.
RTX3090_LISTED: Mapping[str, Any] = {
    "gpu_name": "RTX 3090",
    "num_gpus": 1,
    "gpu_ram_gb": 24,
    "storage_per_gb_month": 0.15,
    "inet_down_per_gb": 0.0,
    "inet_down_mbps": 800,
    "reliability": 0.995,
    "cuda_max": "12.4",
}
HEALTHY: Mapping[str, Any] = {"status_every_s": 10}


def rtx3090_hosts(
    n: int,
    *,
    offer: Mapping[str, Any] = RTX3090,
    truth: Mapping[str, Any] = HEALTHY,
    truth_of: Mapping[int, Mapping[str, Any]] | None = None,
    first_price: float = 0.10,
    step: float = 0.01,
    price_digits: int | None = 2,
) -> list[dict[str, Any]]:
    """`n` hosts m-0, m-1, ... offering `offer` at `first_price`, `first_price + step`, ... dollars an
    hour (rounded to `price_digits`, or as computed when None); each host's truth is `truth` with
    `truth_of[i]` laid over it."""
    overrides = truth_of or {}

    def price(i: int) -> float:
        dph = first_price + step * i
        return dph if price_digits is None else round(dph, price_digits)

    return [
        {"machine_id": f"m-{i}", "offer": {**offer, "dph": price(i)}, "truth": {**truth, **overrides.get(i, {})}}
        for i in range(n)
    ]


def write_trace(
    path: Path,
    *,
    name: str,
    hosts: Sequence[Mapping[str, Any]],
    workload: Mapping[str, Any],
    description: str | None = None,
) -> Path:
    """A market trace of `hosts` under `workload` written to `path`; the path."""
    trace: dict[str, Any] = {"format": TRACE_FORMAT, "name": name}
    if description is not None:
        trace["description"] = description
    trace["workload"] = dict(workload)
    trace["hosts"] = [dict(h) for h in hosts]
    path.write_text(json.dumps(trace))
    return path


@contextmanager
def sim_serve(
    env: dict[str, str],
    work: Path,
    *,
    trace: Path | str,
    scale: float,
    extra_args: Sequence[str] = (),
    log: Path | None = None,
) -> Iterator[str]:
    """`sim serve` on `trace` (a file or a shipped trace's name) at `scale` simulated seconds per
    wall second, its state under `work/sim`; yields its URL once it is up (within 60 s) and stops it
    (SIGTERM, then up to 30 s) on the way out. Its output goes to `log` if given, else nowhere."""
    url_file = work / "sim-url"
    command = [
        *(sys.executable, "-m", "app.cli.main", "sim", "serve", "--trace", str(trace), "--scale", str(scale)),
        *("--root", str(work / "sim"), "--url-file", str(url_file), *extra_args),
    ]
    with ExitStack() as stack:
        out = stack.enter_context(log.open("ab")) if log is not None else subprocess.DEVNULL
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            assert wait_until(lambda: url_file.exists() or server.poll() is not None, timeout_s=60), (
                "sim serve wrote no URL within 60 s"
            )
            assert server.poll() is None, f"sim serve exited ({server.returncode})"
            yield url_file.read_text().strip()
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
