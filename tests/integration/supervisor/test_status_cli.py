"""`tuneharness status` as a user meets it: works on a brand-new home with nothing running."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess

Cli = Callable[..., CompletedProcess[str]]


def test_status_on_a_brand_new_home(cli: Cli, th_env: dict[str, str]) -> None:
    """No jobs, no hosts, no interruptions; the table and the JSON both answer, exit 0, even with the
    sim server down."""
    env = {**th_env, "TUNEHARNESS_SIM_URL": "http://127.0.0.1:9"}  # nothing listens there
    out = cli("status", "--json", env=env)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["jobs"] == [] and data["hosts"] == []
    assert data["interruptions"] == {
        "window_days": 30,
        "count": 0,
        "resumed": 0,
        "recovery_median_s": None,
        "recovery_p90_s": None,
        "recoveries": [],
    }
    table = cli("status", env=env)
    assert table.returncode == 0 and "interruptions (30 days): 0" in table.stdout
