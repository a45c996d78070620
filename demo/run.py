"""`make demo`: the main job of tuneharness, end to end, on this machine.

Each section runs the real commands a user would type, against a fresh TUNEHARNESS_HOME under
.demo/, with a private redis-server, a real Celery worker and beat, vendor fakes on loopback,
and a simulated marketplace of lying hosts whose running hosts answer over real SSH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.rule import Rule  # noqa: E402
from rich.table import Table  # noqa: E402

console = Console(width=int(os.environ.get("COLUMNS", "150")))
DEMO = REPO / ".demo"
HOME = DEMO / "home"
EXTRA_ENV: dict[str, str] = {}
SIM_SCALE = 5.0  # simulated seconds per wall second for the live marketplace
MAX_STEPS, CHECKPOINT_EVERY, SLICE_STEPS = 40, 8, 12

DEMO_JOB = f"""\
name: demo-job
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: {MAX_STEPS}
  checkpoint_every: {CHECKPOINT_EVERY}
  seed: 1
  learning_rate: 1.0e-2
  lr_schedule: cosine
  warmup_steps: 2
  batch_size: 4
  grad_accum: 2
  max_seq_len: 64
  lora: {{r: 4, alpha: 8, dropout: 0.1, target_modules: [q_proj, v_proj]}}
  quantization: none
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 3
  train_hours: 0.05
budget_usd: 5.0
gate:                     # one adapter per seed, judged on the worst seed against a rules baseline
  config:
    {{metric: accuracy, model: demo-words, task: swap two words, baseline_name: rules (always x0), min_canaries: 1}}
  eval: eval.jsonl
  baseline: predictions:baseline.jsonl
  seeds: [1, 2]
