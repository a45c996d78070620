"""SQL statements per training poll and per budget-monitor pass, grouped by text.

    python bench/poll_queries.py                  # 20 and 200 live rentals beside the polled job
    python bench/poll_queries.py --live 500 --show 15

One job is provisioned and supervised on the simulated marketplace (the supervisor's service-level
harness, SQLite); `--live` other jobs each hold a live rental under a cap of their own. Counted with
SQLAlchemy's `before_cursor_execute`: one steady training poll holding its own budget caps, one the
beat's budget monitor covers, and one budget-monitor pass over the whole fleet (`sweep_budgets`).
A count that grows with the number of live rentals is a per-rental query in a loop. Nothing is
written; `tests/service/provisioning/test_supervisor_poll_queries.py` and
`tests/service/guardrails/test_budget_pass_queries.py` hold the counts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app.services.guardrails import sweep_budgets  # noqa: E402
from tests.support.query_count import add_live_rentals, counting  # noqa: E402


def measure(live: int) -> dict[str, Counter[str]]:
    """Statements of one steady poll (with its own budget guard, and covered by the beat's budget
    monitor) and of one budget-monitor pass, with `live` other live rentals."""
    from app.liveness import BUDGET_MONITOR_CLEAN, record_success
    from tests.service.provisioning.test_supervisor_service import Harness, _training

    with tempfile.TemporaryDirectory() as tmp:
        h = Harness(Path(tmp))
        inst, seq = h.start()
        seq, _, _ = h.poll(seq)
        _training(h.hosts[inst], 3)
        seq, _, _ = h.poll(seq)
        add_live_rentals(h.prov.rentals, live, now=h.clock.now())
        _training(h.hosts[inst], 5)
        with counting(h.engine) as guarded:
            seq, _, _ = h.poll(seq)
        record_success(h.engine, BUDGET_MONITOR_CLEAN, h.clock.now())
        _training(h.hosts[inst], 7)
        with counting(h.engine) as covered:
            h.poll(seq)
        rentals = h.prov.rentals
        sweep: Callable[[], object] = lambda: sweep_budgets(  # noqa: E731
            rentals.budget, rentals=rentals, markets={"sim": h.market}, now=h.clock.now()
        )
        with counting(h.engine) as monitor:
            sweep()
        h.engine.dispose()
        return {
            "poll (own budget guard)": guarded,
            "poll (beat's monitor covers)": covered,
            "budget monitor pass": monitor,
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--live", type=int, action="append", help="live rentals beside the polled job (repeatable)")
    p.add_argument("--show", type=int, default=10, help="most repeated statements shown per measurement")
    args = p.parse_args(argv)
    for live in args.live or [20, 200]:
        for name, seen in measure(live).items():
            print(f"== {name}, {live} live rentals: {sum(seen.values())} statements, {len(seen)} distinct")
            for text, n in seen.most_common(args.show):
                print(f"  {n:5d}  {text[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
