"""The web pages in a real headless browser (Debian's chromium driven by chromedriver through
selenium), over a fleet the real services made: every page renders with its plots and no console
error, and a job's phase changed by a real cancel appears without a reload. Screenshots are saved
for a person to look at (the test prints where; TUNEHARNESS_SCREENSHOT_DIR picks the directory)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app import bootstrap
from app.web.server import WebServer
from tests.service.web.fleet_seed import JOB, Fleet, seed_fleet
from tests.support.services import wait_until

pytestmark = pytest.mark.slow

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _driver() -> Any:
    if CHROMIUM is None or CHROMEDRIVER is None:
        msg = "chromium and chromedriver are not installed (Debian: apt-get install chromium chromium-driver)"
        if IN_CI:
            pytest.fail(msg + "; CI must run the browser test (scripts/ensure-system-deps.sh installs them)")
        pytest.skip(msg)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if IN_CI:
            pytest.fail("selenium is not installed: pip install -e '.[dev]'")
        pytest.skip("selenium is not installed: pip install -e '.[dev]'")
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1400",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _driver()
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("TUNEHARNESS_SCREENSHOT_DIR") or tmp_path / "screenshots")
    d.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots of the web pages: {d}")
    return d


def _errors(driver: Any) -> list[str]:
    """Console messages at SEVERE since the last call (failed loads, CSP violations, script errors)."""
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def _live_phase(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, f'[data-live="phase"][data-job="{JOB}"]').text)


def test_every_page_renders_with_plots_and_a_phase_change_appears_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, browser: Any, shots: Path
) -> None:
    """Given a fleet with a training job that recovered once, the fleet page shows it training; when
    the operator cancels it, the page says cancelled without a reload; the money, reliability and
    job pages each draw their plots; no page logs a console error."""
    from selenium.webdriver.common.by import By

    fleet: Fleet = seed_fleet(tmp_path / "fleet")
    monkeypatch.setattr(bootstrap, "engine", lambda s=None: fleet.h.engine)
    with WebServer(port=0, source=fleet.source) as site:
        browser.get(site.url + "/")
        assert _live_phase(browser) == "training"
        assert browser.find_elements(By.CSS_SELECTOR, "table.hosts tbody tr td")
        browser.execute_script("window.__loadedOnce = true;")
        browser.save_screenshot(str(shots / "fleet-training.png"))

        fleet.cancel()
        assert wait_until(lambda: _live_phase(browser) == "cancelled", timeout_s=30), _live_phase(browser)
        assert browser.execute_script("return window.__loadedOnce === true;"), "the page was reloaded"
        browser.save_screenshot(str(shots / "fleet-cancelled.png"))
        assert _errors(browser) == []

        for path, name, plots, drawn in (
            ("/money", "money", ["spend", "dead-lifetimes"], 'svg[data-plot="spend"] polygon[data-layer="training"]'),
            ("/reliability", "reliability", ["recoveries"], 'svg[data-plot="recoveries"] circle'),
            (f"/jobs/{JOB}", "job", ["loss"], 'svg[data-plot="loss"] polyline'),
        ):
            browser.get(site.url + path)
            found = [
                el.get_attribute("data-plot")
                for el in browser.find_elements(By.CSS_SELECTOR, "svg.plot")
                if el.size["width"] > 0 and el.size["height"] > 0
            ]
            assert found == plots, (path, found)
            assert browser.find_elements(By.CSS_SELECTOR, drawn), path
            browser.save_screenshot(str(shots / f"{name}.png"))
            assert _errors(browser) == [], path
        # the job page polls too: a second poll answers without an error
        first = browser.execute_script("return document.body.dataset.liveAt || null;")
        assert wait_until(
            lambda: browser.execute_script("return document.body.dataset.liveAt || null;") not in (None, first),
            timeout_s=30,
        )
        assert _errors(browser) == []
    assert sorted(p.name for p in shots.glob("*.png")) == sorted(
        ["fleet-training.png", "fleet-cancelled.png", "money.png", "reliability.png", "job.png"]
    )