"""


def env() -> dict[str, str]:
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_")):
            del e[k]
    e.update(
        TUNEHARNESS_HOME=str(HOME),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONPATH=str(REPO),
        COLUMNS=os.environ.get("COLUMNS", "150"),
    )
    e.update(EXTRA_ENV)
    return e


def section(title: str) -> None:
    console.print()
    console.print(Rule(f"[bold]{title}"))


def sh(
    *args: str,
    check: bool = True,
    show: bool = True,
    extra_env: dict[str, str] | None = None,
    limit_lines: int | None = None,
    echo: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run `tuneharness ARGS` as a user would, echoing the command and its output."""
    if echo:
        console.print(f"[cyan]$ tuneharness {' '.join(args)}")
    proc = subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        env={**env(), **(extra_env or {})},
        cwd=REPO,
        text=True,
        capture_output=True,
    )
    out = (proc.stdout + proc.stderr).rstrip()
    if out and show:
        lines = out.splitlines()
        if limit_lines is not None and len(lines) > limit_lines:
            lines = [*lines[:limit_lines], f"... ({len(lines) - limit_lines} more lines)"]
        console.print("\n".join(lines), markup=False, highlight=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo step failed: tuneharness {' '.join(args)} exited {proc.returncode}")
    return proc


def wait_for(predicate: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise SystemExit(f"demo: timed out waiting for {what}")


def marketplace_seam() -> None:
    section("1. One seam for every marketplace: offers ranked by their all-in price")
    from providers.fakes import FakeVast, sample_vast_offers

    with FakeVast(offers=sample_vast_offers()) as vast:
        console.print("(Vast.ai's API replayed by a fake server on loopback, quirks included)")
        sh(
            "market",
            "offers",
            "--provider",
            "vast",
            "--download-gb",
            "23",
            "--disk-gb",
            "60",
            "--hours",
            "0.5",
            extra_env={"VAST_API_URL": vast.url, "VAST_API_KEY": vast.api_key},
        )
    console.print("The same command on the simulated marketplace of lying hosts (every offer looks fine):")
    sh("market", "offers", "--provider", "sim", "--download-gb", "23", "--disk-gb", "60")


def campaign_in_money() -> None:
    section("2. What a dead host bills before anyone notices: a 100-host campaign, three policies")
    table = Table(title="sim campaign --trace marketplace (62 of 100 hosts never deliver a working GPU)")
    cols = (
        "policy",
        "creates",
        "dead_hosts",
        "dead_host_cost_usd",
        "dead_host_mean_lifetime_s",
        "good_hosts_destroyed",
        "jobs_completed",
        "total_cost_usd",
        "recovery_median_s",
    )
    for c in cols:
        table.add_column(c)
    for policy in ("naive", "guarded", "oracle"):
        proc = sh("sim", "campaign", "--trace", "marketplace", "--policy", policy, "--json", show=False)
        r = json.loads(proc.stdout)
        table.add_row(*[str(r.get(c)) for c in cols])
    console.print(table)
    console.print(
        "naive = cheapest hourly offer, waits 30 min for `running`, no preflight, notices a dead "
        "training after 105 min; oracle = acts on every failure at the first instant it is observable."
    )


def two_drivers() -> None:
    """The same trace through both drivers: the simulator now, the real fleet as recorded."""
    recorded = json.loads((REPO / "bench" / "results" / "campaign_drivers.json").read_text())
    cols = ("creates", "dead_hosts", "good_hosts_destroyed", "jobs_completed", "dead_host_cost_usd", "total_cost_usd")
    proc = sh("sim", "campaign", "--trace", "proof", "--monitor-s", "10", "--json", show=False)
    live = json.loads(proc.stdout)
    real = recorded["raw"]["proof"]["celery"]
    console.print(
        "One policy, two drivers: the `proof` trace (two jobs; a frozen pull, a stale driver, a host that "
        "vanishes mid-training) replayed by the simulator just now, beside the same trace run through the "
        f"real fleet (Celery, sim serve with real sshd hosts, the real trainer; recorded by "
        f"bench/campaign_drivers.py in {recorded['raw']['proof']['celery_wall_s']:.0f} s; live: "
        "`tuneharness sim campaign --driver celery --trace proof --monitor-s 10`):"
    )
    table = Table()
    table.add_column("driver")
    for c in cols:
        table.add_column(c)
    table.add_row("virtual (now)", *[str(live[c]) for c in cols])
    table.add_row("celery (recorded)", *[str(real[c]) for c in cols])
    console.print(table)


def real_preflights() -> None:
    """The preflight judgement on the reports two real H200s printed (bench/gpu.py, recorded)."""
    from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16
    from app.policy.preflight import PreflightReport, judge_preflight

    recorded = json.loads((REPO / "bench" / "results" / "gpu_h200_2026-12-04.json").read_text())
    console.print(
        "The preflight's expectations come from real GPUs: `python -m trainer preflight` as two lent "
        "NVIDIA H200s printed it, judged against an H200 offer (141 GB):"
    )
    table = Table()
    for c in ("machine", "bf16 TFLOP/s", "verdict (table)", "verdict (datasheet 989.5, before)"):
        table.add_column(c)
    for run in ("run1", "run2"):
        for pf in recorded[run]["preflight"]["runs"]:
            if pf["size"] != 4096:
                continue
            report = PreflightReport.from_mapping(pf["report"])
            now = judge_preflight(report, offered_gpu_name="H200", offered_gpu_ram_gb=141)
            before = judge_preflight(
                report,
                offered_gpu_name="H200",
                offered_gpu_ram_gb=141,
                expected_tflops=DATASHEET_PEAK_TFLOPS_BF16["H200"],
            )
            table.add_row(
                f"H200 #{run[-1]}",
                f"{report.tflops_bf16:.1f}",
                "pass" if now.passed else str(now.failure),
                "pass" if before.passed else str(before.failure),
            )
    console.print(table)


def learned_speeds() -> None:
    """Consumer cards judged against what other cards of their model measured, not a datasheet."""
    from app.policy.gpus import DATASHEET_PEAK_TFLOPS_BF16
    from providers.sim.campaign import run_campaign
    from providers.sim.trace import load_trace

    trace = load_trace("consumer")
    learned = run_campaign(trace, policy="guarded")
    # the datasheet as the expectation: a memory in which three machines of each model measured its peak
    datasheet = {
        model: {f"datasheet-{i}": [DATASHEET_PEAK_TFLOPS_BF16[model]] for i in range(3)}
        for model in ("RTX 3090", "RTX 4090", "RTX A6000")
    }
    by_sheet = run_campaign(trace, policy="guarded", known_speeds=datasheet)
    console.print(
        "Healthy consumer cards reach 0.68-0.78 of their datasheet on the preflight's matmul; some hosts are "
        "throttled to 0.5-0.7 of a healthy card. `sim campaign --trace consumer`, guarded, judging speed two ways:"
    )
    slow = {h.machine_id for h in trace.hosts if h.truth.tflops_factor < 1.0}
    table = Table()
    for c in ("expected speed", "called throttled", "of them healthy", "jobs_completed", "total_cost_usd"):
        table.add_column(c)
    for name, res in (("the datasheet (before)", by_sheet), ("learned from our own preflights", learned)):
        called = {e["machine"] for e in res.ledger if e.get("kind") == "host_failed" and e.get("reason") == "throttled"}
        r = res.receipt
        table.add_row(
            name, str(len(called)), str(len(called - slow)), str(r["jobs_completed"]), str(r["total_cost_usd"])
        )
    console.print(table)
    for e in [e for e in learned.ledger if e.get("kind") == "host_failed" and e.get("reason") == "throttled"][:3]:
        console.print(f"  {e['machine']}: {e['evidence']}")


def demo_trace() -> Path:
    """The smoke trace's four hosts (three liars, one healthy) plus four more healthy hosts: one per seed
    run, and some to recover onto."""
    from providers.sim import shipped_trace_path

    trace = json.loads(Path(shipped_trace_path("smoke")).read_text())
    good = next(h for h in trace["hosts"] if h["machine_id"] == "m-good")
    for i, dph in ((2, 0.15), (3, 0.16), (4, 0.17), (5, 0.18), (6, 0.19)):
        trace["hosts"].append({**good, "machine_id": f"m-good-{i}", "offer": {**good["offer"], "dph": dph}})
    trace["name"] = "demo"
    path = DEMO / "demo-trace.json"
    path.write_text(json.dumps(trace, indent=1))
    return path


def start_sim_server() -> subprocess.Popen[bytes]:
    url_file = DEMO / "sim-url"
    url_file.unlink(missing_ok=True)
    log = (DEMO / "sim-serve.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli.main",
            "sim",
            "serve",
            "--trace",
            str(demo_trace()),
            "--scale",
            str(SIM_SCALE),
            "--root",
            str(DEMO / "sim"),
            "--url-file",
            str(url_file),
        ],
        cwd=REPO,
        env=env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    wait_for(lambda: url_file.exists() or server.poll() is not None, 60, "the simulated marketplace")
    if server.poll() is not None:
        raise SystemExit(f"sim serve exited; see {DEMO / 'sim-serve.log'}")
    EXTRA_ENV["TUNEHARNESS_SIM_URL"] = url_file.read_text().strip()
    return server


def fleet_and_job() -> None:
    from app.settings import load_settings
    from app.stack import Stack, free_port

    section("3. The fleet: redis, a Celery worker, one beat, Flower (what `tuneharness up` starts)")
    server = start_sim_server()
    EXTRA_ENV.update(
        TUNEHARNESS_BROKER_URL=f"redis://127.0.0.1:{free_port()}/0",
        TUNEHARNESS_FLOWER_PORT=str(free_port()),
        TUNEHARNESS_MONITOR_S="5",
        TUNEHARNESS_REPOLL_S="3",
        TUNEHARNESS_SLICE_STEPS=str(SLICE_STEPS),
    )
    settings = load_settings(env())
    from app.bootstrap import engine

    engine(settings)
    stack = Stack(settings, run_dir=HOME / "run", flower=True, worker_concurrency=2, extra_env=EXTRA_ENV)
    try:
        with stack:
            EXTRA_ENV["TUNEHARNESS_BROKER_URL"] = stack.broker_url
            console.print(
                f"broker {stack.broker_url} (started for the demo), worker, beat, Flower on "
                f"http://127.0.0.1:{settings.flower_port}; simulated marketplace "
                f"{EXTRA_ENV['TUNEHARNESS_SIM_URL']} at {SIM_SCALE:.0f}x time, hosts behind real sshd"
            )
            wait_for(lambda: b"ready." in (stack.run_dir / "worker.log").read_bytes(), 120, "the worker")
            live_job(stack)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


def live_job(stack) -> None:  # type: ignore[no-untyped-def]
    from app.bootstrap import engine
    from app.ledger import Ledger
    from app.settings import load_settings
    from providers.sim.client import SimClientMarket

    section("4. A job meets lying hosts: frozen pull, fatal pull, stale driver, then a healthy host")
    jobdir = DEMO / "job"
    jobdir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "trainer", "make-tiny-model", str(jobdir / "model")],
        cwd=REPO,
        env=env(),
        check=True,
        capture_output=True,
    )
    rows = [{"prompt": f"w{i} x{i % 7} ->", "completion": f" x{i % 7} w{i}"} for i in range(64)]
    (jobdir / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the gate's eval set: held-out rows the training never saw, one canary (a row it must never get
    # wrong; also unseen: an eval row found in train.jsonl is refused)
    evals = [
        {"id": f"h{i}", "slice": "heldout", "prompt": f"w{i} x{i % 7} ->", "expected": f" x{i % 7} w{i}"}
        for i in range(64, 70)
    ]
    evals.append({"id": "c0", "slice": "canary", "prompt": "w70 x0 ->", "expected": " x0 w70"})
    (jobdir / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in evals))
    # the baseline it must beat: a rule that always answers x0 (recorded predictions)
    (jobdir / "baseline.jsonl").write_text(
        "".join(json.dumps({"id": r["id"], "predicted": " x0 " + r["prompt"].split()[0]}) + "\n" for r in evals)
    )
    (jobdir / "job.yaml").write_text(DEMO_JOB)
    console.print("what would be rented now, at what all-in cost, kill-time and reservation (nothing created):")
    sh("submit", str(jobdir / "job.yaml"), "--dry-run", "--top", "3")
    gated_id = sh("submit", str(jobdir / "job.yaml")).stdout.strip()
    console.print(
        f"a job with a gate trains one adapter per seed: {gated_id}-seed-1 and {gated_id}-seed-2, "
        "each provisioned and supervised on its own"
    )
    byo_id = submit_byo_job(jobdir)
    job_id = f"{gated_id}-seed-1"  # the run this demo watches (and interrupts)
    ledger = Ledger(engine(load_settings(env())))

    def phase(of: str) -> str:
        jobs = json.loads(sh("jobs", "--json", show=False, echo=False).stdout)
        return next(str(j["phase"]) for j in jobs if j["job_id"] == of)

    console.print("watching the job (boot watch every 10 s of simulated time, SSH preflight on the host)...")
    wait_for(lambda: ledger.rows(job=job_id, kind="training_started"), 300, "a verified host to start training", 1.0)
    sh("ledger", "show", "--job", job_id, limit_lines=80)
    sh("hosts")

    section("5. The host vanishes mid-run; the job comes back on another machine from its last checkpoint")
    market = SimClientMarket(EXTRA_ENV["TUNEHARNESS_SIM_URL"])

    def checkpoint_pulled() -> bool:
        return bool(ledger.rows(job=job_id, kind="checkpoint_pulled"))

    wait_for(checkpoint_pulled, 300, "the first checkpoint to be pulled off the host", 0.5)
    victim = ledger.rows(job=job_id, kind="training_started")[-1]
    console.print(
        f"[red]destroying {victim.instance} on {victim.machine} behind the fleet's back "
        "(the host disappears, as marketplace hosts do)[/]"
    )
    market.destroy(victim.instance or "")
    wait_for(lambda: ledger.rows(job=job_id, kind="recovery"), 300, "the job to resume elsewhere", 1.0)
    wait_for(lambda: phase(job_id) in ("failed", "done"), 400, "the job to finish training", 1.0)
    console.print(
        "the recovery hedges: with no verified host waiting, it rents beside its own replacement as many "
        "standby hosts as the marketplace's observed dud rate calls for; the first verified host takes "
        "the job, the others are held for a while (hold-and-batch) and then stopped by the hold sweep"
    )
    kinds = (
        "host_lost",
        "instance_stopped",
        "standby_wanted",
        "attempt_handed_over",
        "host_adopted",
        "host_held",
        "host_released",
        "recovery",
        "training_started",
        "adapter_pulled",
    )
    for e in ledger.rows(job=job_id, kind=list(kinds)):
        detail = {
            k: e.payload[k]
            for k in ("resume_step", "recovery_s", "step", "detected_at", "count", "standby")
            if k in e.payload
        }
        console.print(f"  seq {e.seq:>3} {e.kind:<19} {e.instance or '':<7} {e.machine or '':<9} {e.reason} {detail}")
    sh("status")
    sh("hosts", "held", "--all")
    verify_bit_identical(job_id, jobdir)
    sh("receipt", "--job", job_id)
    show_byo_job(byo_id, ledger, phase)

    section("6. The deploy gate: both seeds' adapters against the baseline, judged on the worst seed")
    console.print(
        "when the last seed's adapter is pulled, the supervisor enqueues evaluate_job: each adapter "
        "predicts the eval set through `python -m trainer predict`, the gate judges the trial"
    )
    wait_for(lambda: phase(gated_id) in ("failed", "done"), 300, "the gate's decision", 1.0)
    sh("jobs")
    for e in ledger.rows(kind=["adapter_pulled", "gate_decision", "job_evaluated"]):
        console.print(f"  seq {e.seq:>3} {e.kind:<15} {e.job or '':<32} {e.reason}")
    sh("gate", "history")
    decision = ledger.rows(job=gated_id, kind="job_evaluated")
    if decision and decision[-1].payload.get("decision") == "refuse":
        console.print(
            f"refused ({decision[-1].reason.split(': ', 1)[-1]}): a 40-step LoRA on a tiny random model "
            "does not beat the always-x0 rule on held-out rows by the worst seed (a tie is refused); the "
            "`gate_refused` alert is raised and nothing goes to production. That is the gate doing its job."
        )
    autoresearch(jobdir)


