"""The GPU check: the real preflight and a real NF4 QLoRA slice on a CUDA machine.

    python bench/gpu.py --out DIR        # a CUDA GPU, torch, transformers, peft, bitsandbytes

What it runs, each through the product's own entry points (`python -m trainer ...`):
  1. `trainer preflight` three times at 4096 (the size hosts run) and once at 8192: wall time of
     each process and its TFLOP/s, and the judgement `app.policy.preflight` gives the report
     against an offer of that same card (`--offer-gpu`, `--offer-vram-gb`; by default what the
     card reports, so only the compute checks can fail).
  2. A random causal LM shaped like Qwen2.5-0.5B (24 layers, hidden 896, byte vocabulary), written
     on the spot, and one NF4 LoRA job on it (LoRA on all seven projections, dropout on, so the
     RNG state matters), run as:
       A  `trainer run`, uninterrupted;
       B  the same again, in a new directory: the noise floor of the GPU's kernels;
       D  `trainer run --slice-steps K` repeated, each slice a new process that resumes from the
          last checkpoint (what the supervisor does, on a new host after a loss);
       C  `trainer slices --slice-steps K` (the fork server: one import, a forked child per slice);
     and the same three again with the job's `deterministic: true` (A_det, B_det, D_det).
     Reported per run: exit code, wall time, steps/s and tokens/s between the first and last
     step line of each slice, GPU memory in use at its peak (nvidia-smi, sampled), the final loss,
     and the adapter's max abs difference from A's (from A_det's for the deterministic runs).

Writes DIR/gpu.json and bench/results/gpu.json (which `bench/report.py` renders), and prints a
markdown summary. It needs no network: the model is random.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import _results  # noqa: E402
from trainer.reporting import steps_by_slice  # noqa: E402


class GpuSampler:
    """The GPU's memory in use and utilisation, from `nvidia-smi` every `every_s` seconds."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self.peak_mib = 0.0
        self.util: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=False,
                ).stdout.split(",")
                self.peak_mib = max(self.peak_mib, float(out[0]))
                self.util.append(float(out[1]))
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
            self._stop.wait(self.every_s)

    def __enter__(self) -> GpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=fh, text=True, check=False)
    return proc.returncode, time.perf_counter() - t0, proc.stdout


def preflights(env: dict[str, str], out: Path, *, offer_gpu: str | None, offer_vram_gb: float | None) -> dict[str, Any]:
    from app.policy.gpus import canonical_gpu, expected_tflops_bf16
    from app.policy.preflight import PreflightReport, judge_preflight

    runs: list[dict[str, Any]] = []
    for size in (4096, 4096, 4096, 8192):
        code, wall, stdout = _run(
            [sys.executable, "-m", "trainer", "preflight", "--size", str(size)], env, out / "preflight.stderr"
        )
        report = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
        runs.append({"size": size, "exit": code, "wall_s": round(wall, 2), "report": report})
        print(f"preflight {size}: exit {code} in {wall:.1f}s: {report}", flush=True)
    first = runs[0]["report"]
    name = offer_gpu or first.get("gpu_name") or "unknown"
    vram = offer_vram_gb if offer_vram_gb is not None else float(first.get("vram_gb") or 0)
    verdicts = []
    for r in runs[:3]:
        v = judge_preflight(PreflightReport.from_mapping(r["report"]), offered_gpu_name=name, offered_gpu_ram_gb=vram)
        verdicts.append(
            {"passed": v.passed, "failure": v.failure, "evidence": v.evidence, "warnings": list(v.warnings)}
        )
    return {
        "runs": runs,
        "offer": {"gpu": name, "vram_gb": vram},
        "canonical": canonical_gpu(name),
        "expected_tflops_bf16": expected_tflops_bf16(first.get("gpu_name") or name),
        "verdicts": verdicts,
    }


def write_job(root: Path, *, model: Path, steps: int, checkpoint_every: int, batch: int, seq: int) -> dict[str, Any]:
    rng = random.Random(7)
    words = [f"w{i}" for i in range(300)] + ["alpha", "beta", "gamma", "delta", "loss", "step", "grad"]
    rows = []
    for _ in range(512):
        prompt = " ".join(rng.choice(words) for _ in range(rng.randint(40, 70)))
        rows.append({"prompt": prompt + " ->", "completion": " " + " ".join(reversed(prompt.split()))})
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "base_model": str(model),
        "task": "causal_lm",
        "train_file": str(root / "train.jsonl"),
        "max_steps": steps,
        "checkpoint_every": checkpoint_every,
        "seed": 3,
        "learning_rate": 2e-4,
        "lr_schedule": "cosine",
        "warmup_steps": min(5, steps),
        "batch_size": batch,
        "grad_accum": 1,
        "max_seq_len": seq,
        "quantization": "nf4",
        "lora": {
            "r": 16,
            "alpha": 32,
            "dropout": 0.05,
            "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        },
    }


