"""The trainer's overheads, as a markdown table.

    python bench/trainer.py                       # defaults: ~60 s job, 20 s slices
    python bench/trainer.py --steps 400 --slice-seconds 20

One tiny NF4 causal-LM job (a random Qwen2 written on the spot, no downloads), run these ways:
  1. `python -m trainer run` uninterrupted, before and after the sliced runs (their mean is the
     reference, so that a change of the machine's load during the benchmark hits both sides);
  2. the same job as slices of --slice-seconds, each a new `python -m trainer run --max-seconds`
     process that resumes (what a control plane does over SSH: every slice pays its own start-up);
  3. the same job through `python -m trainer slices --slice-seconds`: the imports paid once, each
     slice a forked child that resumes, trains, checkpoints and exits;
  4. a plain transformers/peft loop over the same model and the same batches (no checkpoints,
     no logs, no status file), in its own process.
Reported: wall time of (2) and (3) over (1), checkpoint save and load time (from train.log), peak
RSS of each process, training steps/s of the trainer against the plain loop (steps/s counted from
the first to the last step, start-up excluded), and the load average around the runs. The table is
also written to bench/results/trainer.json, which `bench/report.py` renders.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import _results  # noqa: E402
from trainer.reporting import parse_line, steps_by_slice  # noqa: E402
from trainer.testing import write_causal_job  # noqa: E402
from trainer.tiny import write_tiny_causal_lm  # noqa: E402

PLAIN_LOOP = r"""
import json, os, sys, time
os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
sys.path.insert(0, sys.argv[2])
from trainer.data import batch_indices, collate, encode_rows, read_rows
job_dir = sys.argv[1]
job = json.load(open(os.path.join(job_dir, "job.json")))
torch.manual_seed(job["seed"])
tok = AutoTokenizer.from_pretrained(job["base_model"])
q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32,
                       bnb_4bit_use_double_quant=True)
model = AutoModelForCausalLM.from_pretrained(job["base_model"], quantization_config=q, dtype=torch.float32)
model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
lora = job["lora"]
model = get_peft_model(model, LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], lora_dropout=lora.get("dropout", 0.0),
                                         target_modules=lora["target_modules"], task_type="CAUSAL_LM"))
rows = read_rows(os.path.join(job_dir, job["train_file"]), task="causal_lm")
enc = encode_rows(rows, tok, task="causal_lm", max_seq_len=job["max_seq_len"])
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=job["learning_rate"], weight_decay=0.0)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
model.train()
bs = job["batch_size"]
t0 = None
for step in range(job["max_steps"]):
    idx = batch_indices(seed=job["seed"], step=step, per_step=bs, n_rows=len(enc))
    batch = collate([enc[i] for i in idx], pad_id=tok.pad_token_id, task="causal_lm")
    loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
    if step == 0:
        t0 = time.perf_counter()
print(json.dumps({"steps_per_s": (job["max_steps"] - 1) / (time.perf_counter() - t0)}))
"""


CPU_S: dict[str, float] = {}  # CPU seconds (user + system) of the last process run per label


def _run(cmd: list[str], env: dict[str, str], *, label: str = "") -> tuple[int, float, float, str]:
    """(exit code, wall s, peak RSS MiB, stdout) of one process; its CPU seconds (children it
    waited for included, so a `slices` runner counts its slices) are added to CPU_S[label]."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    CPU_S[label] = CPU_S.get(label, 0.0) + usage.ru_utime + usage.ru_stime
    return proc.returncode, time.perf_counter() - t0, usage.ru_maxrss / 1024, out


def _events(job: Path, event: str) -> list[dict[str, str]]:
    if not (job / "train.log").is_file():
        return []
    lines = [parse_line(x) for x in (job / "train.log").read_text().splitlines()]
    return [p[2] for p in lines if p is not None and p[1] == event]


def _stamp_s(stamp: str) -> float:
    from datetime import UTC, datetime

    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