RESEARCH_BASE = """\
name: demo-research-base
train:
  base_model: model
  task: causal_lm
  train_file: train.jsonl
  max_steps: 100000           # the time box ends each experiment
  checkpoint_every: 100
  seed: 1
  learning_rate: 1.0e-3
  lr_schedule: constant
  batch_size: 8
  max_seq_len: 48
  lora: {r: 4, alpha: 8, target_modules: [q_proj, v_proj]}
  quantization: none
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 0.3
  train_hours: 0.05
"""

RESEARCH = """\
name: demo-search
job: job.yaml
axes:
  learning_rate: {times: [4.0, 0.25]}
time_box_s: 10
val_fraction: 0.25
tier: RTX 3090
iterations: 1
mutations: 2
parallelism: 2
baseline_seeds: [1, 2]
budget_usd: 3.0
job_budget_usd: 0.5
"""


def autoresearch(jobdir: Path) -> None:
    """A research run on the same fleet: a two-seed baseline, then two one-axis changes, all time-boxed."""
    section("7. Autoresearch: time-boxed experiments on rented hosts, a change kept only above the noise")
    rdir = DEMO / "research"
    rdir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(jobdir / "model", rdir / "model", dirs_exist_ok=True)
    shutil.copy(jobdir / "train.jsonl", rdir / "train.jsonl")
    (rdir / "job.yaml").write_text(RESEARCH_BASE)
    (rdir / "research.yaml").write_text(RESEARCH)
    run = sh("research", "start", str(rdir / "research.yaml")).stdout.strip()

    def phase() -> str:
        out = sh("research", "show", run, "--json", show=False, echo=False, check=False).stdout
        return str(json.loads(out).get("phase", "")) if out.strip().startswith("{") else ""

    console.print("each experiment is a job: reserved from the run's budget, provisioned, preflighted, supervised")
    try:
        wait_for(lambda: phase() == "finished", 420, "the research run", 2.0)
    except SystemExit:
        sh("research", "stop", run, check=False)
        raise
    sh("research", "board", run)


