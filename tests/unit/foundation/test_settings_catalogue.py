"""docs/settings.md is generated from the catalogue, and the catalogue matches what the code reads."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from app import bootstrap, configfile, hoststack
from app.alerts import webhook_config_from_env
from app.errors import SettingsError
from app.policy.guardrails import IDLE_GRACE_S
from app.policy.supervision import SupervisorConfig
from app.settings import load_settings, seconds_setting, sim_scale
from app.settings_catalogue import INTERNAL, SETTINGS, main, render_markdown
from app.triage.llm import LlmConfig
from providers import runpod, vast
from providers.http import RetryPolicy
from providers.sim import images
from trainer.bootstrap import stack_cache, wheelhouse_dir
from trainer.guard import serving_refusal
from workers import guardrails as guardrail_tasks
from workers import research as research_tasks

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("app", "workers", "providers", "trainer", "gate")
NAME = re.compile(r"\b(?:TUNEHARNESS|VAST|RUNPOD)_[A-Z0-9_]*[A-Z0-9]\b")


def _names_in_code() -> set[str]:
    files = [p for d in PRODUCT for p in (ROOT / d).rglob("*.py")] + [ROOT / "beat_schedule.py"]
    return {
        name for p in files if p.name != "settings_catalogue.py" for name in NAME.findall(p.read_text(encoding="utf-8"))
    }


def test_docs_settings_md_is_the_rendered_catalogue() -> None:
    """The committed docs/settings.md is exactly what the catalogue renders."""
    assert (ROOT / "docs" / "settings.md").read_text(encoding="utf-8") == render_markdown()
    assert main(["--check"]) == 0


def test_every_variable_the_code_reads_is_in_the_catalogue() -> None:
    """A variable named in the product's code is documented, as a setting or as internal."""
    documented = {s.name for s in SETTINGS} | set(INTERNAL)
    missing = _names_in_code() - documented
    assert not missing, f"not in app/settings_catalogue.py: {sorted(missing)}"


def test_every_catalogued_variable_is_read_somewhere() -> None:
    """The catalogue lists nothing the code no longer reads."""
    stale = ({s.name for s in SETTINGS} | set(INTERNAL)) - _names_in_code()
    assert not stale, f"catalogued but never named in the code: {sorted(stale)}"


def test_catalogue_names_are_unique() -> None:
    """Each variable appears once."""
    names = [s.name for s in SETTINGS] + list(INTERNAL)
    assert len(names) == len(set(names))


def _plain(default: str) -> str:
    return default.strip("`")


def _defaults_from_code(tmp_path: Path) -> dict[str, Callable[[], object]]:
    home = tmp_path / "home"
    s = load_settings({"TUNEHARNESS_HOME": str(home)})
    llm = LlmConfig.from_env({"TUNEHARNESS_LLM_URL": "http://127.0.0.1:1/v1"})
    hook = webhook_config_from_env({"TUNEHARNESS_ALERT_WEBHOOK_URL": "https://hooks.example/x"})
    assert llm is not None and hook is not None
    retry = RetryPolicy.from_env({})
    sup = bootstrap.supervisor_config({})
    return {
        "TUNEHARNESS_HOME": lambda: load_settings({}).home == Path("~/.tuneharness").expanduser(),
        "TUNEHARNESS_PROFILE": lambda: configfile.DEFAULT_PROFILE,
        "TUNEHARNESS_DB_URL": lambda: s.db_url == f"sqlite:///{home / 'tuneharness.db'}",
        "TUNEHARNESS_BROKER_URL": lambda: s.broker_url,
        "TUNEHARNESS_RESULT_URL": lambda: s.result_url == s.broker_url,
        "TUNEHARNESS_FLOWER_ADDRESS": lambda: s.flower_address,
        "TUNEHARNESS_FLOWER_PORT": lambda: str(s.flower_port),
        "TUNEHARNESS_FLOWER_USER": lambda: s.flower_user is None,
        "TUNEHARNESS_FLOWER_PASSWORD": lambda: s.flower_password is None,
        "VAST_API_URL": lambda: vast.DEFAULT_URL,
        "RUNPOD_API_URL": lambda: runpod.DEFAULT_URL,
        "TUNEHARNESS_PROVIDER_RETRIES": lambda: f"{retry.attempts:g}",
        "TUNEHARNESS_PROVIDER_TIMEOUT_S": lambda: f"{retry.timeout_s:g}",
        "TUNEHARNESS_PROVIDER_BACKOFF_S": lambda: f"{retry.base_s:g}",
        "TUNEHARNESS_ARTIFACTS": lambda: bootstrap.artifacts_location(s, {}) == str(home / "artifacts"),
        "TUNEHARNESS_MONITOR_S": lambda: f"{sup.monitor_s:g}",
        "TUNEHARNESS_REPOLL_S": lambda: f"{sup.repoll_s:g}",
        "TUNEHARNESS_SLICE_S": lambda: f"{sup.slice_s:g}",
        "TUNEHARNESS_SLICE_STEPS": lambda: sup.slice_steps is None,
        "TUNEHARNESS_RESEARCH_TICK_S": lambda: f"{research_tasks.tick_s({}):g}",
        "TUNEHARNESS_HF_ENDPOINT": lambda: bootstrap.hf_endpoint({}),
        "TUNEHARNESS_IDLE_GRACE_S": lambda: f"{IDLE_GRACE_S:g}",
        "TUNEHARNESS_BUDGET_CHECKPOINT_WAIT_S": lambda: f"{guardrail_tasks.budget_checkpoint_wait_s():g}",
        "TUNEHARNESS_CREATE_LATENCY_S": lambda: f"{guardrail_tasks.LONGEST_CREATE_LATENCY_S:g}",
        "TUNEHARNESS_ALERT_WEBHOOK_URL": lambda: webhook_config_from_env({}) is None,
        "TUNEHARNESS_ALERT_FORMAT": lambda: hook.format,
        "TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID": lambda: hook.telegram_chat_id is None,
        "TUNEHARNESS_ALERT_TIMEOUT_S": lambda: f"{hook.timeout_s:g}",
        "TUNEHARNESS_LLM_URL": lambda: LlmConfig.from_env({}) is None,
        "TUNEHARNESS_LLM_KEY": lambda: llm.key is None,
        "TUNEHARNESS_LLM_MODEL": lambda: llm.model,
        "TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK": lambda: f"{llm.price_in_usd_per_mtok:g}",
        "TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK": lambda: f"{llm.price_out_usd_per_mtok:g}",
        "TUNEHARNESS_LLM_DAILY_CAP_USD": lambda: f"{llm.daily_cap_usd:.1f}",
        "TUNEHARNESS_LLM_TIMEOUT_S": lambda: f"{llm.timeout_s:g}",
        "TUNEHARNESS_ROLE": lambda: serving_refusal({}) is None or Path("/etc/tuneharness/serving").exists(),
        "TUNEHARNESS_SIM_SCALE": lambda: f"{sim_scale({}):g}",
        "TUNEHARNESS_SERVING_MARKER": lambda: serving_refusal({}) is None or Path("/etc/tuneharness/serving").exists(),
        "TUNEHARNESS_SIM_CACHE": lambda: images.sim_cache({}) == Path("~/.cache/tuneharness-sim").expanduser(),
        "TUNEHARNESS_BOOTSTRAP": lambda: hoststack.bootstrap_enabled({}),
        "TUNEHARNESS_STACK_CACHE": lambda: stack_cache({}) == Path("~/.cache/tuneharness").expanduser(),
        "TUNEHARNESS_WHEELHOUSE": lambda: wheelhouse_dir({}) is None,
    }


