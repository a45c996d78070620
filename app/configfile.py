"""`TUNEHARNESS_HOME/config.toml`, with profiles, and the vendors' own key files, beside the environment.

Every setting (docs/settings.md) may also be written in the config file:

    # TUNEHARNESS_HOME/config.toml (mode 600 when it holds a key)
    [default]
    TUNEHARNESS_DB_URL = "postgresql://tuneharness@db.internal:5432/tuneharness"
    VAST_API_KEY = "..."

    [profiles.staging]                   # TUNEHARNESS_PROFILE=staging: [default], then these
    TUNEHARNESS_BROKER_URL = "redis://staging:6379/0"

What decides a setting, first to last: the process's environment; the selected profile
(TUNEHARNESS_PROFILE, over [default]); for the vendor keys, the vendors' own key files as their
CLIs write them (Vast: `$XDG_CONFIG_HOME/vastai/vast_api_key`, else `~/.config/vastai/vast_api_key`,
else `~/.vast_api_key`; RunPod: `~/.runpod/config.toml`'s `[default] api_key`); then the default.
`adopt` fills the environment of this process (and so of the workers and beat it starts) once,
at start: the code that reads a setting reads it from one place.
"""

from __future__ import annotations

import stat
import tomllib
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from app.errors import SettingsError

__all__ = ["CONFIG_NAME", "DEFAULT_PROFILE", "PROFILE_VAR", "adopt", "read_profile", "vendor_key_files"]

CONFIG_NAME = "config.toml"
PROFILE_VAR = "TUNEHARNESS_PROFILE"
DEFAULT_PROFILE = "default"  # the table every profile starts from, and the one used when none is named
MAX_CONFIG_BYTES = 1 << 20


def _home(env: Mapping[str, str]) -> Path:
    return Path(env.get("TUNEHARNESS_HOME") or Path.home() / ".tuneharness").expanduser()


def _known() -> tuple[frozenset[str], frozenset[str]]:
    from app.settings_catalogue import SETTINGS, secret_names

    return frozenset(s.name for s in SETTINGS), secret_names()


def _values(table: object, where: str, path: Path, known: frozenset[str]) -> dict[str, str]:
    if not isinstance(table, dict):
        raise SettingsError(str(path), f"{where} is not a table", f"write [{where}] with NAME = value lines")
    out: dict[str, str] = {}
    for name, value in table.items():
        if name not in known or name in ("TUNEHARNESS_HOME", PROFILE_VAR):
            raise SettingsError(
                str(path),
                f"[{where}] sets {name!r}, which is not a setting the file may hold",
                "use the names in docs/settings.md (TUNEHARNESS_HOME and TUNEHARNESS_PROFILE: environment only)",
            )
        if isinstance(value, bool):
            out[name] = "1" if value else "0"
        elif isinstance(value, str | int | float):
            out[name] = str(value)
        else:
            raise SettingsError(str(path), f"[{where}] {name} is not a string or a number", 'quote it: NAME = "value"')
    return out


def read_profile(env: Mapping[str, str]) -> tuple[dict[str, str], Path | None]:
    """The selected profile's settings from TUNEHARNESS_HOME/config.toml ({} without a file), and
    the file's path. SettingsError names the file and the fix for anything malformed."""
    path = _home(env) / CONFIG_NAME
    profile = env.get(PROFILE_VAR) or DEFAULT_PROFILE
    if not path.is_file():
        if profile != "default":
            raise SettingsError(
                PROFILE_VAR, f"profile {profile!r} asked for, but {path} does not exist", f"write {path}"
            )
        return {}, None
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise SettingsError(str(path), "over 1 MiB", "keep settings only in it")
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(str(path), f"not valid TOML ({exc})", "fix the line it names") from None
    known, secrets = _known()
    unknown_tables = sorted(set(doc) - {"default", "profiles"})
    if unknown_tables:
        raise SettingsError(
            str(path), f"unknown table(s) {', '.join(unknown_tables)}", "use [default] and [profiles.NAME]"
        )
    values = _values(doc.get("default", {}), "default", path, known)
    profiles = doc.get("profiles", {})
    if not isinstance(profiles, dict):
        raise SettingsError(str(path), "profiles is not a table", "write [profiles.NAME] tables")
    if profile != "default":
        if profile not in profiles:
            named = ", ".join(sorted(profiles)) or "none"
            raise SettingsError(
                PROFILE_VAR, f"no [profiles.{profile}] in {path} (profiles: {named})", "name one of them, or unset it"
            )
        values.update(_values(profiles[profile], f"profiles.{profile}", path, known))
    if any(name in secrets for name in values) and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SettingsError(
            str(path),
            "holds a secret and other users may read it",
            f"chmod 600 {path}",
        )
    return values, path


def _first_line(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text.splitlines()[0].strip() if text else None


def vendor_key_files(env: Mapping[str, str]) -> dict[str, str]:
    """The vendor keys their own CLIs saved: {"VAST_API_KEY": ..., "RUNPOD_API_KEY": ...} where found."""
    home = Path(env.get("HOME") or Path.home())
    out: dict[str, str] = {}
    xdg = Path(env["XDG_CONFIG_HOME"]) if env.get("XDG_CONFIG_HOME") else home / ".config"
    for candidate in (xdg / "vastai" / "vast_api_key", home / ".vast_api_key"):
        key = _first_line(candidate) if candidate.is_file() else None
        if key:
            out["VAST_API_KEY"] = key
            break
    runpod = home / ".runpod" / "config.toml"
    if runpod.is_file():
        try:
            doc = tomllib.loads(runpod.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, OSError):
            doc = {}
        section = doc.get("default")
        key = section.get("api_key") if isinstance(section, dict) else None
        if isinstance(key, str) and key.strip():
            out["RUNPOD_API_KEY"] = key.strip()
    return out


def adopt(env: MutableMapping[str, str]) -> Path | None:
    """Fill what `env` leaves unset (or empty) from the config file's profile, then the vendor key
    files; return the config file's path (None: none). SettingsError on a malformed file."""
    values, path = read_profile(env)
    for name, value in values.items():
        if not env.get(name):
            env[name] = value
    for name, value in vendor_key_files(env).items():
        if not env.get(name):
            env[name] = value
    return path