BYO_JOB = """\
name: demo-own-trainer
train:                    # your own transformers.Trainer script, run under the same guarantees
  kind: command
  script: sft.py
  args: [--model, base_model, --data, train.jsonl, --max-steps, "16", --save-steps, "4"]
  base_model: model
  train_file: train.jsonl
  max_steps: 16
needs:
  gpu: [RTX 3090]
  providers: [sim]
  disk_gb: 20
  download_gb: 3
  train_hours: 0.05
budget_usd: 2.0
"""


def submit_byo_job(jobdir: Path) -> str:
    """A plain transformers.Trainer script (examples/byo/) as a `kind: command` job beside the built-in one."""
    byo = DEMO / "byo"
    byo.mkdir(parents=True, exist_ok=True)
    shutil.copytree(jobdir / "model", byo / "model", dirs_exist_ok=True)
    shutil.copy(jobdir / "train.jsonl", byo / "train.jsonl")
    shutil.copy(REPO / "examples" / "byo" / "hf_trainer_sft.py", byo / "sft.py")
    (byo / "job.yaml").write_text(BYO_JOB)
    byo_id = sh("submit", str(byo / "job.yaml")).stdout.strip()
    console.print(
        f"beside it, {byo_id}: a plain transformers.Trainer script (docs/byo-training.md); the trainer agent "
        "injects a callback for status, slice caps that save and stop, and verified checkpoints"
    )
    return byo_id


