"""The three policies side by side on the shipped market traces, as markdown tables.

    python bench/campaign.py                 # shipped traces (+ recoveries with and without a standby host)
    python bench/campaign.py --seeds 52      # plus generated variants of each generator
    python bench/campaign.py --only sweep --from-seed 53 --seeds 100
    python bench/campaign.py --only recovery --recovery-from 31 --recovery-seeds 60
    python bench/campaign.py --only shipped --progress-hedge 3   # with progress-aware hedging (off by default)
    python bench/campaign.py --only first-wave --recovery-seeds 60

What each mode measures:
  shipped     each policy on each shipped trace (cost of dead hosts, jobs done, total cost, recovery
              time), and guarded's recoveries on the traces with host losses, with no warm standby
              host and with one, against the recovery targets (detection within 60 s; resumed within
              90 s with a standby host, within the replacement's image pull + 90 s without one).
  sweep       guarded, naive and oracle on generated `marketplace` and `adversarial` traces, seeds
              --from-seed..--seeds: guarded's dead-host cost against naive's and the oracle's, per
              seed, and which seeds miss a target. Seeds no rule was tuned on are out of sample.
  recovery    the recovery targets on generated `recovery` traces, seeds --recovery-from..
              --recovery-seeds, with no standby host and with one.
  first-wave  every no-standby recovery slower than its replacement's pull + 90 s, beside when the
              job would have resumed on the fastest healthy host of the first wave the policy rented.
  all         shipped, then sweep and recovery when --seeds is given.

Every number is the simulated marketplace's own receipt (its billing and its truth), from
`providers.sim.campaign.run_campaign`; the same receipt `tuneharness sim campaign --json` prints. The
tables are also written to bench/results/campaign.json (`--only shipped`) or
bench/results/campaign_<mode>.json, which `bench/report.py` renders.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results
from providers.sim.campaign import is_dead_host
from providers.sim.campaign import run_campaign as _run_campaign
from providers.sim.make_traces import adversarial, marketplace, recovery
from providers.sim.market import pull_seconds
from providers.sim.trace import Trace, load_trace, parse_trace

PROGRESS_HEDGE: int | None = None  # --progress-hedge N: extra rentals per slow recovery (default: the policy's)


def run_campaign(trace: Trace, **kw: Any) -> Any:
    return _run_campaign(trace, progress_hedge_max=PROGRESS_HEDGE, **kw)


POLICIES = ("guarded", "naive", "oracle")
SHIPPED = ("smoke", "proof", "marketplace", "adversarial", "recovery", "hangs", "consumer")
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


Table = tuple[list[str], list[list[str]], str]  # columns, rows (as printed), a note under them


def markdown(columns: list[str], rows: list[list[str]]) -> str:
    return "\n".join(
        ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns), *("| " + " | ".join(r) + " |" for r in rows)]
    )


def table(traces: list[tuple[str, Trace]]) -> Table:
    head = ["trace", "policy", *(c[1] for c in COLUMNS), "wall s"]
    rows = []
    for name, trace in traces:
        for policy in POLICIES:
            t0 = time.perf_counter()
            r = run_campaign(trace, policy=policy, trace_label=name).receipt
            wall = time.perf_counter() - t0
            rows.append([name, policy, *(_fmt(r[k]) for k, _ in COLUMNS), f"{wall:.2f}"])
    return head, rows, ""


def recovery_row(trace: Trace, *, standby_hosts: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The guarded receipt and what the recovery targets need: worst detection, median recovery,
    median of (recovery - the replacement's image pull)."""
    res = run_campaign(trace, policy="guarded", standby_hosts=standby_hosts)
    r = res.receipt
    times = [x["resumed_at_s"] - x["lost_at_s"] for x in r["recoveries"]]
    over_pull = [t - f["replacement_pull_s"] for t, f in zip(times, res.recovery_facts, strict=True)]
    facts = {
        "n": len(times),
        "detect_max_s": max((f["detect_s"] for f in res.recovery_facts), default=None),
        "median_s": statistics.median(times) if times else None,
        "median_over_pull_s": statistics.median(over_pull) if over_pull else None,
    }
    return r, facts


def recovery_ok(r: dict[str, Any], f: dict[str, Any], *, standby_hosts: int) -> bool:
    if r["jobs_failed"] or r["budget_exceeded"] or not f["n"]:
        return not r["jobs_failed"] and not r["budget_exceeded"]
    limit_ok = f["median_s"] <= 90 if standby_hosts else f["median_over_pull_s"] <= 90
    return f["detect_max_s"] <= 60 and limit_ok


