"""Foundation benchmarks: ledger appends, verify, budget reservations, Celery round trips.

    .venv/bin/python bench/foundation.py [--pg URL]

Prints a markdown table. Uses a private redis-server and a real worker process.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]


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
    env = {**os.environ, "TUNEHARNESS_HOME": str(tmp / "home"), "TUNEHARNESS_BROKER_URL": redis.url,
           "PYTHONPATH": str(REPO)}
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
    rows = []
    tmp = tempfile.mkdtemp()
    dbs = [("SQLite", f"sqlite:///{tmp}/bench.db")]
    if args.pg:
        dbs.append(("PostgreSQL", args.pg))
    for name, url in dbs:
        appends, verify = bench_ledger(url, args.n)
        rows.append((f"ledger append ({name})", f"{appends:,.0f} events/s"))
        rows.append((f"ledger verify ({name})", f"{verify:,.0f} rows/s"))
        rows.append((f"budget reserve ({name})", f"{bench_reserve(url, args.n // 2):,.0f} reservations/s"))
    rows.append(("Celery ping round trip (Redis, 2 worker processes)", f"{bench_celery(args.n):,.0f} tasks/s"))
    print("| what | rate |\n|---|---|")
    for what, rate in rows:
        print(f"| {what} | {rate} |")


if __name__ == "__main__":
    main()