def show_byo_job(byo_id: str, ledger: Any, phase: Callable[[str], str]) -> None:
    """The Trainer-based job's way: sliced, checkpoints pulled, its adapter pulled like the built-in one's."""
    wait_for(lambda: phase(byo_id) in ("failed", "done"), 300, "the Trainer-based job to finish", 1.0)
    kinds = ["training_started", "checkpoint_pulled", "adapter_pulled"]
    for e in ledger.rows(job=byo_id, kind=kinds):
        console.print(f"  seq {e.seq:>3} {e.kind:<17} {e.instance or '':<7} {e.reason}")
    console.print(f"{byo_id}: {phase(byo_id)}")


def verify_bit_identical(job_id: str, jobdir: Path) -> None:
    """Train the same job locally without interruption and compare the adapters."""
    from safetensors.torch import load_file

    from app.jobs import load_job_file
    from app.services.supervisor import bundle_for_spec

    spec = load_job_file(jobdir / "job.yaml")
    bundle = bundle_for_spec(spec.train, base_dir=spec.base_dir)
    ref = DEMO / "reference"
    (ref / "data").mkdir(parents=True, exist_ok=True)
    (ref / "base_model").symlink_to(jobdir / "model")
    (ref / "data" / "train.jsonl").write_text((jobdir / "train.jsonl").read_text())
    (ref / "job.json").write_text(json.dumps(dict(bundle.job_json)))
    console.print("the same job trained here without interruption, for comparison...")
    subprocess.run(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(ref)],
        cwd=REPO,
        env=env(),
        check=True,
        capture_output=True,
    )
    got = load_file(str(HOME / "artifacts" / "jobs" / job_id / "adapter" / "adapter_model.safetensors"))
    want = load_file(str(ref / "adapter" / "adapter_model.safetensors"))
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    verdict = "[green]bit-identical[/]" if diff <= 1e-6 else "[red]DIFFERENT[/]"
    console.print(f"adapter after two hosts vs uninterrupted run: max abs diff {diff:.1e} -> {verdict}")


