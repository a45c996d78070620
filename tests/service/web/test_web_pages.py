"""The web pages and the HTML report over a fleet the real services made (see fleet_seed): each
page's figures, escaping of untrusted text, read-only methods, Flower's auth rule, and a report that
references nothing outside itself."""

from __future__ import annotations

import base64
import itertools
import json
import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from app import bootstrap
from app.errors import UserError
from app.web import data
from app.web.report import build_report
from app.web.server import WebServer, refuse_open_web
from tests.service.web.fleet_seed import HOSTILE, JOB, Fleet, seed_fleet


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fleet:
    f = seed_fleet(tmp_path)
    monkeypatch.setattr(bootstrap, "engine", lambda s=None: f.h.engine)  # status_cmd.collect reads through it
    return f


@pytest.fixture
def site(fleet: Fleet) -> Iterator[WebServer]:
    with WebServer(port=0, source=fleet.source) as server:
        yield server


def _get(url: str, *, method: str = "GET", auth: tuple[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(url, method=method)
    if auth is not None:
        req.add_header("Authorization", "Basic " + base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode())
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def test_each_page_shows_its_figures(fleet: Fleet, site: WebServer) -> None:
    """Fleet: the job with its live phase, its current host's machine, the reaper's liveness, Flower's link;
    money: the spend plot with a layer per cause and the cap line; reliability: one interruption,
    resumed; the job page: the loss curve, the timeline's recovery and the gate's refusal."""
    status, headers, fleet_html = _get(site.url + "/")
    assert status == 200 and "script-src 'self'" in headers["Content-Security-Policy"]
    assert f'data-live="phase" data-job="{JOB}">training<' in fleet_html
    current = fleet.h.market.referee.host_of(fleet.current).machine_id
    assert f"<td>{current}</td>" in fleet_html
    assert re.search(r"<td>reaper</td><td>60s</td><td>\d+s</td><td><span class=\"ok\">ok</span>", fleet_html)
    assert '<td>idle-watchdog</td><td>60s</td><td>-</td><td><span class="bad">never ran</span>' in fleet_html
    assert 'href="http://127.0.0.1:5555"' in fleet_html

    _, _, money_html = _get(site.url + "/money")
    assert 'data-plot="spend"' in money_html and 'data-cap="job-1 (total)"' in money_html
    for cause in data.CAUSES:
        assert f'data-layer="{cause}"' in money_html
    assert 'data-plot="dead-lifetimes"' in money_html and "destroyed: no_compute" in money_html

    _, _, rel_html = _get(site.url + "/reliability")
    assert "<td>7 days</td><td>1</td><td>1</td>" in rel_html and 'data-plot="recoveries"' in rel_html
    assert rel_html.count("<circle") == 1

    fleet.cancel()
    status, _, job_html = _get(site.url + f"/jobs/{JOB}")
    assert status == 200 and 'data-plot="loss"' in job_html and "<polyline" in job_html
    assert "<td>recovery</td>" in job_html and '<span class="bad">refuse</span>' in job_html
    assert f'data-live="phase" data-job="{JOB}">cancelled<' in job_html

    status, headers, body = _get(site.url + "/api/live.json")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["jobs"][JOB]["phase"] == "cancelled"


def test_the_spend_series_ends_at_the_receipts_total(fleet: Fleet) -> None:
    """The stacked causes at the last point add up to the receipt's total, the dead-host layer to
    the receipt's dead-host cost, and no layer ever falls."""
    m = data.money(fleet.source())
    layers = m["series"]["layers"]
    assert math.isclose(sum(v[-1] for v in layers.values()), m["receipt"]["total_usd"], abs_tol=1e-6)
    assert math.isclose(layers["dead hosts"][-1], m["receipt"]["dead_host_cost_usd"], abs_tol=1e-6)
    assert m["receipt"]["dead_hosts"] == 1 and m["dead_lifetimes_s"] and layers["training"][-1] > 0
    for values in layers.values():
        assert all(b >= a - 1e-12 for a, b in itertools.pairwise(values))


def test_the_loss_curve_reads_the_trainers_own_line_format() -> None:
    """`step` lines written by the trainer's own formatter give (step, loss); other events, quoted
    values with spaces and traceback text are passed over."""
    from trainer.reporting import format_line

    text = "\n".join(
        [
            format_line("start", {"slice": 1, "max_steps": 20}),
            format_line("step", {"step": 1, "max_steps": 20, "loss": 2.5, "lr": 1e-4}),
            "Traceback (most recent call last): step=3 loss=9",
            format_line("step", {"step": 2, "note": "two words", "loss": 1.25}),
            format_line("failed", {"reason": "loss=nan step=3"}),
        ]
    )
    assert data.loss_points(text) == [(1.0, 2.5), (2.0, 1.25)]


def test_untrusted_text_is_escaped(fleet: Fleet, site: WebServer) -> None:
    """A cancel reason with markup (it lands in the job's detail) appears as text, never as markup."""
    fleet.cancel(reason=HOSTILE)
    for path in ("/", f"/jobs/{JOB}"):
        _, _, html = _get(site.url + path)
        assert "<script>alert" not in html and "<img src=x" not in html
    _, _, html = _get(site.url + f"/jobs/{JOB}")
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html


def test_the_site_is_read_only_and_answers_unknown_paths_with_404(site: WebServer) -> None:
    """Every method but GET and HEAD is 405 with Allow; an unknown job, page or static file is 404."""
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, headers, _ = _get(site.url + "/", method=method)
        assert (status, headers.get("Allow")) == (405, "GET, HEAD")
    assert _get(site.url + "/", method="HEAD")[0] == 200
    for path in ("/jobs/nope", "/nope", "/static/../data.py", "/static/%2e%2e%2fdata.py", "/static/x.py"):
        assert _get(site.url + path)[0] == 404, path
    status, headers, body = _get(site.url + "/static/live.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and "/api/live.json" in body


def test_flowers_auth_rule(fleet: Fleet) -> None:
    """No credentials: only a loopback address is served. With them, every request must carry them."""
    with pytest.raises(UserError, match="TUNEHARNESS_FLOWER_USER"):
        WebServer(host="0.0.0.0", port=0, source=fleet.source).start()
    refuse_open_web("127.0.0.1", user=None, password=None)
    refuse_open_web("0.0.0.0", user="ops", password="pw")
    with WebServer(port=0, source=fleet.source, user="ops", password="s3cret") as server:
        status, headers, _ = _get(server.url + "/")
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
        assert _get(server.url + "/", auth=("ops", "wrong"))[0] == 401
        assert _get(server.url + "/money", auth=("ops", "s3cret"))[0] == 200


def test_the_report_is_one_self_contained_file(fleet: Fleet) -> None:
    """Every section and plot in one file: the stylesheet inline, no script, and no src or href to
    another origin (Flower's address appears as text only)."""
    fleet.cancel()
    html = build_report(fleet.source())
    assert "<script" not in html and '<link rel="stylesheet"' not in html and "<style>" in html
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", html, flags=re.I)
    assert "@import" not in html and "url(" not in html
    for section in ('id="fleet"', 'id="money"', 'id="reliability"', f'id="job-{JOB}"'):
        assert section in html
    for plot in ("spend", "dead-lifetimes", "recoveries", "loss"):
        assert f'data-plot="{plot}"' in html
    assert f'href="#job-{JOB}"' in html and "Flower: http://127.0.0.1:5555" in html


def test_tuneharness_report_writes_the_file(fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`tuneharness report --html FILE` over the configured database and artifact store."""
    from typer.testing import CliRunner

    from app.cli.main import cli

    monkeypatch.setenv("TUNEHARNESS_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TUNEHARNESS_ARTIFACTS", str(fleet.h.store.root))
    monkeypatch.setenv("TUNEHARNESS_DB_URL", str(fleet.h.engine.url))
    bootstrap.settings.cache_clear()
    bootstrap.running_stack.cache_clear()
    try:
        fleet.cancel()
        out = tmp_path / "report.html"
        result = CliRunner().invoke(cli, ["report", "--html", str(out)])
        assert result.exit_code == 0, result.output
        html = out.read_text()
        assert f'id="job-{JOB}"' in html and 'data-plot="loss"' in html and "<polyline" in html
    finally:
        bootstrap.settings.cache_clear()
        bootstrap.running_stack.cache_clear()