def _step_rates(job: Path) -> dict[str, Any]:
    """steps/s and tokens/s between the first and last step line of each slice; final loss."""
    log = job / "train.log"
    blocks = steps_by_slice(log.read_text()) if log.is_file() else []
    steps, seconds, tokens = 0, 0.0, 0.0
    for block in blocks:
        if len(block) >= 2:
            dt = float(block[-1]["elapsed_s"]) - float(block[0]["elapsed_s"])
            steps += int(block[-1]["step"]) - int(block[0]["step"])
            seconds += dt
            tokens += sum(float(b["tokens_per_s"]) for b in block[1:]) / (len(block) - 1) * dt
    return {
        "steps_per_s": round(steps / seconds, 3) if seconds else None,
        "tokens_per_s": round(tokens / seconds, 1) if seconds else None,
        "first_step_at_s": [float(block[0]["elapsed_s"]) for block in blocks],
        "final_loss": float(blocks[-1][-1]["loss"]) if blocks else None,
    }


def _adapter_diff(a: Path, b: Path) -> float | None:
    from safetensors.torch import load_file

    fa, fb = a / "adapter" / "adapter_model.safetensors", b / "adapter" / "adapter_model.safetensors"
    if not fa.is_file() or not fb.is_file():
        return None
    ta, tb = load_file(str(fa)), load_file(str(fb))
    if ta.keys() != tb.keys():
        return float("inf")
    return max(float((ta[k].float() - tb[k].float()).abs().max()) for k in ta)