def money_guardrails() -> None:
    section("8. Budgets are reserved before anything is spent")
    from app.bootstrap import engine
    from app.budget import Budget
    from app.errors import BudgetExceeded
    from app.settings import load_settings

    sh("budget", "set", "demo", "--cap-usd", "0.50")
    b = Budget(engine(load_settings(env())))
    for i in range(3):
        try:
            r = b.reserve("demo", 0.20, job=f"demo-reserve-{i}")
            console.print(f"reserve $0.20 for create #{i + 1}: [green]ok[/] ({r.id})")
        except BudgetExceeded as exc:
            console.print(f"reserve $0.20 for create #{i + 1}: [red]refused[/] - {exc}")
    sh("budget", "show")


def ledger_integrity() -> None:
    section("9. The ledger is append-only and hash-chained")
    import sqlite3

    sh("ledger", "note", "demo: nothing was destroyed by hand")
    con = sqlite3.connect(HOME / "tuneharness.db")
    try:
        con.execute("UPDATE ledger_events SET amount_usd = 0 WHERE seq = 1")
        console.print("[red]UPDATE was accepted?![/]")
    except sqlite3.DatabaseError as exc:
        console.print(f"sqlite> UPDATE ledger_events ...  -> [green]refused by the database:[/] {exc}")
    con.close()
    verified = sh("ledger", "verify")
    anchor = verified.stdout.strip().splitlines()[-1].removeprefix("anchor: ")
    sh("ledger", "note", "demo: one more event after the anchor was written down")
    console.print("the anchor printed above, kept outside the database, checked later:")
    sh("ledger", "verify", "--anchor", anchor)
    tampered = DEMO / "tampered.db"
    src = sqlite3.connect(HOME / "tuneharness.db")
    dst = sqlite3.connect(tampered)
    src.backup(dst)
    src.close()
    dst.close()
    con = sqlite3.connect(tampered)
    con.execute("DROP TRIGGER ledger_no_update")
    con.execute("UPDATE ledger_events SET amount_usd = 0.0 WHERE seq = 2")
    con.commit()
    con.close()
    console.print("a copy of the ledger edited with its triggers dropped:")
    sh("ledger", "verify", check=False, extra_env={"TUNEHARNESS_DB_URL": f"sqlite:///{tampered}"})


