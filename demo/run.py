"""`make demo`: the main job of tuneharness, end to end, on this machine.

Each section runs the real commands a user would type, against a fresh TUNEHARNESS_HOME under
.demo/, with a private redis-server, a real Celery worker and beat. Every capability that lands
adds a section here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402
from rich.rule import Rule  # noqa: E402

console = Console(width=int(os.environ.get("COLUMNS", "150")))
HOME = REPO / ".demo" / "home"
EXTRA_ENV: dict[str, str] = {}


def env() -> dict[str, str]:
    e = dict(os.environ)
    for k in list(e):
        if k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_")):
            del e[k]
    e.update(TUNEHARNESS_HOME=str(HOME), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONPATH=str(REPO),
             COLUMNS=os.environ.get("COLUMNS", "150"))
    e.update(EXTRA_ENV)
    return e


def section(title: str) -> None:
    console.print()
    console.print(Rule(f"[bold]{title}"))


def sh(*args: str, check: bool = True, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `tuneharness ARGS` as a user would, echoing the command and its output."""
    console.print(f"[cyan]$ tuneharness {' '.join(args)}")
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", *args], env={**env(), **(extra_env or {})},
                          cwd=REPO, text=True, capture_output=True)
    out = (proc.stdout + proc.stderr).rstrip()
    if out:
        console.print(out, markup=False, highlight=False)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo step failed: tuneharness {' '.join(args)} exited {proc.returncode}")
    return proc


def wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise SystemExit(f"demo: timed out waiting for {what}")


def foundation() -> None:
    """A job travels through the queue: provision -> evaluate, leaving ledger events."""
    from celery import Celery

    from app.settings import load_settings
    from app.stack import Stack, free_port
    from workers.config import build_config

    section("1. The fleet: redis, a Celery worker, one beat, Flower (tuneharness up)")
    demo_env = {**env(), "TUNEHARNESS_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
                "TUNEHARNESS_FLOWER_PORT": str(free_port())}
    os.environ.update(demo_env)
    settings = load_settings(demo_env)
    from app.bootstrap import engine

    engine(settings)
    stack = Stack(settings, run_dir=HOME / "run", flower=True, worker_concurrency=2)
    with stack:
        EXTRA_ENV.update(TUNEHARNESS_BROKER_URL=stack.broker_url)
        console.print(f"broker {stack.broker_url} (started for the demo), worker, beat, "
                      f"Flower on http://127.0.0.1:{settings.flower_port}")
        wait_for(lambda: b"ready." in (stack.run_dir / "worker.log").read_bytes(), 120, "the worker")
        client = Celery("demo-client")
        client.conf.update(build_config(load_settings({**demo_env, "TUNEHARNESS_BROKER_URL": stack.broker_url})))

        section("2. A job travels through the queue and leaves ledger events")
        job = f"demo-{int(time.time())}"
        console.print(f"enqueue tuneharness.provision.accept_job({job!r}) on the provision queue")
        client.send_task("tuneharness.provision.accept_job", args=[job], queue="provision").get(timeout=120)
        from app.ledger import Ledger

        ledger = Ledger(engine(settings))
        wait_for(lambda: any(r.kind == "job_finished" for r in ledger.rows(job=job)), 60, "the evaluate step")
        sh("ledger", "show", "--job", job)

        section("3. Budgets are reserved before anything is spent")
        sh("budget", "set", "demo", "--cap-usd", "0.50")
        from app.budget import Budget
        from app.errors import BudgetExceeded

        b = Budget(engine(settings))
        for i in range(3):
            try:
                r = b.reserve("demo", 0.20, job=f"{job}-{i}")
                console.print(f"reserve $0.20 for create #{i + 1}: [green]ok[/] ({r.id})")
            except BudgetExceeded as exc:
                console.print(f"reserve $0.20 for create #{i + 1}: [red]refused[/] - {exc}")
        sh("budget", "show")

        section("4. The ledger is append-only and hash-chained")
        sh("ledger", "note", "demo: nothing was destroyed by hand")
        import sqlite3

        db = HOME / "tuneharness.db"
        con = sqlite3.connect(db)
        try:
            con.execute("UPDATE ledger_events SET amount_usd = 0 WHERE seq = 1")
            console.print("[red]UPDATE was accepted?![/]")
        except sqlite3.DatabaseError as exc:
            console.print(f"sqlite> UPDATE ledger_events ...  -> [green]refused by the database:[/] {exc}")
        con.close()
        sh("ledger", "verify")



def main() -> None:
    if HOME.exists():
        shutil.rmtree(HOME)
    HOME.mkdir(parents=True)
    console.print(Rule("[bold magenta]tuneharness demo"))
    foundation()
    console.print()
    console.print(Rule("[bold green]demo finished"))


if __name__ == "__main__":
    main()
