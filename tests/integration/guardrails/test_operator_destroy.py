"""Only the operator destroys, and `destroy --stopped --older-than` cleans up in bulk after asking."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

from app.db import init_db, make_engine
from app.market import LaunchSpec, OfferQuery
from app.rentals import Rentals
from app.settings import load_settings
from providers.fakes import FakeVast
from providers.vast import VastMarket

Cli = Callable[..., CompletedProcess[str]]
SPEC = LaunchSpec(image="img", disk_gb=50, label="", ssh_public_key="ssh-ed25519 AAAA t")


def test_bulk_destroy_of_stopped_instances_lists_storage_and_needs_confirmation(
    cli: Cli, th_env: dict[str, str], th_home: Path
) -> None:
    """Without a terminal or --yes nothing goes; with --yes the old stopped ones go, the rest stay."""
    with FakeVast(offers=[]) as vast:
        env = {**th_env, "VAST_API_URL": vast.url, "VAST_API_KEY": vast.api_key, "TUNEHARNESS_PROVIDER_BACKOFF_S": "0"}
        engine = make_engine(load_settings(env).db_url)
        init_db(engine)
        rentals = Rentals(engine)
        rentals.budget.set_cap("default", 100.0)
        market = VastMarket(api_key=vast.api_key, api_url=vast.url)
        ids = []
        for i in range(3):
            oid = vast.add_offer(storage_cost=0.2)
            offer = next(o for o in market.search_offers(OfferQuery(limit=1000)) if o.offer_id == oid)
            plan = rentals.plan(
                job=f"j{i}",
                attempt=1,
                offer=offer,
                disk_gb=50,
                ttl_s=3600,
                now=time.time() - 7200,
                reserve_usd=1.0,
                budget_name="default",
                spec=SPEC,
            )
            ids.append(rentals.execute(plan.id, market=market, now=time.time() - 7200).id)
        for rid in ids[:2]:  # two stopped two hours ago; the third keeps running
            rentals.stop(rid, market=market, reason="idle", kind="instance_stopped", now=time.time() - 7000)

        refused = cli("destroy", "--provider", "vast", "--stopped", "--older-than", "1h", env=env)
        assert refused.returncode == 2 and "nothing was destroyed" in refused.stderr
        assert len(vast.instances) == 3
        assert "$20.00/month" in refused.stdout  # 2 x 50 GB x $0.20

        done = cli("destroy", "--provider", "vast", "--stopped", "--older-than", "1h", "--yes", env=env)
        assert done.returncode == 0, done.stderr
        assert len(vast.instances) == 1
        states = [rentals.get(rid).state for rid in ids]  # type: ignore[union-attr]
        assert states == ["destroyed", "destroyed", "active"]
        shown = json.loads(cli("ledger", "show", "--kind", "instance_destroyed", "--json", env=env).stdout)
        assert len(shown) == 2 and {r["reason"] for r in shown} == {"operator"}
        status = {s.name: s for s in rentals.budget.status()}["default"]
        assert status.spent_usd > 0  # destroyed rentals were settled with what they billed


def test_destroy_needs_an_instance_or_stopped(cli: Cli) -> None:
    """`destroy` with neither target says how to use it."""
    out = cli("destroy", "--provider", "vast")
    assert out.returncode == 2 and "--stopped" in out.stderr