def triage_real_logs() -> None:
    section("10. train.log triage on real logs from public issue threads: rules, then the promoted specialist")
    import json

    from app.triage.corpus import REAL_BATCHES, real_rows
    from app.triage.rules import STATES

    # Every real test half (never tuned on, never trained on) in one `triage --jsonl` call (the
    # model loads once); the table shows, per state, the first excerpt of the latest batch that has it.
    rows = [r for _, test in REAL_BATCHES for r in real_rows(test)]
    path = DEMO / "triage.jsonl"
    path.write_text(
        "".join(json.dumps({"id": r["id"], "log": r["log"], "idle_seconds": r["idle_seconds"]}) + "\n" for r in rows)
    )
    out = sh("triage", "--jsonl", str(path), show=False)
    got = {g["id"]: g for g in map(json.loads, out.stdout.splitlines())}
    latest_first = [r for _, test in reversed(REAL_BATCHES) for r in rows if r["split"] == f"real-{test}"]
    picked = [
        next(r for r in latest_first if r["state"] == state)
        for state in STATES
        if any(r["state"] == state for r in rows)
    ]
    table = Table("excerpt", "the thread's own label", "chain", "stage", "what the supervisor does")
    for r in picked:
        g = got[r["id"]]
        mark = "" if g["state"] == r["state"] else " [red](miss)[/]"
        table.add_row(r["id"], r["state"], g["state"] + mark, g["stage"], g["action"])
    console.print(table)
    right = sum(1 for r in rows if got[r["id"]]["state"] == r["state"])
    console.print(
        f"all {len(rows)} real test excerpts ({len(REAL_BATCHES)} batches), just now: chain right on "
        f"[bold]{right}[/] ({right / len(rows):.3f}); per state and per batch: `python bench/triage_real.py`"
    )
    # The rules stage's speed on the same excerpts, measured here (one pass, process CPU time, the
    # line memories emptied first): a reading of this machine, not a test; `bench/triage.py` has 8-32 KB.
    from app.triage import rules

    rules._forget()
    t0 = time.process_time()
    for r in rows:
        rules.classify(r["log"], idle_seconds=r["idle_seconds"])
    rate = len(rows) / max(time.process_time() - t0, 1e-9)
    console.print(
        f"rules stage on those {len(rows)} excerpts, just now: [bold]{rate:,.0f} tails/s[/] on one core "
        f"(target 5,000; 8-32 KB tails: `taskset -c 0 python bench/triage.py`)"
    )
    # One train.log as a file: a rank's OOM under ~18 KB of the launcher's SIGTERM noise, a stray
    # non-UTF-8 byte in it. The CLI (and the supervisor's probe) read its last 32 KB as bytes.
    noise = "".join(
        f"[rank{r}]:W1201 12:00:0{r % 10} torch/distributed/elastic/multiprocessing/api.py:897] "
        f"Sending process {4000 + r} closing signal SIGTERM\n"
        for r in range(160)
    )
    log = DEMO / "train.log"
    log.write_bytes(
        b"step 40 loss=1.2 \xff\n" * 2000 + b"[rank3]: torch.OutOfMemoryError: CUDA out of memory. "
        b"Tried to allocate 8.00 GiB\n" + noise.encode()
    )
    t0 = time.perf_counter()
    sh("triage", str(log), "--no-specialist", "--no-llm")
    console.print(
        f"one verdict from the CLI, its start-up included, just now: [bold]{time.perf_counter() - t0:.1f} s[/] "
        "(the rules load in about 0.3 s of it; with no LLM configured the database layer is never imported)"
    )
    # A checkpoint write refused: retrying on the same host gets the same answer, so the operator is told.
    denied = DEMO / "denied.log"
    denied.write_text(
        "{'loss': 0.91, 'grad_norm': 1.2, 'learning_rate': 2e-05, 'epoch': 0.5}\n"
        "Saving model checkpoint to /workspace/out/checkpoint-500\n"
        "PermissionError: [Errno 13] Permission denied: '/workspace/out/checkpoint-500'\n"
    )
    sh("triage", str(denied), "--no-specialist", "--no-llm")
    # A collective the NCCL watchdog timed out, its reason cut mid-word as an excerpt posted it: a stall
    # (restart the slice on the same host), where an NCCL error would have replaced the host.
    aborted = DEMO / "aborted.log"
    aborted.write_text(
        '  File "torch/distributed/distributed_c10d.py", line 1700, in all_reduce\n'
        "    work = default_pg.allreduce([tensor], opts)\nRuntimeError: NCCL communicator was aborted on "
        "rank 0.  Original reason for failure was: [Rank 0] Watchdog caug"
    )
    sh("triage", str(aborted), "--no-specialist", "--no-llm")
    # An OS error under a checkpoint save on a shared filesystem, its own line cut as an excerpt posted
    # it: the traceback's frames say a checkpoint was being written (io_error), not a bare exception.
    saving = DEMO / "saving.log"
    saving.write_text(
        '[rank8]:   File "recipes/base_recipe.py", line 310, in save_checkpoint\n'
        "[rank8]:     self.checkpointer.save_on_global_ranks(state, key, path)\n"
        '[rank8]:   File "components/checkpoint/checkpointing.py", line 2011, in _create_dirs\n'
        "[rank8]:     os.makedirs(directory, exist_ok=True)\n"
        "[rank8]: FileExistsError: [Errno 17] File e"
    )
    sh("triage", str(saving), "--no-specialist", "--no-llm")