def recovery_table(traces: list[tuple[str, Trace]]) -> Table:
    head = [
        "trace",
        "standby hosts",
        "recoveries",
        "worst detection s",
        "recovery median s",
        "p90 s",
        "median minus replacement pull s",
        "standby $",
        "dead-host $",
        "total $",
        "targets",
    ]
    rows = []
    for name, trace in traces:
        for standby in (0, 1):
            r, f = recovery_row(trace, standby_hosts=standby)
            rows.append(
                [
                    name,
                    str(standby),
                    str(f["n"]),
                    _fmt(f["detect_max_s"]),
                    _fmt(r["recovery_median_s"]),
                    _fmt(r["recovery_p90_s"]),
                    _fmt(f["median_over_pull_s"]),
                    f"{r['standby_cost_usd']:.4f}",
                    f"{r['dead_host_cost_usd']:.4f}",
                    f"{r['total_cost_usd']:.4f}",
                    "yes" if recovery_ok(r, f, standby_hosts=standby) else "NO",
                ]
            )
    return head, rows, ""


def speeds_summary(n: int = 8) -> Table:
    """Guarded cold (no GPU speeds measured yet) and warm (what four earlier campaigns on traces of
    the same shape measured, seeds 1000-1003) against the oracle, summed over seeds 1-n."""
    head = [
        "generator",
        "guarded cold $",
        "guarded warm $",
        "oracle $",
        "cold/oracle",
        "warm/oracle",
        "cold life s",
        "warm life s",
        "oracle life s",
    ]
    rows = []
    for gen in (marketplace, adversarial):
        memory = None
        for k in range(4):
            memory = _run_campaign(parse_trace(gen(1000 + k)), policy="guarded", known_speeds=memory).speeds
        cost = {"cold": 0.0, "warm": 0.0, "oracle": 0.0}
        life = {"cold": 0.0, "warm": 0.0, "oracle": 0.0}
        for seed in range(1, n + 1):
            trace = parse_trace(gen(seed))
            for key, r in (
                ("cold", _run_campaign(trace, policy="guarded").receipt),
                ("warm", _run_campaign(trace, policy="guarded", known_speeds=memory).receipt),
                ("oracle", _run_campaign(trace, policy="oracle").receipt),
            ):
                cost[key] += float(r["dead_host_cost_usd"])
                life[key] += float(r["dead_host_mean_lifetime_s"]) / n
        rows.append(
            [
                gen.__name__,
                f"{cost['cold']:.4f}",
                f"{cost['warm']:.4f}",
                f"{cost['oracle']:.4f}",
                f"{cost['cold'] / cost['oracle']:.2f}",
                f"{cost['warm'] / cost['oracle']:.2f}",
                f"{life['cold']:.0f}",
                f"{life['warm']:.0f}",
                f"{life['oracle']:.0f}",
            ]
        )
    note = (
        "GPU speeds are learned from our own preflights (docs/jobs.md). Cold, a throttled card can pass "
        "the floor while fewer than three machines of its model are measured; warm starts from what "
        "earlier campaigns measured, as production's gpu_speed table keeps it across jobs."
    )
    return head, rows, note


def seeds_summary(n: int, *, first: int = 1) -> Table:
    head = [
        "generator",
        "seed",
        "guarded $",
        "naive $",
        "oracle $",
        "guarded/naive",
        "guarded/oracle",
        "life - oracle s",
        "all targets",
    ]
    rows = []
    failing: dict[str, list[int]] = {}
    sums: dict[str, float] = {}
    for gen in (marketplace, adversarial):
        for seed in range(first, n + 1):
            trace = parse_trace(gen(seed))
            r = {p: run_campaign(trace, policy=p).receipt for p in POLICIES}
            g, nv, o = r["guarded"], r["naive"], r["oracle"]
            to_naive = g["dead_host_cost_usd"] / nv["dead_host_cost_usd"] if nv["dead_host_cost_usd"] else 0.0
            to_oracle = g["dead_host_cost_usd"] / o["dead_host_cost_usd"] if o["dead_host_cost_usd"] else 1.0
            life = g["dead_host_mean_lifetime_s"] - o["dead_host_mean_lifetime_s"]
            ok = (
                to_naive <= 0.25
                and to_oracle <= 1.5
                and life <= 150
                and g["good_hosts_destroyed"] == 0
                and g["jobs_failed"] == 0
                and not g["budget_exceeded"]
            )
            if not ok:
                failing.setdefault(gen.__name__, []).append(seed)
            for p in POLICIES:
                key = f"{gen.__name__} {p}"
                sums[key] = sums.get(key, 0.0) + float(r[p]["dead_host_cost_usd"])
                sums[f"{gen.__name__} {p} total"] = sums.get(f"{gen.__name__} {p} total", 0.0) + float(
                    r[p]["total_cost_usd"]
                )
            rows.append(
                [
                    gen.__name__,
                    str(seed),
                    f"{g['dead_host_cost_usd']:.4f}",
                    f"{nv['dead_host_cost_usd']:.4f}",
                    f"{o['dead_host_cost_usd']:.4f}",
                    f"{to_naive:.2f}",
                    f"{to_oracle:.2f}",
                    f"{life:.0f}",
                    "yes" if ok else "NO",
                ]
            )
    count = n - first + 1
    summary = ", ".join(f"{g}: {len(s)} of {count} fail (seeds {s})" for g, s in failing.items()) or "none fail"
    return head, rows, f"Failing traces (seeds {first}-{n}): {summary}; dead-host $ summed: {sums_text(sums)}"


