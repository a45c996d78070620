"""The control plane's side of the host's stack: the PYTHONPATH snippet, the bootstrap's line, the setting."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from app.errors import SettingsError
from app.hoststack import ACTIVATE_STACK, bootstrap_enabled, parse_bootstrap


def shell_pythonpath(home: Path, pythonpath: str | None) -> str:
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(["sh", "-c", ACTIVATE_STACK + 'echo "$PYTHONPATH"'], env=env, capture_output=True, text=True)
    return out.stdout.strip()


def test_the_active_stack_goes_first_on_pythonpath(tmp_path: Path) -> None:
    """With `~/.cache/tuneharness/active` naming a directory, it precedes what PYTHONPATH held."""
    (tmp_path / ".cache" / "tuneharness").mkdir(parents=True)
    (tmp_path / ".cache" / "tuneharness" / "active").write_text("/cache/stack-abc")
    assert shell_pythonpath(tmp_path, "/project") == "/cache/stack-abc:/project"
    assert shell_pythonpath(tmp_path, None) == "/cache/stack-abc"


def test_no_bootstrap_or_an_empty_active_file_leaves_pythonpath_alone(tmp_path: Path) -> None:
    """No active file, or an empty one (the image had the stack): PYTHONPATH is unchanged."""
    assert shell_pythonpath(tmp_path, "/project") == "/project"
    (tmp_path / ".cache" / "tuneharness").mkdir(parents=True)
    (tmp_path / ".cache" / "tuneharness" / "active").write_text("")
    assert shell_pythonpath(tmp_path, "/project") == "/project"


def test_the_bootstrap_line_is_read_and_a_silent_host_is_a_failure() -> None:
    """The JSON line gives the outcome; a host that printed none fails with what it said."""
    ok = parse_bootstrap('noise\n{"ok": true, "installed": ["peft"], "cached": false, "seconds": 12.5}\n', "", 0)
    assert (ok.ok, ok.installed, ok.seconds) == (True, ("peft",), 12.5)
    assert ok.summary() == "bootstrap installed 1 packages in 12.5s"
    bad = parse_bootstrap('{"ok": false, "missing": ["peft==0.21.2"], "error": null}', "", 1)
    assert not bad.ok and bad.error == "still missing: peft==0.21.2"
    silent = parse_bootstrap("", "python3: not found", 127)
    assert not silent.ok and "exit 127" in (silent.error or "") and "not found" in (silent.error or "")


def test_the_setting_defaults_on_and_refuses_a_bad_value_by_name() -> None:
    """TUNEHARNESS_BOOTSTRAP: unset is on, 0 is off, anything else names the variable and the fix."""
    assert bootstrap_enabled({}) and not bootstrap_enabled({"TUNEHARNESS_BOOTSTRAP": "0"})
    with pytest.raises(SettingsError, match=r"TUNEHARNESS_BOOTSTRAP.*Fix"):
        bootstrap_enabled({"TUNEHARNESS_BOOTSTRAP": "maybe"})