def operators_cockpit() -> None:
    section("11. The operator's cockpit: a job's timeline, every page in one file, Prometheus, a cost plan")
    import json

    jobs = json.loads(sh("jobs", "--json", show=False, echo=False).stdout)
    seed_run = next((j["job_id"] for j in jobs if str(j["job_id"]).endswith("-seed-1")), None)
    if seed_run is not None:
        sh("jobs", "show", seed_run, limit_lines=30)
    report = DEMO / "report.html"
    sh("report", "--html", str(report))
    console.print(
        f"{report} ({report.stat().st_size // 1024} KiB): fleet, money, reliability and each job, with its "
        "plots, in one file that references nothing outside it (`tuneharness web` serves the same pages live)"
    )
    sh("metrics", limit_lines=14)
    console.print("the database's schema revision (upgrades are Alembic migrations), and the job file's JSON Schema:")
    sh("db", "current")
    sh("schema", "job", limit_lines=6)
    console.print("what 4 jobs of 3 h on an A100 would cost, three ways (5 seeds here; 30 by default):")
    sh("plan", "--gpu", "A100", "--train-hours", "3", "--jobs", "4", "--seeds", "5")


def main() -> None:
    if DEMO.exists():
        shutil.rmtree(DEMO)
    HOME.mkdir(parents=True)
    console.print(Rule("[bold magenta]tuneharness demo"))
    marketplace_seam()
    campaign_in_money()
    two_drivers()
    real_preflights()
    learned_speeds()
    fleet_and_job()
    money_guardrails()
    ledger_integrity()
    triage_real_logs()
    operators_cockpit()
    console.print()
    console.print(Rule("[bold green]demo finished"))


if __name__ == "__main__":
    main()
