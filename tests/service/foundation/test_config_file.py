"""TUNEHARNESS_HOME/config.toml with profiles, and the vendors' own key files, beside the environment:
the environment wins, then the profile over [default], then the key files; a malformed file is one
line naming the file and the fix."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.configfile import adopt, read_profile, vendor_key_files
from app.errors import SettingsError

ROOT = Path(__file__).resolve().parents[3]
CONFIG = """\
[default]
TUNEHARNESS_BROKER_URL = "redis://default-broker:6379/0"
TUNEHARNESS_FLOWER_PORT = 5601

[profiles.staging]
TUNEHARNESS_BROKER_URL = "redis://staging:6379/0"
"""


def _home(tmp_path: Path, text: str = CONFIG, mode: int = 0o600) -> dict[str, str]:
    home = tmp_path / "th"
    home.mkdir()
    (home / "config.toml").write_text(text)
    (home / "config.toml").chmod(mode)
    return {"TUNEHARNESS_HOME": str(home), "HOME": str(tmp_path / "user")}


def test_default_then_profile_then_the_environment_wins(tmp_path: Path) -> None:
    base = _home(tmp_path)
    env = dict(base)
    adopt(env)
    assert env["TUNEHARNESS_BROKER_URL"] == "redis://default-broker:6379/0" and env["TUNEHARNESS_FLOWER_PORT"] == "5601"
    env = {**base, "TUNEHARNESS_PROFILE": "staging"}
    adopt(env)
    assert env["TUNEHARNESS_BROKER_URL"] == "redis://staging:6379/0" and env["TUNEHARNESS_FLOWER_PORT"] == "5601"
    env = {**base, "TUNEHARNESS_BROKER_URL": "redis://mine:6379/0"}
    adopt(env)
    assert env["TUNEHARNESS_BROKER_URL"] == "redis://mine:6379/0"


def test_no_file_changes_nothing_unless_a_profile_is_asked_for(tmp_path: Path) -> None:
    env = {"TUNEHARNESS_HOME": str(tmp_path / "none"), "HOME": str(tmp_path)}
    assert adopt(env) is None and "TUNEHARNESS_BROKER_URL" not in env
    with pytest.raises(SettingsError, match="profile 'x' asked for"):
        read_profile({**env, "TUNEHARNESS_PROFILE": "x"})


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[default]\nNOT_A_SETTING = 1\n", "not a setting the file may hold"),
        ("[default]\nTUNEHARNESS_HOME = '/x'\n", "not a setting the file may hold"),
        ("[default]\nTUNEHARNESS_BROKER_URL = [1]\n", "not a string or a number"),
        ("[defualt]\nTUNEHARNESS_BROKER_URL = 'x'\n", "unknown table(s) defualt"),
        ("[default\n", "not valid TOML"),
    ],
)
def test_a_malformed_file_names_itself_and_the_fix(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(SettingsError) as info:
        read_profile(_home(tmp_path, text))
    assert words in str(info.value) and "config.toml" in str(info.value) and "Fix:" in str(info.value)


def test_an_unknown_profile_lists_the_ones_there(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"no \[profiles.prod\].*profiles: staging"):
        read_profile({**_home(tmp_path), "TUNEHARNESS_PROFILE": "prod"})


def test_a_secret_in_a_file_others_may_read_is_refused(tmp_path: Path) -> None:
    env = _home(tmp_path, '[default]\nVAST_API_KEY = "k-0123456789"\n', mode=0o644)
    with pytest.raises(SettingsError, match="chmod 600"):
        read_profile(env)
    (Path(env["TUNEHARNESS_HOME"]) / "config.toml").chmod(0o600)
    assert read_profile(env)[0] == {"VAST_API_KEY": "k-0123456789"}


def test_the_vendors_key_files_as_their_clis_write_them(tmp_path: Path) -> None:
    user = tmp_path / "user"
    (user / ".config" / "vastai").mkdir(parents=True)
    (user / ".config" / "vastai" / "vast_api_key").write_text("vast-from-cli\n")
    (user / ".vast_api_key").write_text("vast-legacy\n")
    (user / ".runpod").mkdir()
    (user / ".runpod" / "config.toml").write_text('[default]\napi_key = "rp-from-cli"\n')
    env = {"HOME": str(user), "TUNEHARNESS_HOME": str(tmp_path / "th")}
    assert vendor_key_files(env) == {"VAST_API_KEY": "vast-from-cli", "RUNPOD_API_KEY": "rp-from-cli"}
    (user / ".config" / "vastai" / "vast_api_key").unlink()
    assert vendor_key_files(env)["VAST_API_KEY"] == "vast-legacy"
    adopt(env := {**env, "RUNPOD_API_KEY": "rp-from-env"})
    assert env["VAST_API_KEY"] == "vast-legacy" and env["RUNPOD_API_KEY"] == "rp-from-env"


def test_the_cli_reads_the_profile_and_a_bad_file_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEHARNESS_", "VAST_", "RUNPOD_"))}
    env.update(_home(tmp_path, '[default]\nTUNEHARNESS_FLOWER_PORT = "nope"\n'), PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "doctor"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "TUNEHARNESS_FLOWER_PORT" in line and "Fix:" in line