def sums_text(sums: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in sums.items())


def recovery_seeds_summary(n: int, *, first: int = 1) -> Table:
    head = [
        "generator",
        "seed",
        "recoveries",
        "median minus pull s (no standby)",
        "median s (1 standby)",
        "worst detection s",
        "no standby ok",
        "1 standby ok",
    ]
    rows = []
    fails = {0: 0, 1: 0}
    missed: dict[int, list[int]] = {0: [], 1: []}
    sums: dict[str, float] = {}
    counted = 0
    for seed in range(first, n + 1):
        trace = parse_trace(recovery(seed))
        r0, f0 = recovery_row(trace, standby_hosts=0)
        r1, f1 = recovery_row(trace, standby_hosts=1)
        if not f0["n"] and not f1["n"]:
            continue
        counted += 1
        ok0, ok1 = recovery_ok(r0, f0, standby_hosts=0), recovery_ok(r1, f1, standby_hosts=1)
        fails[0] += not ok0
        fails[1] += not ok1
        for sb, ok, r in ((0, ok0, r0), (1, ok1, r1)):
            if not ok:
                missed[sb].append(seed)
            for k in ("standby_cost_usd", "dead_host_cost_usd", "total_cost_usd"):
                sums[f"{sb} standby {k}"] = sums.get(f"{sb} standby {k}", 0.0) + float(r[k])
        detect = max(x for x in (f0["detect_max_s"], f1["detect_max_s"]) if x is not None)
        rows.append(
            [
                "recovery",
                str(seed),
                f"{f0['n']}/{f1['n']}",
                _fmt(f0["median_over_pull_s"]),
                _fmt(f1["median_s"]),
                _fmt(detect),
                "yes" if ok0 else "NO",
                "yes" if ok1 else "NO",
            ]
        )
    return (
        head,
        rows,
        (
            f"Of {counted} generated recovery traces with a loss (seeds {first}-{n}): {fails[0]} miss the no-standby "
            f"target (seeds {missed[0]}), {fails[1]} miss the one-standby target (seeds {missed[1]}); "
            f"summed: {sums_text(sums)}"
        ),
    )


def first_wave(trace: Trace, *, label: str) -> list[dict[str, Any]]:
    """Each no-standby recovery, beside what waiting for the first wave would have given.

    The first wave is what the policy rented at the instant it noticed the loss (the job's own
    replacement and the hedges). The referee knows which of those hosts were healthy and how long
    each pulled: resuming on the first of them to finish would have come at detection + its pull +
    the same time from ready to the first step as the real replacement took. A recovery that
    resumed on a host rented later (after duds) counts its whole wait against the target, since the
    target subtracts only that host's own pull.
    """
    res = run_campaign(trace, policy="guarded", standby_hosts=0)
    created = {e["instance"]: e for e in res.ledger if e["kind"] == "created"}
    dl = trace.workload.download_gb
    out = []
    for rec, facts in zip(res.receipt["recoveries"], res.recovery_facts, strict=True):
        noticed = rec["lost_at_s"] + facts["detect_s"]
        start = next(
            e
            for e in res.ledger
            if e["kind"] == "training_started" and e["job"] == rec["job"] and abs(e["t_s"] - rec["resumed_at_s"]) < 1e-6
        )
        made = created[start["instance"]]
        ready_to_step = rec["resumed_at_s"] - (made["t_s"] + facts["replacement_pull_s"])
        healthy_pulls = []
        for e in created.values():
            if abs(e["t_s"] - noticed) > 1e-6:
                continue
            host = trace.host(e["machine"])
            pull = pull_seconds(download_gb=dl, pull_mbps=host.truth.pull_mbps)
            if (
                is_dead_host(
                    host.truth, offered_gpu=host.offer.gpu_name, offered_ram_gb=host.offer.gpu_ram_gb, pull_s=pull
                )
                is None
            ):
                healthy_pulls.append(pull)
        took = rec["resumed_at_s"] - rec["lost_at_s"]
        best = min(healthy_pulls, default=None)
        out.append(
            {
                "trace": label,
                "job": rec["job"],
                "recovery_s": took,
                "over_pull_s": took - facts["replacement_pull_s"],
                "rented_after_s": made["t_s"] - noticed,
                "first_wave": sum(1 for e in created.values() if abs(e["t_s"] - noticed) <= 1e-6),
                "first_wave_healthy": len(healthy_pulls),
                "first_wave_recovery_s": None if best is None else noticed + best + ready_to_step - rec["lost_at_s"],
            }
        )
    return out


