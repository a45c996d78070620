"""Every environment variable tuneharness reads, in one table: the source of `docs/settings.md`.

    python -m app.settings_catalogue            # print the markdown
    python -m app.settings_catalogue --write    # rewrite docs/settings.md
    python -m app.settings_catalogue --check    # exit 1 when docs/settings.md differs

The readers stay where the setting is used (`app/settings.py`, `providers/http.py`,
`app/alerts.py`, ...); `tests/unit/foundation/test_settings_catalogue.py` checks that every variable the
code reads is listed here and that each listed default is the one its reader applies, so this
table cannot drift from the code.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["INTERNAL", "SECTIONS", "SETTINGS", "Setting", "render_markdown", "secret_names"]


@dataclass(frozen=True, slots=True)
class Setting:
    """One variable a user may set."""

    name: str
    default: str  # as the reader applies it when the variable is unset or empty
    meaning: str
    section: str
    secret: bool = False  # never printed, logged, or passed to a host


SECTIONS = (
    "Control plane",
    "Marketplaces",
    "Supervisor and guardrails",
    "Alerts",
    "Triage escalation (LLM)",
    "Simulated marketplace",
    "On the rented host (trainer)",
)

SETTINGS: tuple[Setting, ...] = (
    Setting(
        "TUNEHARNESS_HOME",
        "`~/.tuneharness`",
        "state directory: the SQLite database, pulled artifacts, job SSH keys, local stack logs",
        "Control plane",
    ),
    Setting(
        "TUNEHARNESS_PROFILE",
        "`default`",
        "which `[profiles.NAME]` of `$TUNEHARNESS_HOME/config.toml` applies over its `[default]`; any setting "
        "here may be written there (the environment wins; app/configfile.py)",
        "Control plane",
    ),
    Setting(
        "TUNEHARNESS_DB_URL",
        "`sqlite:///$TUNEHARNESS_HOME/tuneharness.db`",
        "ledger, budgets, jobs and rentals; `postgresql://USER@HOST:5432/DB` for a fleet on several machines",
        "Control plane",
    ),
    Setting("TUNEHARNESS_BROKER_URL", "`redis://127.0.0.1:6379/0`", "Celery broker (Redis only)", "Control plane"),
    Setting("TUNEHARNESS_RESULT_URL", "the broker URL", "Celery result backend (Redis)", "Control plane"),
    Setting(
        "TUNEHARNESS_FLOWER_ADDRESS",
        "`127.0.0.1`",
        "Flower binds here; change it only behind a tunnel or an authenticating proxy",
        "Control plane",
    ),
    Setting("TUNEHARNESS_FLOWER_PORT", "`5555`", "Flower's port", "Control plane"),
    Setting(
        "TUNEHARNESS_FLOWER_USER",
        "unset",
        "Flower basic auth user; set with the password or not at all",
        "Control plane",
    ),
    Setting(
        "TUNEHARNESS_FLOWER_PASSWORD",
        "unset",
        "Flower basic auth password (passed by environment, never on a command line)",
        "Control plane",
        secret=True,
    ),
    Setting(
        "VAST_API_KEY", "unset", "Vast.ai API key (console.vast.ai, Account > API Keys)", "Marketplaces", secret=True
    ),
    Setting(
        "VAST_API_URL", "`https://console.vast.ai`", "Vast.ai API base URL (a fake's URL in tests)", "Marketplaces"
    ),
    Setting("RUNPOD_API_KEY", "unset", "RunPod API key (runpod.io, Settings > API Keys)", "Marketplaces", secret=True),
    Setting(
        "RUNPOD_API_URL",
        "`https://api.runpod.io/v2`",
        "RunPod REST API v2 base URL (a fake's URL in tests); the retired GraphQL URL is refused",
        "Marketplaces",
    ),
    Setting(
        "TUNEHARNESS_PROVIDERS",
        "unset",
        "comma-separated providers the reconciler lists even when no rental is recorded there "
        "(finds labelled instances a lost database forgot)",
        "Marketplaces",
    ),
    Setting(
        "TUNEHARNESS_PROVIDER_RETRIES",
        "`5`",
        "tries per vendor call on 429/5xx and timeouts (a create is never retried after the "
        "vendor may have accepted it)",
        "Marketplaces",
    ),
    Setting("TUNEHARNESS_PROVIDER_TIMEOUT_S", "`30`", "seconds per vendor HTTP request", "Marketplaces"),
    Setting(
        "TUNEHARNESS_PROVIDER_BACKOFF_S",
        "`0.5`",
        "base of the jittered exponential backoff between tries (`0` in tests)",
        "Marketplaces",
    ),
    Setting(
        "TUNEHARNESS_ARTIFACTS",
        "`$TUNEHARNESS_HOME/artifacts`",
        "where checkpoints and adapters are pulled: a directory or `s3://BUCKET/PREFIX`; with PostgreSQL, "
        "one store every worker shares (checked at worker start and by `doctor`)",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_MONITOR_S",
        "`30`",
        "supervisor poll period of a training job (seconds)",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_REPOLL_S", "`10`", "look again this soon after a failed SSH poll", "Supervisor and guardrails"
    ),
    Setting(
        "TUNEHARNESS_SLICE_S",
        "`1800`",
        "wall-clock cap of one training slice (the trainer's `--max-seconds`)",
        "Supervisor and guardrails",
    ),
    Setting("TUNEHARNESS_SLICE_STEPS", "unset", "also cap each slice at this many steps", "Supervisor and guardrails"),
    Setting(
        "TUNEHARNESS_RESEARCH_TICK_S",
        "`10`",
        "wall seconds between looks at a research run's experiments (docs/research.md)",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_HF_ENDPOINT",
        "`https://huggingface.co`",
        "the Hugging Face Hub a host fetches a job's public model from (`base_model: {hf, revision}`); no token",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_IDLE_GRACE_S",
        "`1800`",
        "the idle watchdog stops a host whose GPU stayed below 5% this long",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_BUDGET_CHECKPOINT_WAIT_S",
        "`900`",
        "at a budget cap, the stop of a host holding work waits for its newest checkpoint at most this "
        "long, then stops the host anyway",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_CREATE_LATENCY_S",
        "`120`",
        "longest create latency allowed a vendor; the reconciler waits twice this before it "
        "stops an unknown labelled instance",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_ALERT_WEBHOOK_URL",
        "unset",
        "incoming-webhook URL for alerts (Slack, Discord, Telegram or plain JSON); it holds a "
        "token, so only its host is ever logged",
        "Alerts",
        secret=True,
    ),
    Setting("TUNEHARNESS_ALERT_FORMAT", "`slack`", "`slack`, `discord`, `telegram` or `json`", "Alerts"),
    Setting("TUNEHARNESS_ALERT_TELEGRAM_CHAT_ID", "unset", "the chat id, needed by the telegram format", "Alerts"),
    Setting("TUNEHARNESS_ALERT_TIMEOUT_S", "`3`", "seconds per webhook delivery (0.1 to 30)", "Alerts"),
    Setting(
        "TUNEHARNESS_LLM_URL",
        "unset",
        "OpenAI-compatible base URL; unset means no escalation (the best guess is marked `needs_operator`)",
        "Triage escalation (LLM)",
    ),
    Setting("TUNEHARNESS_LLM_KEY", "unset", "bearer token for that endpoint", "Triage escalation (LLM)", secret=True),
    Setting("TUNEHARNESS_LLM_MODEL", "`gpt-4o-mini`", "model name sent in the request", "Triage escalation (LLM)"),
    Setting(
        "TUNEHARNESS_LLM_PRICE_IN_USD_PER_MTOK", "`0.15`", "price of a million prompt tokens", "Triage escalation (LLM)"
    ),
    Setting(
        "TUNEHARNESS_LLM_PRICE_OUT_USD_PER_MTOK",
        "`0.6`",
        "price of a million completion tokens",
        "Triage escalation (LLM)",
    ),
    Setting(
        "TUNEHARNESS_LLM_DAILY_CAP_USD",
        "`1.0`",
        "spend cap per UTC day for all processes together, counted in the ledger",
        "Triage escalation (LLM)",
    ),
    Setting("TUNEHARNESS_LLM_TIMEOUT_S", "`20`", "seconds per request", "Triage escalation (LLM)"),
    Setting(
        "TUNEHARNESS_SIM_URL",
        "unset",
        "a shared simulated marketplace (`tuneharness sim serve` prints the URL); its scaled "
        "clock then drives provisioning",
        "Simulated marketplace",
    ),
    Setting(
        "TUNEHARNESS_SIM_SCALE",
        "`1`",
        "the shared simulated marketplace's scale (`sim serve --scale`): beat's periods then pass in "
        "its simulated seconds",
        "Simulated marketplace",
    ),
    Setting(
        "TUNEHARNESS_SIM_TRACE",
        "the shipped `smoke` trace",
        "trace of the in-process simulated marketplace when no `TUNEHARNESS_SIM_URL` is set",
        "Simulated marketplace",
    ),
    Setting(
        "TUNEHARNESS_SIM_CACHE",
        "`~/.cache/tuneharness-sim`",
        "where the simulator builds, once, the bare image's Python and the wheelhouse of the trainer's stack",
        "Simulated marketplace",
    ),
    Setting(
        "TUNEHARNESS_BOOTSTRAP",
        "`1`",
        "`1` runs `python -m trainer bootstrap` on each new host before its preflight (installs what the "
        "image lacks of the trainer's stack); `0` skips it (an image that holds the stack)",
        "Supervisor and guardrails",
    ),
    Setting(
        "TUNEHARNESS_ROLE",
        "unset",
        "`serving` marks a serving box: the trainer refuses to run",
        "On the rented host (trainer)",
    ),
    Setting(
        "TUNEHARNESS_SERVING_MARKER",
        "unset",
        "one more marker-file path that marks a serving box (beside `/etc/tuneharness/serving`)",
        "On the rented host (trainer)",
    ),
    Setting(
        "TUNEHARNESS_STACK_CACHE",
        "`~/.cache/tuneharness`",
        "where the bootstrap keeps the stack it installed (`stack-<key>`) and the `active` pointer",
        "On the rented host (trainer)",
    ),
    Setting(
        "TUNEHARNESS_WHEELHOUSE",
        "unset (the package index)",
        "a directory of wheels the bootstrap installs from alone (`pip --no-index --find-links`)",
        "On the rented host (trainer)",
    ),
)

# Set by tuneharness itself, not by users; listed so that maintainers know what each one is.
INTERNAL: dict[str, str] = {
    "TUNEHARNESS_KILL_AT": "the rental's kill-time (epoch seconds), in every instance's environment",
    "TUNEHARNESS_ONSTART": "RunPod: the on-start script, passed as a pod environment variable",
    "TUNEHARNESS_SIM_TRUTH": "on a simulated host: the path of that host's truth file",
    "TUNEHARNESS_SIM_SANDBOX": "on a simulated host: its sandbox directory",
    "TUNEHARNESS_SEED": "a `command` job's run seed, in its command's environment (docs/byo-training.md)",
    "TUNEHARNESS_HOOK_FILE": "a `command` job: the Trainer callback the wrapper injects through `sitecustomize`",
    "TUNEHARNESS_JOB_DIR": "a `command` job: the job directory the injected callback reports into",
    "TUNEHARNESS_KEEP_CHECKPOINTS": "a `command` job: how many verified checkpoints the callback keeps",
    "TUNEHARNESS_DEADLINE_WALL": "a `command` job: the slice's wall-clock cap (epoch seconds) for the callback",
    "TUNEHARNESS_HOOK_SLICE_STEPS": "a `command` job: the slice's step cap for the callback",
    "TUNEHARNESS_RESUME_FROM": "a `command` job: the newest complete checkpoint the Trainer resumes from",
    "TUNEHARNESS_ADAPTER_META": "a `command` job: what the callback writes into the adapter's trainer_meta.json",
}


def secret_names() -> frozenset[str]:
    """The variables that must never reach a process whose code we did not write."""
    return frozenset(s.name for s in SETTINGS if s.secret)


def render_markdown() -> str:
    """docs/settings.md, as the catalogue says it."""
    out = [
        "# Settings",
        "",
        "<!-- Generated by `python -m app.settings_catalogue --write` from app/settings_catalogue.py;",
        "     do not edit by hand (a test compares this file with the catalogue). -->",
        "",
        "Every setting is an environment variable, read and validated when the process starts: a bad",
        "value stops it with one line that names the variable and the fix (exit 2). Secrets (marked",
        "below) stay on the control machine: they are never logged, put in task arguments, or passed",
        "to a rented host. `docker compose` reads them from `.env` (docs/deploy.md).",
        "",
        "Any of them may also be written in `$TUNEHARNESS_HOME/config.toml`: a `[default]` table of",
        '`NAME = "value"` lines and `[profiles.NAME]` tables over it, chosen by `TUNEHARNESS_PROFILE`',
        "(mode 600 when it holds a key, or it is refused). The environment wins over the file. Without",
        "`VAST_API_KEY` or `RUNPOD_API_KEY` anywhere, the key the vendor's own CLI saved is used:",
        "`~/.config/vastai/vast_api_key` (or `$XDG_CONFIG_HOME/vastai/`, or `~/.vast_api_key`) and",
        "`~/.runpod/config.toml`'s `[default] api_key`.",
    ]
    for section in SECTIONS:
        rows = [s for s in SETTINGS if s.section == section]
        out += ["", f"## {section}", "", "| variable | default | meaning |", "|---|---|---|"]
        out += [f"| `{s.name}`{' (secret)' if s.secret else ''} | {s.default} | {s.meaning} |" for s in rows]
    out += [
        "",
        "## Set by tuneharness itself",
        "",
        "Not for users; listed so that a maintainer reading a host's environment knows each one.",
        "",
        "| variable | what |",
        "|---|---|",
    ]
    out += [f"| `{name}` | {what} |" for name, what in INTERNAL.items()]
    return "\n".join(out) + "\n"


def _doc_path() -> Path:
    return Path(__file__).resolve().parents[1] / "docs" / "settings.md"


def main(argv: list[str]) -> int:
    text = render_markdown()
    if argv == ["--write"]:
        _doc_path().write_text(text, encoding="utf-8")
        return 0
    if argv == ["--check"]:
        current = _doc_path().read_text(encoding="utf-8") if _doc_path().exists() else ""
        if current != text:
            print("docs/settings.md differs from the catalogue. Fix: python -m app.settings_catalogue --write")
            return 1
        return 0
    if argv:
        print("usage: python -m app.settings_catalogue [--write | --check]", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