def _restart_gaps(job: Path) -> list[float]:
    """Seconds from each slice's `cap` line to the next slice's first `step` line: what a slice
    boundary costs (exit, start, imports, loading, resume, one step), read off train.log."""
    if not (job / "train.log").is_file():
        return []
    gaps, cap_at = [], None
    for p in map(parse_line, (job / "train.log").read_text().splitlines()):
        if p is None:
            continue
        if p[1] == "cap":
            cap_at = _stamp_s(p[0])
        elif p[1] == "step" and cap_at is not None:
            gaps.append(_stamp_s(p[0]) - cap_at)
            cap_at = None
    return gaps


def _steps_per_s(job: Path) -> float:
    """Trainer steps/s between the first and the last step line of each slice (start-up excluded)."""
    steps, seconds = 0, 0.0
    for block in steps_by_slice((job / "train.log").read_text()):
        if len(block) >= 2:
            steps += int(block[-1]["step"]) - int(block[0]["step"])
            seconds += float(block[-1]["elapsed_s"]) - float(block[0]["elapsed_s"])
    return steps / seconds


def result_rows(
    result: dict[str, Any], *, slices: int, forked_slices: int, slice_seconds: float, repeats: int, sps_steps: int
) -> list[list[str]]:
    """The table's rows: measure, value, target."""
    cpu_whole = statistics.mean(result["cpu_s_uninterrupted_runs"]) if slices else float("nan")
    return [
        [
            "uninterrupted wall s (mean of runs before and after the sliced ones)",
            f"{result['uninterrupted_s']} ({' / '.join(str(w) for w in result['uninterrupted_runs_s'])})",
            "",
        ],
        [f"`run` per slice: {slices} processes of {slice_seconds:g} s, wall s", f"{result['sliced_s']}", ""],
        ["wall ratio, `run` per slice / uninterrupted", f"{result['wall_ratio']}", "<= 1.10"],
        [f"`slices` runner: {forked_slices} forked slices of {slice_seconds:g} s, wall s", f"{result['forked_s']}", ""],
        ["wall ratio, `slices` runner / uninterrupted", f"{result['forked_wall_ratio']}", "<= 1.10"],
        [
            f"CPU s (user + system): uninterrupted ({' / '.join(str(c) for c in result['cpu_s_uninterrupted_runs'])}) "
            "/ `run` per slice / `slices` runner",
            f"{round(cpu_whole, 2)} / {result['cpu_s_run_per_slice']} / {result['cpu_s_slices_runner']}",
            "",
        ],
        ["CPU ratio, `run` per slice / uninterrupted", f"{round(result['cpu_s_run_per_slice'] / cpu_whole, 3)}", ""],
        ["CPU ratio, `slices` runner / uninterrupted", f"{round(result['cpu_s_slices_runner'] / cpu_whole, 3)}", ""],
        [
            "slice boundary (cap line to the next slice's first step), median s: `run` per slice / `slices` runner",
            f"{result['restart_gap_median_s_run']} / {result['restart_gap_median_s_slices']}",
            "",
        ],
        ["checkpoint save, median s", f"{result['checkpoint_save_median_s']}", ""],
        ["checkpoint load (resume), median s", f"{result['checkpoint_load_median_s']}", ""],
        ["peak RSS trainer / plain loop MiB", f"{result['peak_rss_mib_trainer']} / {result['peak_rss_mib_plain']}", ""],
        [
            f"steps/s trainer / plain loop (best of {repeats} alternating runs of {sps_steps} steps)",
            f"{result['trainer_steps_per_s']} / {result['plain_steps_per_s']}",
            "",
        ],
        [
            "steps/s runs trainer; plain",
            f"{result['trainer_steps_per_s_runs']}; {result['plain_steps_per_s_runs']}",
            "",
        ],
        ["steps/s ratio", f"{result['steps_per_s_ratio']}", ">= 0.95"],
        [
            "load average (1, 5, 15 min) before / after the sliced runs / at the end",
            f"{result['loadavg_1_5_15_before']} / {result['loadavg_1_5_15_after_slices']} / "
            f"{result['loadavg_1_5_15_end']}",
            "",
        ],
    ]