def first_wave_summary(n: int, *, first: int = 1) -> Table:
    head = [
        "trace",
        "job",
        "recovery s",
        "minus its pull s",
        "replacement rented s after the loss was noticed",
        "first wave (healthy)",
        "resuming on the first wave's fastest healthy host s",
    ]
    rows = []
    traces = [("marketplace", load_trace("marketplace")), ("recovery", load_trace("recovery"))]
    traces += [
        (f"{g.__name__}({seed})", parse_trace(g(seed))) for seed in range(first, n + 1) for g in (marketplace, recovery)
    ]
    total = misses = sooner = no_healthy = 0
    for label, trace in traces:
        for r in first_wave(trace, label=label):
            total += 1
            if r["over_pull_s"] <= 90:
                continue
            misses += 1
            fw = r["first_wave_recovery_s"]
            no_healthy += fw is None
            sooner += fw is not None and r["recovery_s"] < fw
            rows.append(
                [
                    label,
                    str(r["job"]),
                    f"{r['recovery_s']:.0f}",
                    f"{r['over_pull_s']:.0f}",
                    f"{r['rented_after_s']:.0f}",
                    f"{r['first_wave']} ({r['first_wave_healthy']})",
                    _fmt(fw),
                ]
            )
    return (
        head,
        rows,
        (
            f"Of {total} no-standby recoveries (the shipped marketplace and recovery traces, and generated seeds "
            f"{first}-{n} of both), {misses} took longer than their replacement's pull + 90 s. In {sooner} of those "
            f"the job resumed SOONER than it would have on the fastest healthy host of the first wave (that host "
            f"would have met the target, being slower); in {no_healthy} the first wave held no healthy host. A "
            f"negative 'rented after' is a host rented before the loss: a finished job's held host, adopted when "
            f"it came free."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=0, help="also run generated variants of each generator, up to seed N")
    p.add_argument(
        "--from-seed", type=int, default=1, help="first seed of the marketplace/adversarial sweep (default 1)"
    )
    p.add_argument(
        "--recovery-seeds",
        type=int,
        default=None,
        help="last seed of the recovery(seed) sweep (default: min(--seeds, 30))",
    )
    p.add_argument("--recovery-from", type=int, default=1, help="first seed of the recovery(seed) sweep (default 1)")
    p.add_argument(
        "--only",
        choices=("all", "shipped", "sweep", "recovery", "first-wave"),
        default="all",
        help="shipped: the shipped-trace tables; sweep: marketplace/adversarial seeds; recovery: recovery "
        "seeds; first-wave: each no-standby recovery miss beside waiting for the first wave",
    )
    p.add_argument(
        "--progress-hedge",
        type=int,
        default=None,
        help="extra rentals per waiting recovery whose chains pull slowly (default: the policy's, 0)",
    )
    args = p.parse_args(argv)
    global PROGRESS_HEDGE
    PROGRESS_HEDGE = args.progress_hedge
    started = _results.start()
    measured: list[dict[str, Any]] = []

    def show(measure: str, result: Table) -> None:
        columns, rows, note = result
        if measured:
            print()
        print(markdown(columns, rows) + (f"\n\n{note}" if note else ""))
        measured.append(_results.table(measure, columns, rows, note=note))

    if args.only in ("all", "shipped"):
        traces = [(name, load_trace(name)) for name in SHIPPED]
        show("Policies on the shipped traces", table(traces))
        show("Dead-host cost while GPU speeds are learned, generated traces 1-8", speeds_summary())
        show(
            "Recoveries on the shipped traces, with and without a standby host",
            recovery_table([t for t in traces if t[0] in ("marketplace", "recovery", "hangs")]),
        )
    if args.seeds and args.only in ("all", "sweep"):
        show(
            f"Policies on generated traces, seeds {args.from_seed}-{args.seeds}",
            seeds_summary(args.seeds, first=args.from_seed),
        )
    recovery_last = args.recovery_seeds if args.recovery_seeds is not None else min(args.seeds, 30)
    if args.only == "first-wave":
        show(
            f"No-standby recoveries over their target, seeds {args.recovery_from}-{recovery_last}",
            first_wave_summary(recovery_last, first=args.recovery_from),
        )
    elif recovery_last and args.only in ("all", "recovery"):
        show(
            f"Recoveries on generated recovery traces, seeds {args.recovery_from}-{recovery_last}",
            recovery_seeds_summary(recovery_last, first=args.recovery_from),
        )
    name = "campaign" if args.only == "shipped" else f"campaign_{args.only.replace('-', '_')}"
    _results.write(name, measured, started=started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
