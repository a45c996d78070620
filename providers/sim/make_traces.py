"""Generate the shipped market traces (seeded, reproducible).

    python -m providers.sim.make_traces            # rewrite providers/sim/traces/*.json
    python -m providers.sim.make_traces --check    # exit 1 if the committed files differ

`smoke`: four hosts: a frozen pull, a fatal pull, a stale driver, a healthy host (the duds are
the cheapest, so a cheapest-first renter meets all three before the healthy one).
`proof`: two jobs meet a frozen pull, a stale driver and a host that vanishes mid-training: small
enough to run through the real-time fleet too (`sim campaign --driver celery`).
`marketplace`: 100 hosts shaped like 18 measured days: 62 never deliver a working GPU.
`adversarial`: the duds are the cheapest offers and carry perfect reliability scores.
`recovery`: hosts that vanish during training (`dies_at_s` after the pull), among marketplace duds.
`hangs`: trainers that hang during training (`hangs_at_s` after the pull), among marketplace duds.
`consumer`: consumer cards that reach 65-80% of their datasheet's bf16 peak when healthy
(`gpu_models`), some throttled to 50-70% of a healthy card, one faster than the rest, among duds.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

from providers.sim.trace import TRACE_FORMAT, parse_trace

TRACES_DIR = Path(__file__).resolve().parent / "traces"

OCI_NVML = (
    "Error response from daemon: failed to create task for container: failed to create shim task: "
    "OCI runtime create failed: runc create failed: unable to start container process: error during "
    "container init: error running hook #0: error running hook: exit status 1, stdout: , stderr: "
    "Auto-detected mode as 'legacy' nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown"
)
FATAL_STATUSES = (
    OCI_NVML,
    "Error response from daemon: OCI runtime create failed: container_linux.go:380: starting container "
    "process caused: process_linux.go:545: container init caused: Running hook #0:: error running hook: "
    "exit status 1, stdout: , stderr: nvidia-container-cli: requirement error: unsatisfied condition: cuda>=12.4",
    "failed to register layer: write /opt/conda/lib/libcudnn_engines_precompiled.so.9: no space left on device",
    "Error response from daemon: error while creating mount source path '/var/lib/vastai_kaalia/data': "
    "mkdir: permission denied",
    "Error: failed to pull image: unexpected EOF",
    "docker: Error response from daemon: failed to create endpoint on network bridge: failed to add the host "
    "pair interfaces: operation not supported",
)
GPUS = (  # name, vram, dph range, weight
    ("RTX 3090", 24, (0.09, 0.26), 5),
    ("RTX 4090", 24, (0.26, 0.60), 3),
    ("RTX A6000", 48, (0.38, 0.70), 1),
    ("A100 PCIE", 40, (0.60, 1.10), 1),
)
SMALLER = {"RTX 3090": "RTX 3080", "RTX 4090": "RTX 4080", "RTX A6000": "RTX A5000", "A100 PCIE": "RTX A6000"}


def _dump(trace: dict[str, Any]) -> str:
    """Stable, diff-friendly JSON: one host per line."""
    head = {k: v for k, v in trace.items() if k != "hosts"}
    lines = ["{"]
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v)},")
    lines.append('  "hosts": [')
    hosts = trace["hosts"]
    for i, h in enumerate(hosts):
        lines.append("    " + json.dumps(h) + ("," if i < len(hosts) - 1 else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def smoke() -> dict[str, Any]:
    """Four hosts, a 3 GB pull that takes 60 s at 400 Mb/s: quick under a scaled clock."""

    def offer(dph: float) -> dict[str, Any]:
        return {
            "gpu_name": "RTX 3090",
            "num_gpus": 1,
            "gpu_ram_gb": 24,
            "dph": dph,
            "storage_per_gb_month": 0.15,
            "inet_down_per_gb": 0.0,
            "inet_down_mbps": 800,
            "reliability": 0.995,
            "cuda_max": "12.4",
        }

    return {
        "format": TRACE_FORMAT,
        "name": "smoke",
        "description": "a frozen pull, a fatal pull, a stale driver, a healthy host; duds cheapest first",
        "workload": {
            "jobs": 1,
            "image_gb": 2,
            "model_gb": 1,
            "train_seconds": 120,
            "checkpoint_every_s": 60,
            "disk_gb": 20,
            "budget_usd": 5.0,
        },
        "hosts": [
            {
                "machine_id": "m-frozen",
                "note": "status line freezes mid-pull at 25 s",
                "offer": offer(0.10),
                "truth": {"pull_mbps": 400, "status_every_s": 10, "freeze_at_s": 25},
            },
            {
                "machine_id": "m-fatal",
                "note": "OCI runtime error at 20 s",
                "offer": offer(0.11),
                "truth": {"pull_mbps": 400, "status_every_s": 10, "fatal_at_s": 20, "fatal_status": OCI_NVML},
            },
            {
                "machine_id": "m-stale",
                "note": "boots, nvidia-smi fine, any CUDA op fails",
                "offer": offer(0.12),
                "truth": {"pull_mbps": 400, "status_every_s": 10, "computes": False},
            },
            {
                "machine_id": "m-good",
                "note": "healthy",
                "offer": offer(0.14),
                "truth": {"pull_mbps": 400, "status_every_s": 10},
            },
        ],
    }


def proof() -> dict[str, Any]:
    """Two jobs meet a frozen pull, a stale driver and a healthy host that vanishes mid-training:
    small enough to run through the real-time fleet in a few minutes, so that both drivers'
    receipts can be compared (`sim campaign --driver celery`)."""

    def offer(dph: float) -> dict[str, Any]:
        return {
            "gpu_name": "RTX 3090",
            "num_gpus": 1,
            "gpu_ram_gb": 24,
            "dph": dph,
            "storage_per_gb_month": 0.15,
            "inet_down_per_gb": 0.0,
            "inet_down_mbps": 800,
            "reliability": 0.995,
            "cuda_max": "12.4",
        }

    truth = {"pull_mbps": 400, "status_every_s": 10}
    return {
        "format": TRACE_FORMAT,
        "name": "proof",
        "description": "two jobs; a frozen pull, a stale driver, a host that vanishes mid-training; "
        "healthy hosts after",
        "workload": {
            "jobs": 2,
            "image_gb": 2,
            "model_gb": 1,
            "train_seconds": 240,
            "checkpoint_every_s": 60,
            "disk_gb": 20,
            "budget_usd": 5.0,
        },
        "hosts": [
            {
                "machine_id": "m-frozen",
                "note": "status line freezes mid-pull at 25 s",
                "offer": offer(0.10),
                "truth": {**truth, "freeze_at_s": 25},
            },
            {
                "machine_id": "m-stale",
                "note": "boots, nvidia-smi fine, any CUDA op fails",
                "offer": offer(0.11),
                "truth": {**truth, "computes": False},
            },
            {
                "machine_id": "m-vanish",
                "note": "healthy, vanishes 150 s after its pull",
                "offer": offer(0.12),
                "truth": {**truth, "dies_at_s": 210},
            },
            *(
                {
                    "machine_id": f"m-good-{i}",
                    "note": "healthy",
                    "offer": offer(round(0.13 + 0.01 * i, 2)),
                    "truth": dict(truth),
                }
                for i in range(1, 9)
            ),
        ],
    }


def _offer(rng: random.Random, *, cheap: bool | None = None, reliability: float | None = None) -> dict[str, Any]:
    name, vram, (lo, hi), _ = rng.choices(GPUS, weights=[g[3] for g in GPUS])[0]
    if cheap is True:
        hi = lo + (hi - lo) * 0.3
    elif cheap is False:
        lo = lo + (hi - lo) * 0.35
    traffic = rng.choice((0.0, 0.0, 0.0, 0.0, 0.005, 0.01, 0.02, 0.05))
    return {
        "gpu_name": name,
        "num_gpus": 1,
        "gpu_ram_gb": vram,
        "dph": round(rng.uniform(lo, hi), 3),
        "storage_per_gb_month": round(rng.uniform(0.08, 0.30), 3),
        "inet_down_per_gb": traffic,
        "inet_down_mbps": rng.choice((200, 400, 500, 800, 1000, 2000)),
        "reliability": reliability if reliability is not None else round(rng.uniform(0.90, 0.999), 4),
        "cuda_max": rng.choice(("12.2", "12.4", "12.6", "12.8")),
    }


def _pull_s(download_gb: float, mbps: float) -> float:
    return download_gb * 8000.0 / mbps


def _dud(rng: random.Random, kind: str, offer: dict[str, Any], download_gb: float) -> dict[str, Any]:
    mbps = round(rng.uniform(150, 900))
    cadence = rng.choice((10, 10, 10, 15, 30, 120, 150, 180))
    truth: dict[str, Any] = {"pull_mbps": mbps, "status_every_s": cadence}
    pull = _pull_s(download_gb, mbps)
    if kind == "freeze":
        truth["freeze_at_s"] = round(rng.uniform(0.08, 0.9) * pull)
    elif kind == "fatal":
        truth["fatal_at_s"] = round(rng.uniform(3, min(240, 0.8 * pull)))
        truth["fatal_status"] = rng.choice(FATAL_STATUSES)
    elif kind == "stale_driver":
        truth["computes"] = False
    elif kind == "vram_short":
        truth["actual_gpu_ram_gb"] = rng.choice((8, 10, 12, 16)) if offer["gpu_ram_gb"] <= 24 else 24
    elif kind == "wrong_gpu":
        truth["actual_gpu_name"] = SMALLER[offer["gpu_name"]]
    elif kind == "throttled":
        truth["tflops_factor"] = round(rng.uniform(0.45, 0.8), 2)
    elif kind == "vanished_boot":
        truth["dies_at_s"] = round(rng.uniform(0.1, 0.9) * pull)
    else:  # pragma: no cover
        raise ValueError(kind)
    return truth


def _healthy(rng: random.Random, download_gb: float, *, slow: bool = False) -> dict[str, Any]:
    mbps = round(rng.uniform(30, 90)) if slow else round(rng.uniform(200, 900))
    return {"pull_mbps": mbps, "status_every_s": rng.choice((10, 10, 10, 15, 30, 120, 150, 180))}


def marketplace(seed: int = 20250711) -> dict[str, Any]:
    """100 hosts: 62 never deliver a working GPU (the measured count), the rest do (some slowly,
    some report only every 2-3 minutes, a few die or hang mid-run)."""
    rng = random.Random(seed)
    workload: dict[str, Any] = {
        "jobs": 5,
        "image_gb": 8,
        "model_gb": 15,
        "train_seconds": 1140,
        "checkpoint_every_s": 300,
        "disk_gb": 60,
        "budget_usd": 25.0,
    }
    download_gb = workload["image_gb"] + workload["model_gb"]
    duds = (
        ["freeze"] * 18
        + ["fatal"] * 14
        + ["stale_driver"] * 12
        + ["vram_short"] * 6
        + ["wrong_gpu"] * 4
        + ["throttled"] * 3
        + ["vanished_boot"] * 5
    )
    assert len(duds) == 62
    goods = ["ok"] * 24 + ["slow"] * 6 + ["dies_mid_run"] * 6 + ["hangs_mid_run"] * 2
    kinds = duds + goods
    assert len(kinds) == 100
    rng.shuffle(kinds)
    hosts: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        offer = _offer(rng)
        if kind in ("ok", "slow", "dies_mid_run", "hangs_mid_run"):
            truth = _healthy(rng, download_gb, slow=kind == "slow")
            pull = _pull_s(download_gb, truth["pull_mbps"])
            if kind == "dies_mid_run":
                truth["dies_at_s"] = round(pull + rng.uniform(120, 1500))
            if kind == "hangs_mid_run":
                truth["hangs_at_s"] = round(pull + rng.uniform(120, 900))
        else:
            truth = _dud(rng, kind, offer, download_gb)
        hosts.append(
            {"machine_id": f"m-{1000 + i * 7 + rng.randrange(7)}", "note": kind, "offer": offer, "truth": truth}
        )
    # the one the article names: a 3090 throttled 22% with a perfect reliability score
    star = next(h for h in hosts if h["note"] == "ok" and h["offer"]["gpu_name"] == "RTX 3090")
    star["note"] = "throttled"
    star["offer"]["reliability"] = 1.0
    star["truth"]["tflops_factor"] = 0.78
    # keep 62 duds: turn one throttled dud back into a healthy host
    spare = next(h for h in hosts if h["note"] == "throttled" and h is not star)
    spare["note"] = "ok"
    spare["truth"].pop("tflops_factor")
    return {
        "format": TRACE_FORMAT,
        "name": "marketplace",
        "description": "100 hosts shaped like 18 measured days: 62 never deliver a working GPU",
        "workload": workload,
        "hosts": hosts,
    }


def adversarial(seed: int = 4242) -> dict[str, Any]:
    """40 hosts; the 24 cheapest are duds with perfect reliability; healthy hosts cost more and
    a third of them report status only every 2-3 minutes (an over-eager freeze detector kills them)."""
    rng = random.Random(seed)
    workload: dict[str, Any] = {
        "jobs": 4,
        "image_gb": 8,
        "model_gb": 15,
        "train_seconds": 900,
        "checkpoint_every_s": 300,
        "disk_gb": 60,
        "budget_usd": 20.0,
    }
    download_gb = workload["image_gb"] + workload["model_gb"]
    dud_kinds = (
        ["freeze"] * 6
        + ["fatal"] * 5
        + ["stale_driver"] * 5
        + ["vram_short"] * 2
        + ["wrong_gpu"] * 2
        + ["throttled"] * 2
        + ["vanished_boot"] * 2
    )
    hosts = []
    for i, kind in enumerate(dud_kinds):
        offer = _offer(rng, cheap=True, reliability=1.0)
        offer["dph"] = round(min(offer["dph"], 0.085 + 0.004 * i), 3)
        offer["inet_down_per_gb"] = 0.0
        truth = _dud(rng, kind, offer, download_gb)
        if kind == "freeze":
            truth["status_every_s"] = rng.choice((120, 150, 180))  # a freeze that looks like a slow reporter
        hosts.append({"machine_id": f"a-{100 + i}", "note": kind, "offer": offer, "truth": truth})
    for j in range(16):
        offer = _offer(rng, cheap=False)
        offer["dph"] = round(max(offer["dph"], 0.20 + 0.01 * j), 3)
        offer["reliability"] = round(rng.uniform(0.95, 0.985), 4)
        truth = _healthy(rng, download_gb, slow=j % 5 == 0)
        if j % 3 == 0:
            truth["status_every_s"] = rng.choice((120, 150, 180))
        hosts.append({"machine_id": f"a-{200 + j}", "note": "ok" if j % 5 else "slow", "offer": offer, "truth": truth})
    rng.shuffle(hosts)
    return {
        "format": TRACE_FORMAT,
        "name": "adversarial",
        "description": "duds are the cheapest offers, with perfect reliability scores",
        "workload": workload,
        "hosts": hosts,
    }


def _mid_run(
    name: str, description: str, *, seed: int, duds: list[str], goods: list[str], workload: dict[str, Any]
) -> dict[str, Any]:
    """Marketplace-shaped hosts (same offers, duds and cadences) with mid-run failures."""
    rng = random.Random(seed)
    download_gb = workload["image_gb"] + workload["model_gb"]
    kinds = duds + goods
    rng.shuffle(kinds)
    hosts: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        offer = _offer(rng)
        if kind in ("ok", "dies_mid_run", "hangs_mid_run"):
            truth = _healthy(rng, download_gb)
            pull = _pull_s(download_gb, truth["pull_mbps"])
            if kind == "dies_mid_run":
                truth["dies_at_s"] = round(pull + rng.uniform(300, 0.8 * workload["train_seconds"]))
            if kind == "hangs_mid_run":
                truth["hangs_at_s"] = round(pull + rng.uniform(200, 0.8 * workload["train_seconds"]))
        else:
            truth = _dud(rng, kind, offer, download_gb)
        hosts.append(
            {"machine_id": f"{name[0]}-{2000 + i * 7 + rng.randrange(7)}", "note": kind, "offer": offer, "truth": truth}
        )
    return {"format": TRACE_FORMAT, "name": name, "description": description, "workload": workload, "hosts": hosts}


def recovery(seed: int = 7007) -> dict[str, Any]:
    """40 hosts: 14 duds of the marketplace's kinds, 14 healthy, 12 that vanish during training."""
    duds = ["freeze"] * 4 + ["fatal"] * 4 + ["stale_driver"] * 3 + ["vram_short", "wrong_gpu", "vanished_boot"]
    goods = ["ok"] * 14 + ["dies_mid_run"] * 12
    workload = {
        "jobs": 4,
        "image_gb": 8,
        "model_gb": 15,
        "train_seconds": 2400,
        "checkpoint_every_s": 300,
        "disk_gb": 60,
        "budget_usd": 20.0,
    }
    return _mid_run(
        "recovery",
        "hosts vanish during training (dies_at_s after the pull) among marketplace duds",
        seed=seed,
        duds=duds,
        goods=goods,
        workload=workload,
    )


