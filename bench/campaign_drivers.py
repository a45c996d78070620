"""One trace, two drivers: the campaign simulator (virtual time) and the real-time fleet
(`sim campaign --driver celery`) on the same shipped traces, side by side.

    python bench/campaign_drivers.py                      # smoke and proof at scale 3 (about 6 minutes)
    python bench/campaign_drivers.py --traces proof --scale 5

The real-time run starts its own redis-server, Celery worker and beat, `sim serve` (a real sshd
per host) and the real trainer on the CPU, in a temporary directory; both receipts come from the
simulated marketplace's referee.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results
from providers.sim.campaign import run_campaign_file
from providers.sim.campaign.realtime import run_campaign_realtime

FIELDS = (
    "creates",
    "dead_hosts",
    "good_hosts_destroyed",
    "jobs_completed",
    "jobs_failed",
    "dead_host_cost_usd",
    "total_cost_usd",
    "sim_seconds",
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", default=["smoke", "proof"])
    ap.add_argument("--scale", type=float, default=3.0, help="simulated seconds per wall second (celery driver)")
    ap.add_argument("--monitor-s", type=float, default=10.0, help="both supervisors' poll period (simulated s)")
    args = ap.parse_args()
    started = _results.start()
    rows: list[list[Any]] = []
    raw: dict[str, Any] = {}
    for trace in args.traces:
        virtual = run_campaign_file(trace, monitor_s=args.monitor_s).receipt
        t0 = time.monotonic()
        real = run_campaign_realtime(trace, scale=args.scale, monitor_s=args.monitor_s).receipt
        wall = time.monotonic() - t0
        raw[trace] = {"virtual": virtual, "celery": real, "celery_wall_s": round(wall, 1)}
        for driver, r in (("virtual", virtual), ("celery", real)):
            took = round(wall, 0) if driver == "celery" else "-"
            rows.append([trace, driver, *(r[f] for f in FIELDS), len(r["recoveries"]), took])
        print(f"{trace}: virtual {[virtual[f] for f in FIELDS]}, celery {[real[f] for f in FIELDS]} in {wall:.0f} s")
    columns = ["trace", "driver", *FIELDS, "recoveries", "wall s"]
    _results.write(
        "campaign_drivers",
        [
            _results.table(
                "One trace through both drivers",
                columns,
                rows,
                note=f"The celery driver at scale {args.scale:g} (simulated seconds per wall second), both "
                f"supervisors polling every {args.monitor_s:g} s; its wall time includes starting redis, the "
                "worker, beat and sim serve. Counts must be equal and dead-host and total cost within 10% "
                "(tests/e2e/test_campaign_drivers_agree.py checks proof).",
            )
        ],
        started=started,
        raw=raw,
    )


if __name__ == "__main__":
    main()
