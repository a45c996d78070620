"""Foundation benchmarks: ledger appends, verify, budget reservations, Celery round trips.

    .venv/bin/python bench/foundation.py [--pg URL]

Prints a markdown table and writes bench/results/foundation.json (`bench/report.py` renders it).
Uses a private redis-server and a real worker process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from bench import _results  # noqa: E402


def bench_ledger(url: str, n: int) -> tuple[float, float]:
    from app.db import init_db, make_engine
    from app.ledger import Event, Ledger

    engine = make_engine(url)
    init_db(engine)
    ledger = Ledger(engine)
    t0 = time.perf_counter()
    for i in range(n):
        ledger.append(Event(kind="bench", job="b", amount_usd=0.01, payload={"i": i}))
    appends = n / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    assert ledger.verify().ok
    verify = n / (time.perf_counter() - t0)
    return appends, verify


def bench_reserve(url: str, n: int) -> float:
    from app.budget import Budget
    from app.db import init_db, make_engine

    engine = make_engine(url)
    init_db(engine)
    b = Budget(engine)
    b.set_cap("bench", 1e9)
    t0 = time.perf_counter()
    for _ in range(n):
        b.reserve("bench", 0.5)
    return n / (time.perf_counter() - t0)


def bench_celery(n: int) -> float:
    from celery import Celery

    from app.settings import load_settings
    from support.services import CeleryWorker, start_redis
    from workers.config import build_config

    tmp = Path(tempfile.mkdtemp())
    redis = start_redis(tmp)
    env = {
        **os.environ,
        "TUNEHARNESS_HOME": str(tmp / "home"),
        "TUNEHARNESS_BROKER_URL": redis.url,
        "PYTHONPATH": str(REPO),
    }
    worker = CeleryWorker.start(env, cwd=REPO, queues="maintenance", concurrency=2, name="bench")
    try:
        client = Celery("bench")
        client.conf.update(build_config(load_settings(env)))
        client.send_task("tuneharness.maintenance.ping", queue="maintenance").get(timeout=60)
        t0 = time.perf_counter()
        results = [client.send_task("tuneharness.maintenance.ping", queue="maintenance") for _ in range(n)]
        for r in results:
            r.get(timeout=120)
        return n / (time.perf_counter() - t0)
    finally:
        worker.stop()
        redis.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pg", default=None, help="a PostgreSQL SQLAlchemy URL to bench too")
    ap.add_argument("-n", type=int, default=1000)
    args = ap.parse_args()
    started = _results.start()
    rows = []
    rates: dict[str, dict[str, float]] = {}
    tmp = tempfile.mkdtemp()
    dbs = [("SQLite", f"sqlite:///{tmp}/bench.db")]
    if args.pg:
        dbs.append(("PostgreSQL", args.pg))
    for name, url in dbs:
        appends, verify = bench_ledger(url, args.n)
        rows.append((f"ledger append ({name})", f"{appends:,.0f} events/s"))
        rows.append((f"ledger verify ({name})", f"{verify:,.0f} rows/s"))
        reserve = bench_reserve(url, args.n // 2)
        rows.append((f"budget reserve ({name})", f"{reserve:,.0f} reservations/s"))
        rates[name] = {
            "ledger_append_per_s": appends,
            "ledger_verify_rows_per_s": verify,
            "budget_reserve_per_s": reserve,
        }
    celery = bench_celery(args.n)
    rows.append(("Celery ping round trip (Redis, 2 worker processes)", f"{celery:,.0f} tasks/s"))
    print("| what | rate |\n|---|---|")
    for what, rate in rows:
        print(f"| {what} | {rate} |")
    _results.write(
        "foundation",
        result_tables(rates, celery, n=args.n),
        started=started,
        raw={"n": args.n, "databases": rates, "celery_tasks_per_s": celery},
    )


def result_tables(rates: dict[str, dict[str, float]], celery: float, *, n: int) -> list[dict[str, Any]]:
    """The measured rates as the tables `bench/report.py` renders."""
    names = list(rates)
    ops = (
        ("ledger append (one event per transaction)", "events/s", "ledger_append_per_s"),
        ("ledger verify (the hash chain re-read)", "rows/s", "ledger_verify_rows_per_s"),
        ("budget reservation", "reservations/s", "budget_reserve_per_s"),
    )
    db = _results.table(
        "Ledger and budget throughput",
        ["operation", "unit", *names],
        [[what, unit, *(round(rates[name][key]) for name in names)] for what, unit, key in ops],
        note=f"{n:,} appends and verified rows, {n // 2:,} reservations per database; SQLite: a WAL file "
        "in a temporary directory.",
    )
    queue = _results.table(
        "Celery round trip",
        ["what", "tasks/s"],
        [["`tuneharness.maintenance.ping` sent and awaited through Redis, 2 worker processes", round(celery)]],
        note=f"{n:,} tasks sent at once, then every result awaited; a private redis-server and a real worker.",
    )
    return [db, queue]


if __name__ == "__main__":
    main()