def _missing_key_refused(build: Callable[[], object], variable: str) -> bool:
    with pytest.raises(SettingsError) as err:
        build()
    return err.value.variable == variable


def test_each_catalogued_default_is_the_one_its_reader_applies(tmp_path: Path) -> None:
    """With the variable unset, the code behaves as the catalogue's default column says."""
    probes = _defaults_from_code(tmp_path)
    probes["VAST_API_KEY"] = lambda: _missing_key_refused(lambda: vast.VastMarket.from_env({}), "VAST_API_KEY")
    probes["RUNPOD_API_KEY"] = lambda: _missing_key_refused(lambda: runpod.RunPodMarket.from_env({}), "RUNPOD_API_KEY")
    for setting in SETTINGS:
        if setting.name in ("TUNEHARNESS_PROVIDERS", "TUNEHARNESS_SIM_URL", "TUNEHARNESS_SIM_TRACE"):
            continue  # read where a market is built; covered by the simulator's own tests
        assert setting.name in probes, f"no probe for {setting.name}"
        seen = probes[setting.name]()
        if isinstance(seen, bool):
            assert seen, f"{setting.name}: the code's default is not {setting.default!r}"
        else:
            assert seen == _plain(setting.default), f"{setting.name}: code {seen!r}, catalogue {setting.default!r}"


@pytest.mark.parametrize("raw", ["abc", "nan", "inf", "-5", "0"])
def test_a_duration_that_is_not_a_positive_finite_number_is_refused_by_name(raw: str) -> None:
    """A bad duration names its variable and the fix."""
    with pytest.raises(SettingsError, match=r"TUNEHARNESS_MONITOR_S.*Fix"):
        bootstrap.supervisor_config({"TUNEHARNESS_MONITOR_S": raw})
    with pytest.raises(SettingsError, match="TUNEHARNESS_IDLE_GRACE_S"):
        seconds_setting("TUNEHARNESS_IDLE_GRACE_S", 1800.0, {"TUNEHARNESS_IDLE_GRACE_S": raw})


def test_slice_steps_must_be_a_positive_whole_number() -> None:
    """TUNEHARNESS_SLICE_STEPS=0 or 1.5 is refused; 12 caps slices at 12 steps."""
    for raw in ("0", "1.5", "-3"):
        with pytest.raises(SettingsError, match="TUNEHARNESS_SLICE_STEPS"):
            bootstrap.supervisor_config({"TUNEHARNESS_SLICE_STEPS": raw})
    assert bootstrap.supervisor_config({"TUNEHARNESS_SLICE_STEPS": "12"}).slice_steps == 12
    assert SupervisorConfig().slice_steps is None