def train_runs(
    env: dict[str, str],
    out: Path,
    job: dict[str, Any],
    *,
    slice_steps: int,
    variants: list[str],
    report: dict[str, Any],
) -> dict[str, Any]:
    results: dict[str, Any] = report.setdefault("runs", {})
    for name in variants:
        det = name.endswith("_det")
        kind = name.removesuffix("_det")
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "job.json").write_text(json.dumps(dict(job, deterministic=det), indent=1))
        entry, run_env = [sys.executable, "-m", "trainer"], env
        codes, wall = [], 0.0
        with GpuSampler() as gpu:
            if kind in ("A", "B"):
                code, wall, _ = _run([*entry, "run", "--job-dir", str(d)], run_env, d / "stderr.txt")
                codes.append(code)
            elif kind == "C":
                code, wall, _ = _run(
                    [*entry, "slices", "--job-dir", str(d), "--slice-steps", str(slice_steps)],
                    run_env,
                    d / "stderr.txt",
                )
                codes.append(code)
            else:  # D: a new process per slice, as on a new host
                for _ in range(job["max_steps"] // slice_steps + 2):
                    code, w, _ = _run(
                        [*entry, "run", "--job-dir", str(d), "--slice-steps", str(slice_steps)],
                        run_env,
                        d / "stderr.txt",
                    )
                    codes.append(code)
                    wall += w
                    if code != 3:
                        break
        ref = out / ("A_det" if det else "A")
        results[name] = {
            "exit_codes": codes,
            "wall_s": round(wall, 2),
            "gpu_mem_peak_mib": gpu.peak_mib,
            "gpu_util_mean": round(sum(gpu.util) / len(gpu.util), 1) if gpu.util else None,
            **_step_rates(d),
            "adapter_max_abs_diff_vs_A": None if name == ref.name else _adapter_diff(ref, d),
        }
        print(f"{name}: {results[name]}", flush=True)
        (out / "gpu.json").write_text(json.dumps(report, indent=1))  # what a timeout leaves is still read
    return results


def versions() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    for mod in ("transformers", "peft", "bitsandbytes", "accelerate"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as e:  # a missing package is a finding to report, not a crash
            info[mod] = f"unavailable: {type(e).__name__}"
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
    return info


RUN_KINDS = {
    "A": "`trainer run`, uninterrupted",
    "B": "`trainer run` again, in a new directory (the kernels' noise floor)",
    "C": "`trainer slices --slice-steps K`: one import, a forked child per slice",
    "D": "`trainer run --slice-steps K` repeated: a new process per slice, resuming",
}


def _verdict(v: dict[str, Any] | None) -> str:
    if v is None:
        return "-"
    return f"pass: {v['evidence']}" if v["passed"] else f"{v['failure']}: {v['evidence']}"


def result_tables(report: dict[str, Any]) -> list[dict[str, Any]]:
    """A gpu.json report (this script's, or a recorded one) as the tables `bench/report.py` renders."""
    tables = []
    pf = report.get("preflight")
    if pf:
        verdicts = pf.get("verdicts", [])
        rows = [
            [
                r["size"],
                r["exit"],
                r["wall_s"],
                r["report"].get("tflops_bf16"),
                _verdict(verdicts[i] if i < len(verdicts) else None),
            ]
            for i, r in enumerate(pf["runs"])
        ]
        tables.append(
            _results.table(
                "GPU preflight",
                ["matrix size", "exit", "wall s (process)", "bf16 TFLOP/s", "judgement"],
                rows,
                note=f"`python -m trainer preflight --size N`, each a new process (torch's import and CUDA's start "
                f"included). Judged by `app.policy.preflight` against an offer of {pf['offer']['gpu']} with "
                f"{pf['offer']['vram_gb']:g} GB, expecting {pf['expected_tflops_bf16']} bf16 TFLOP/s.",
            )
        )
    runs = report.get("runs") or {}
    if runs:
        job = report.get("job", {})
        rows = []
        for name, r in runs.items():
            kind = RUN_KINDS.get(name.removesuffix("_det"), name)
            what = kind + (", torch's deterministic algorithms on" if name.endswith("_det") else "")
            rows.append(
                [
                    name,
                    what,
                    r["exit_codes"],
                    r["wall_s"],
                    r["steps_per_s"],
                    r["tokens_per_s"],
                    r["gpu_mem_peak_mib"],
                    r["gpu_util_mean"],
                    r["first_step_at_s"],
                    r["final_loss"],
                    r["adapter_max_abs_diff_vs_A"],
                ]
            )
        lora = job.get("lora", {})
        tables.append(
            _results.table(
                "GPU NF4 QLoRA training and resumes",
                [
                    "run",
                    "what",
                    "exit codes",
                    "wall s",
                    "steps/s",
                    "tokens/s",
                    "GPU MiB peak",
                    "GPU util %",
                    "first step at s",
                    "final loss",
                    "max abs adapter diff vs A (A_det for _det)",
                ],
                rows,
                note=f"A random causal LM shaped like Qwen2.5-0.5B, {job.get('max_steps')} steps of "
                f"{job.get('batch_size')} rows x up to {job.get('max_seq_len')} tokens, checkpoint (K) every "
                f"{job.get('checkpoint_every')}, LoRA r={lora.get('r')} on {len(lora.get('target_modules', []))} "
                f"projections with dropout {lora.get('dropout')}. Steps/s and tokens/s between the first and "
                "last step line of each slice; GPU memory and utilisation sampled by nvidia-smi.",
            )
        )
    return tables


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--offer-gpu", default=None)
    ap.add_argument("--offer-vram-gb", type=float, default=None)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--slice-steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--variants", default="A,D,B,A_det,D_det,B_det,C")
    ap.add_argument("--skip-preflight", action="store_true")
    ap.add_argument("--hidden", type=int, default=896, help="model shape; the defaults are Qwen2.5-0.5B's")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--intermediate", type=int, default=4864)
    ap.add_argument("--heads", type=int, default=14)
    args = ap.parse_args()
    started = _results.start()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    env.pop("TUNEHARNESS_SIM_TRUTH", None)
    report: dict[str, Any] = {"versions": versions()}
    print(json.dumps(report["versions"]), flush=True)
    if not args.skip_preflight:
        report["preflight"] = preflights(env, out, offer_gpu=args.offer_gpu, offer_vram_gb=args.offer_vram_gb)
        (out / "gpu.json").write_text(json.dumps(report, indent=1))
    from trainer.tiny import write_tiny_causal_lm

    t0 = time.perf_counter()
    model = write_tiny_causal_lm(
        out / "model",
        hidden_size=args.hidden,
        layers=args.layers,
        intermediate_size=args.intermediate,
        heads=args.heads,
        kv_heads=2,
        max_positions=2048,
        seed=0,
    )
    report["model_write_s"] = round(time.perf_counter() - t0, 1)
    job = write_job(
        out / "data", model=model, steps=args.steps, checkpoint_every=args.slice_steps, batch=args.batch, seq=args.seq
    )
    report["job"] = job
    train_runs(env, out, job, slice_steps=args.slice_steps, variants=args.variants.split(","), report=report)
    print("\n| run | exits | wall s | steps/s | tokens/s | GPU MiB peak | final loss | max abs diff |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, r in report["runs"].items():
        print(
            f"| {name} | {r['exit_codes']} | {r['wall_s']} | {r['steps_per_s']} | {r['tokens_per_s']} | "
            f"{r['gpu_mem_peak_mib']:.0f} | {r['final_loss']} | {r['adapter_max_abs_diff_vs_A']} |"
        )
    first = (report.get("preflight") or {"runs": [{"report": {}}]})["runs"][0]["report"]
    gpu = {
        "gpu": report["versions"].get("device"),
        "cuda": report["versions"].get("cuda"),
        "driver": first.get("driver"),
    }
    _results.write("gpu", result_tables(report), started=started, raw=report, machine_extra=gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