def hangs(seed: int = 2) -> dict[str, Any]:
    """30 hosts: 10 duds of the marketplace's kinds, 12 healthy, 8 whose trainer hangs mid-run."""
    duds = ["freeze"] * 3 + ["fatal"] * 3 + ["stale_driver"] * 2 + ["vram_short", "throttled"]
    goods = ["ok"] * 12 + ["hangs_mid_run"] * 8
    workload = {
        "jobs": 3,
        "image_gb": 8,
        "model_gb": 15,
        "train_seconds": 1800,
        "checkpoint_every_s": 300,
        "disk_gb": 60,
        "budget_usd": 15.0,
    }
    return _mid_run(
        "hangs",
        "trainers hang during training (hangs_at_s after the pull) among marketplace duds",
        seed=seed,
        duds=duds,
        goods=goods,
        workload=workload,
    )


# What a healthy card reaches on the preflight's matmul, as a fraction of its datasheet's bf16 peak.
CONSUMER_MODELS = {"RTX 3090": 0.68, "RTX 4090": 0.78, "RTX A6000": 0.72}


def consumer(seed: int = 3090) -> dict[str, Any]:
    """36 hosts of consumer cards that never reach their datasheet: 12 duds of the marketplace's
    kinds, 17 healthy (within 5% of their model's healthy speed, one 15% faster), 7 throttled to
    50-70% of a healthy card of their model."""
    rng = random.Random(seed)
    workload: dict[str, Any] = {
        "jobs": 6,
        "image_gb": 8,
        "model_gb": 15,
        "train_seconds": 900,
        "checkpoint_every_s": 300,
        "disk_gb": 60,
        "budget_usd": 20.0,
    }
    download_gb = workload["image_gb"] + workload["model_gb"]
    kinds = ["freeze"] * 4 + ["fatal"] * 4 + ["stale_driver"] * 3 + ["vram_short"]
    kinds += ["ok"] * 16 + ["fast"] + ["throttled"] * 7
    rng.shuffle(kinds)
    hosts: list[dict[str, Any]] = []
    for i, kind in enumerate(kinds):
        # the throttled hosts and every other healthy one are cheap, so the policy meets them early
        offer = _offer(rng, cheap=True if kind == "throttled" or (kind == "ok" and i % 2) else None)
        if offer["gpu_name"] not in CONSUMER_MODELS:
            offer.update(gpu_name="RTX 3090", gpu_ram_gb=24)
        if kind == "throttled":
            offer["reliability"] = round(rng.uniform(0.99, 1.0), 4)
        if kind in ("ok", "fast", "throttled"):
            truth = _healthy(rng, download_gb)
            if kind == "ok":
                truth["tflops_factor"] = round(rng.uniform(0.95, 1.05), 3)
            elif kind == "fast":
                truth["tflops_factor"] = 1.15
            else:
                truth["tflops_factor"] = round(rng.uniform(0.5, 0.7), 2)
        else:
            truth = _dud(rng, kind, offer, download_gb)
        hosts.append(
            {"machine_id": f"c-{3000 + i * 7 + rng.randrange(7)}", "note": kind, "offer": offer, "truth": truth}
        )
    return {
        "format": TRACE_FORMAT,
        "name": "consumer",
        "description": "consumer cards at 65-80% of their datasheet when healthy; some throttled to 50-70% of that",
        "gpu_models": {name: {"healthy_fraction": f} for name, f in CONSUMER_MODELS.items()},
        "workload": workload,
        "hosts": hosts,
    }


TRACES = {
    "smoke": smoke,
    "proof": proof,
    "marketplace": marketplace,
    "adversarial": adversarial,
    "recovery": recovery,
    "hangs": hangs,
    "consumer": consumer,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="compare with the committed files; write nothing")
    p.add_argument("--out", type=Path, default=TRACES_DIR)
    args = p.parse_args(argv)
    stale = []
    for name, build in TRACES.items():
        trace = build()
        parse_trace(trace, source=name)  # never ship a trace the loader refuses
        text = _dump(trace)
        path = args.out / f"{name}.json"
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path))
        else:
            args.out.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path} ({len(trace['hosts'])} hosts)")
    if stale:
        print("stale traces (run python -m providers.sim.make_traces):", *stale, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
