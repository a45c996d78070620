"""The trainer's stack on a rented host, as the control plane handles it: the bootstrap run before
the preflight, and the shell snippet that puts the installed stack on a trainer's PYTHONPATH.

The host side is `trainer/bootstrap.py` (docs/trainer.md, "The stack on the host"); the control
plane never imports it: it pushes the file with the lock beside it and reads its one JSON line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import SettingsError

__all__ = [
    "ACTIVATE_STACK",
    "BOOTSTRAP_ENV",
    "BOOTSTRAP_LOCK",
    "BOOTSTRAP_SCRIPT",
    "BootstrapOutcome",
    "bootstrap_command",
    "bootstrap_enabled",
    "parse_bootstrap",
]

BOOTSTRAP_ENV = "TUNEHARNESS_BOOTSTRAP"
TRAINER_DIR = Path(__file__).resolve().parents[1] / "trainer"
BOOTSTRAP_SCRIPT = TRAINER_DIR / "bootstrap.py"
BOOTSTRAP_LOCK = TRAINER_DIR / "requirements.txt"
# Where the pushed copies go on the host (the SSH session's working directory).
REMOTE_SCRIPT = "tuneharness_bootstrap.py"
REMOTE_LOCK = "tuneharness_requirements.txt"

# Shell, run before a trainer command on the host: the stack directory the last bootstrap chose
# (`<cache>/active`, empty when the image had everything) goes first on PYTHONPATH. Ends in `; `.
ACTIVATE_STACK = (
    'TH_STACK=$(cat "${TUNEHARNESS_STACK_CACHE:-$HOME/.cache/tuneharness}/active" 2>/dev/null); '
    'if [ -n "$TH_STACK" ]; then export PYTHONPATH="$TH_STACK${PYTHONPATH:+:$PYTHONPATH}"; fi; '
)


def bootstrap_enabled(env: Mapping[str, str] | None = None) -> bool:
    """TUNEHARNESS_BOOTSTRAP: `1` (default) runs the bootstrap before every preflight, `0` skips it
    (hosts whose image already holds the stack, e.g. the trainer image)."""
    env = os.environ if env is None else env
    raw = (env.get(BOOTSTRAP_ENV) or "1").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise SettingsError(BOOTSTRAP_ENV, f"{raw!r} is not 1 or 0", "set it to 1 (default) or 0")


def bootstrap_command(*, timeout_s: float) -> str:
    """The command that runs the pushed bootstrap with the host's Python."""
    return (
        "PY=$(command -v python3 || command -v python); "
        f'"$PY" {REMOTE_SCRIPT} --lock {REMOTE_LOCK} --timeout-s {max(1.0, timeout_s):.0f}'
    )


@dataclass(frozen=True, slots=True)
class BootstrapOutcome:
    ok: bool
    seconds: float
    installed: tuple[str, ...] = ()
    cached: bool = False
    error: str | None = None

    def summary(self) -> str:
        if not self.ok:
            return f"bootstrap failed: {self.error}"
        if self.installed:
            return f"bootstrap installed {len(self.installed)} packages in {self.seconds:.1f}s"
        return "bootstrap: stack cached" if self.cached else "bootstrap: the image has the stack"


def parse_bootstrap(stdout: str, stderr: str, exit_code: int) -> BootstrapOutcome:
    """The bootstrap's JSON line, or a failure naming what the host said instead."""
    data: Any = None
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                data = json.loads(line)
            except ValueError:
                continue
            break
    if not isinstance(data, dict):
        return BootstrapOutcome(False, 0.0, error=f"no report (exit {exit_code}): {stderr.strip()[-300:]}")
    error = data.get("error") or (
        f"still missing: {', '.join(data.get('missing') or [])}" if not data.get("ok") else None
    )
    return BootstrapOutcome(
        ok=bool(data.get("ok")),
        seconds=float(data.get("seconds") or 0.0),
        installed=tuple(str(x) for x in data.get("installed") or ()),
        cached=bool(data.get("cached")),
        error=None if data.get("ok") else str(error),
    )
