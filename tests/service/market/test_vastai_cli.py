"""The fake Vast server driven by Vast's own client, the `vastai` CLI from PyPI (a dev dependency):
what the vendor's tool sends, the fake answers, and our adapter sends the same list query."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from providers.fakes import FakeVast
from providers.vast import VastMarket

VASTAI = shutil.which("vastai", path=str(Path(sys.executable).parent)) or shutil.which("vastai")
pytestmark = pytest.mark.skipif(VASTAI is None, reason="the vastai CLI is not installed: pip install -e '.[dev]'")


def _vastai(fake: FakeVast, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert VASTAI is not None
    return subprocess.run(
        [VASTAI, "--url", fake.url, "--api-key", fake.api_key, "--retry", "1", *args],
        capture_output=True,
        text=True,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        timeout=120,
        check=False,
    )


def test_vastai_show_instances_sees_every_instance_across_pages(fake_vast: FakeVast, tmp_path: Path) -> None:
    """`vastai show instances --raw` pages through 60 instances and our adapter asks the same query."""
    ids = [fake_vast.add_instance(label=f"th-job-{i}") for i in range(60)]
    done = _vastai(fake_vast, tmp_path, "--raw", "show", "instances")
    assert done.returncode == 0, done.stderr
    assert [str(row["id"]) for row in json.loads(done.stdout)] == ids
    cli_calls = fake_vast.calls_to("/api/v1/instances/")
    assert len(cli_calls) == 3 and all(c.authorized for c in cli_calls)
    fake_vast.clear_calls()
    market = VastMarket(api_key=fake_vast.api_key, api_url=fake_vast.url)
    try:
        assert [i.instance_id for i in market.list_instances()] == ids
    finally:
        market.close()
    ours = fake_vast.calls_to("/api/v1/instances/")
    assert [c.query for c in ours] == [c.query for c in cli_calls]


def test_vastai_show_and_stop_one_instance_on_v0(fake_vast: FakeVast, tmp_path: Path) -> None:
    """`show instance ID` and `stop instance ID` use the v0 routes the fake serves."""
    iid = fake_vast.add_instance(label="th-one")
    fake_vast.boot(iid)
    shown = _vastai(fake_vast, tmp_path, "--raw", "show", "instance", iid)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["id"] == int(iid)
    stopped = _vastai(fake_vast, tmp_path, "stop", "instance", iid)
    assert stopped.returncode == 0 and f"stopping instance {iid}" in stopped.stdout
    assert fake_vast.instances[iid]["intended_status"] == "stopped"


def test_vastai_lists_and_rejects_a_price_increase(fake_vast: FakeVast, tmp_path: Path) -> None:
    """The CLI reads the fake's pending increases and its reject reaches the fake with the pending id."""
    iid = fake_vast.add_instance(dph_total=0.3)
    pid = fake_vast.raise_price(iid, new_gpu_costpersec=0.001)
    shown = _vastai(fake_vast, tmp_path, "--raw", "show", "pending-price-increases")
    assert shown.returncode == 0, shown.stderr
    assert [r["pending_price_increase_id"] for r in json.loads(shown.stdout)["pending_price_increases"]] == [pid]
    rejected = _vastai(fake_vast, tmp_path, "reject", "price-increase", iid, "--yes")
    assert rejected.returncode == 0, rejected.stderr
    assert fake_vast.answered_increases == [(pid, "reject")]
    assert fake_vast.calls_to("reject-price-increase")[0].body == {"pending_price_increase_id": pid}
