"""The three policies side by side on the shipped market traces, as a markdown table.

    python bench/campaign.py                 # shipped traces
    python bench/campaign.py --seeds 12      # plus generated marketplace/adversarial variants

Every number is the simulated marketplace's own receipt (its billing and its truth), from
`workers.campaign.run_campaign`; the same receipt `tuneharness sim campaign --json` prints.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from providers.sim.make_traces import adversarial, marketplace
from providers.sim.trace import Trace, load_trace, parse_trace
from workers.campaign import run_campaign

POLICIES = ("guarded", "naive", "oracle")
COLUMNS = (
    ("creates", "creates"),
    ("dead_hosts", "dead hosts"),
    ("dead_host_cost_usd", "dead-host $"),
    ("dead_host_mean_lifetime_s", "dead-host mean life s"),
    ("good_hosts_destroyed", "good destroyed"),
    ("jobs_completed", "jobs done"),
    ("total_cost_usd", "total $"),
    ("idle_gpu_seconds_billed", "idle GPU s"),
    ("recovery_median_s", "recovery median s"),
    ("sim_seconds", "campaign s"),
)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4f}" if abs(v) < 10 else f"{v:.0f}"
    return str(v)


def table(traces: list[tuple[str, Trace]]) -> str:
    head = "| trace | policy | " + " | ".join(c[1] for c in COLUMNS) + " | wall s |"
    rule = "|" + "---|" * (len(COLUMNS) + 3)
    rows = [head, rule]
    for name, trace in traces:
        for policy in POLICIES:
            t0 = time.perf_counter()
            r = run_campaign(trace, policy=policy, trace_label=name).receipt
            wall = time.perf_counter() - t0
            rows.append(f"| {name} | {policy} | " + " | ".join(_fmt(r[k]) for k, _ in COLUMNS) + f" | {wall:.2f} |")
    return "\n".join(rows)


def seeds_summary(n: int) -> str:
    rows = [
        "| generator | seed | guarded $ | naive $ | oracle $ | guarded/naive | guarded/oracle | life - oracle s | all targets |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gen in (marketplace, adversarial):
        for seed in range(1, n + 1):
            trace = parse_trace(gen(seed))
            r = {p: run_campaign(trace, policy=p).receipt for p in POLICIES}
            g, nv, o = r["guarded"], r["naive"], r["oracle"]
            to_naive = g["dead_host_cost_usd"] / nv["dead_host_cost_usd"] if nv["dead_host_cost_usd"] else 0.0
            to_oracle = g["dead_host_cost_usd"] / o["dead_host_cost_usd"] if o["dead_host_cost_usd"] else 1.0
            life = g["dead_host_mean_lifetime_s"] - o["dead_host_mean_lifetime_s"]
            ok = (
                to_naive <= 0.25 and to_oracle <= 1.5 and life <= 150 and g["good_hosts_destroyed"] == 0
                and g["jobs_failed"] == 0 and not g["budget_exceeded"]
            )
            rows.append(
                f"| {gen.__name__} | {seed} | {g['dead_host_cost_usd']:.4f} | {nv['dead_host_cost_usd']:.4f} | "
                f"{o['dead_host_cost_usd']:.4f} | {to_naive:.2f} | {to_oracle:.2f} | {life:.0f} | {'yes' if ok else 'NO'} |"
            )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=0, help="also run N generated variants of each generator")
    args = p.parse_args(argv)
    traces = [(name, load_trace(name)) for name in ("smoke", "marketplace", "adversarial")]
    print(table(traces))
    if args.seeds:
        print()
        print(seeds_summary(args.seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