def result_tables(rows: list[list[str]], *, title: str) -> list[dict[str, Any]]:
    """The rows as three measures: slicing overhead, checkpoint I/O, speed and memory beside a plain loop."""
    columns = ["measure", "value", "target"]
    return [
        _results.table(
            "Trainer slicing overhead: whole, `run` per slice, `slices`", columns, [*rows[0:9], rows[15]], note=title
        ),
        _results.table("Trainer checkpoint save and load", columns, rows[9:11], note=title),
        _results.table("Trainer speed and memory beside a plain loop", columns, rows[11:15], note=title),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--slice-seconds", type=float, default=20.0)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--sps-steps", type=int, default=100, help="steps of each steps/s comparison run")
    ap.add_argument("--repeats", type=int, default=3, help="alternating trainer/plain runs for steps/s")
    ap.add_argument("--skip-slices", action="store_true", help="only the steps/s comparison")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="OMP/torch threads per process (1 keeps a shared, busy machine from distorting the ratios)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    started = _results.start()
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS=str(args.threads),
    )
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        root = Path(tmp)
        model = write_tiny_causal_lm(root / "model", hidden_size=args.hidden, layers=4)
        fields: dict[str, Any] = {
            "max_steps": args.steps,
            "checkpoint_every": args.checkpoint_every,
            "lr_schedule": "constant",
            "warmup_steps": 0,
            "batch_size": 8,
            "grad_accum": 1,
            "max_seq_len": 64,
            "eval_file": None,
            "learning_rate": 1e-3,
            "lora": {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        }
        trainer = [sys.executable, "-m", "trainer", "run", "--job-dir"]
        load_before = os.getloadavg()

        slices, sliced_s, sliced_rss, whole_s, whole_rss = 0, 0.0, 0.0, float("nan"), 0.0
        forked_slices, forked_s, wholes = 0, float("nan"), []
        if not args.skip_slices:
            whole = write_causal_job(root / "whole-0", base_model=model, rows=256, **fields)
            code, wall, whole_rss, _ = _run([*trainer, str(whole)], env, label="whole-0")
            assert code == 0, f"uninterrupted run failed ({code}); see {whole}/train.log"
            wholes.append(wall)
            sliced = write_causal_job(root / "sliced", base_model=model, rows=256, **fields)
            while True:
                code, wall, rss, _ = _run(
                    [*trainer, str(sliced), "--max-seconds", str(args.slice_seconds)], env, label="sliced"
                )
                slices, sliced_s, sliced_rss = slices + 1, sliced_s + wall, max(sliced_rss, rss)
                if code == 0:
                    break
                assert code == 3 and slices < 100, f"slice failed ({code})"
            forked = write_causal_job(root / "forked", base_model=model, rows=256, **fields)
            code, forked_s, rss, _ = _run(
                [
                    sys.executable,
                    "-m",
                    "trainer",
                    "slices",
                    "--job-dir",
                    str(forked),
                    "--slice-seconds",
                    str(args.slice_seconds),
                ],
                env,
                label="forked",
            )
            assert code == 0, f"slices runner failed ({code}); see {forked}/train.log"
            forked_slices = len(_events(forked, "start"))
            sliced_rss = max(sliced_rss, rss)
            again = write_causal_job(root / "whole-1", base_model=model, rows=256, **fields)
            code, wall, rss, _ = _run([*trainer, str(again)], env, label="whole-1")
            assert code == 0, f"uninterrupted run failed ({code}); see {again}/train.log"
            wholes.append(wall)
            whole_rss, whole_s = max(whole_rss, rss), statistics.mean(wholes)
        load_after_slices = os.getloadavg()
        # Steps/s: trainer and plain loop alternate (A B A B ...) on a shorter job, best of each,
        # so that load from other processes on the machine hits both alike.
        trainer_runs, plain_runs, plain_rss = [], [], 0.0
        sps_fields = dict(fields, max_steps=args.sps_steps)
        for i in range(args.repeats):
            a = write_causal_job(root / f"sps-trainer-{i}", base_model=model, rows=256, **sps_fields)
            b = write_causal_job(root / f"sps-plain-{i}", base_model=model, rows=256, **sps_fields)
            code, _, _, _ = _run([*trainer, str(a)], env)
            assert code == 0, "trainer run failed"
            trainer_runs.append(_steps_per_s(a))
            code, _, rss, out = _run([sys.executable, "-c", PLAIN_LOOP, str(b), str(REPO)], env)
            assert code == 0, "plain loop failed"
            plain_runs.append(json.loads(out.strip().splitlines()[-1])["steps_per_s"])
            plain_rss = max(plain_rss, rss)
        plain_sps = max(plain_runs)

        jobs = [root / n for n in ("whole-0", "sliced", "forked", "whole-1")]
        saves = [float(e["save_s"]) for j in jobs for e in _events(j, "checkpoint")]
        loads = [float(e["load_s"]) for j in jobs for e in _events(j, "resume")]
        trainer_sps = max(trainer_runs)
        gaps_run, gaps_forked = _restart_gaps(root / "sliced"), _restart_gaps(root / "forked")
        result = {
            "steps": args.steps,
            "slices": slices,
            "uninterrupted_s": round(whole_s, 2),
            "uninterrupted_runs_s": [round(w, 2) for w in wholes],
            "sliced_s": round(sliced_s, 2),
            "wall_ratio": round(sliced_s / whole_s, 3) if slices else None,
            "forked_slices": forked_slices,
            "forked_s": round(forked_s, 2),
            "forked_wall_ratio": round(forked_s / whole_s, 3) if forked_slices else None,
            "cpu_s_uninterrupted_runs": [round(CPU_S.get(k, 0.0), 2) for k in ("whole-0", "whole-1")],
            "cpu_s_run_per_slice": round(CPU_S.get("sliced", 0.0), 2),
            "cpu_s_slices_runner": round(CPU_S.get("forked", 0.0), 2),
            "restart_gap_median_s_run": round(statistics.median(gaps_run), 3) if gaps_run else None,
            "restart_gap_median_s_slices": round(statistics.median(gaps_forked), 3) if gaps_forked else None,
            "loadavg_1_5_15_before": [round(x, 2) for x in load_before],
            "loadavg_1_5_15_after_slices": [round(x, 2) for x in load_after_slices],
            "loadavg_1_5_15_end": [round(x, 2) for x in os.getloadavg()],
            "checkpoint_save_median_s": round(statistics.median(saves), 4) if saves else None,
            "checkpoint_load_median_s": round(statistics.median(loads), 4) if loads else None,
            "peak_rss_mib_trainer": round(max(whole_rss, sliced_rss), 1),
            "peak_rss_mib_plain": round(plain_rss, 1),
            "trainer_steps_per_s": round(trainer_sps, 2),
            "plain_steps_per_s": round(plain_sps, 2),
            "trainer_steps_per_s_runs": [round(x, 2) for x in trainer_runs],
            "plain_steps_per_s_runs": [round(x, 2) for x in plain_runs],
            "steps_per_s_ratio": round(trainer_sps / plain_sps, 3),
        }
    title = (
        f"Tiny NF4 Qwen2 (hidden {args.hidden}, 4 layers), {args.steps} steps, batch 8 x 64 tokens, "
        f"checkpoint every {args.checkpoint_every}, CPU, {args.threads} thread(s) per process"
    )
    rows = result_rows(
        result,
        slices=slices,
        forked_slices=forked_slices,
        slice_seconds=args.slice_seconds,
        repeats=args.repeats,
        sps_steps=args.sps_steps,
    )
    _results.write("trainer", result_tables(rows, title=title), started=started, raw=result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{title}\n")
    print("| measure | value | target |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
