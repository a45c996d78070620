"""Settings, read from the environment and validated once at start-up.

Every error names the variable and the fix. Nothing here connects to anything.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from app.errors import SettingsError

__all__ = ["Settings", "load_settings", "seconds_setting", "sim_scale"]

_DB_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg", "postgres")
_BROKER_SCHEMES = ("redis", "rediss")


@dataclass(frozen=True, slots=True)
class Settings:
    """The validated configuration of one process."""

    home: Path
    db_url: str
    broker_url: str
    result_url: str
    flower_address: str = "127.0.0.1"
    flower_port: int = 5555
    flower_user: str | None = None
    flower_password: str | None = None

    @property
    def is_postgres(self) -> bool:
        return self.db_url.startswith("postgresql")


def _normalise_db_url(url: str) -> str:
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    return url


def _check_port(name: str, raw: str) -> int:
    try:
        port = int(raw)
    except ValueError:
        raise SettingsError(name, f"{raw!r} is not a port number", "set a number from 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise SettingsError(name, f"{port} is out of range", "set a number from 1 to 65535")
    return port


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate TUNEHARNESS_* variables; raise SettingsError naming the first bad one."""
    env = os.environ if env is None else env

    raw_home = env.get("TUNEHARNESS_HOME") or str(Path.home() / ".tuneharness")
    home = Path(raw_home).expanduser()
    if home.exists() and not home.is_dir():
        raise SettingsError("TUNEHARNESS_HOME", f"{home} exists and is not a directory", "point it at a directory")

    db_url = _normalise_db_url(env.get("TUNEHARNESS_DB_URL") or f"sqlite:///{home / 'tuneharness.db'}")
    scheme = db_url.split("://", 1)[0] if "://" in db_url else ""
    if scheme not in _DB_SCHEMES:
        raise SettingsError(
            "TUNEHARNESS_DB_URL",
            f"unsupported database URL {db_url!r}",
            "use sqlite:///PATH or postgresql://USER@HOST:PORT/DB",
        )
    if scheme == "sqlite" and not db_url.startswith("sqlite:///"):
        raise SettingsError("TUNEHARNESS_DB_URL", f"{db_url!r} has no file path", "use sqlite:////absolute/path.db")

    broker_url = env.get("TUNEHARNESS_BROKER_URL") or "redis://127.0.0.1:6379/0"
    parts = urlsplit(broker_url)
    if parts.scheme not in _BROKER_SCHEMES or not parts.hostname:
        raise SettingsError(
            "TUNEHARNESS_BROKER_URL",
            f"unsupported broker URL {broker_url!r}",
            "use redis://HOST:PORT/DB (Celery on Redis is the only supported broker)",
        )
    try:
        _ = parts.port
    except ValueError:
        raise SettingsError(
            "TUNEHARNESS_BROKER_URL", f"bad port in {broker_url!r}", "use redis://HOST:PORT/DB"
        ) from None

    result_url = env.get("TUNEHARNESS_RESULT_URL") or broker_url
    rparts = urlsplit(result_url)
    if rparts.scheme not in _BROKER_SCHEMES or not rparts.hostname:
        raise SettingsError(
            "TUNEHARNESS_RESULT_URL",
            f"unsupported result backend URL {result_url!r}",
            "use redis://HOST:PORT/DB, or leave it unset to use the broker",
        )

    flower_address = env.get("TUNEHARNESS_FLOWER_ADDRESS") or "127.0.0.1"
    flower_port = _check_port("TUNEHARNESS_FLOWER_PORT", env.get("TUNEHARNESS_FLOWER_PORT") or "5555")
    flower_user = env.get("TUNEHARNESS_FLOWER_USER") or None
    flower_password = env.get("TUNEHARNESS_FLOWER_PASSWORD") or None
    if (flower_user is None) != (flower_password is None):
        raise SettingsError(
            "TUNEHARNESS_FLOWER_PASSWORD" if flower_user else "TUNEHARNESS_FLOWER_USER",
            "Flower basic auth needs both a user and a password",
            "set TUNEHARNESS_FLOWER_USER and TUNEHARNESS_FLOWER_PASSWORD together",
        )
    if flower_user and ":" in flower_user:
        raise SettingsError("TUNEHARNESS_FLOWER_USER", "contains ':'", "choose a user name without ':'")

    return Settings(
        home=home,
        db_url=db_url,
        broker_url=broker_url,
        result_url=result_url,
        flower_address=flower_address,
        flower_port=flower_port,
        flower_user=flower_user,
        flower_password=flower_password,
    )


def seconds_setting(name: str, default: float, env: Mapping[str, str] | None = None) -> float:
    """A duration read from `name` (seconds; unset or empty means `default`), finite and positive."""
    env = os.environ if env is None else env
    raw = (env.get(name) or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(name, f"{raw!r} is not a number of seconds", f"e.g. {name}={default:g}") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(name, f"{raw!r} is not a positive, finite number of seconds", f"e.g. {name}={default:g}")
    return value


def sim_scale(env: Mapping[str, str] | None = None) -> float:
    """TUNEHARNESS_SIM_SCALE: how many times faster than the wall clock the shared simulated
    marketplace's clock runs, so that beat's periods pass in its seconds (1: the wall clock)."""
    env = os.environ if env is None else env
    raw = (env.get("TUNEHARNESS_SIM_SCALE") or "").strip()
    if not raw:
        return 1.0
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(
            "TUNEHARNESS_SIM_SCALE",
            f"{raw!r} is not a positive, finite scale",
            "set the scale `tuneharness sim serve --scale` runs at, e.g. 5",
        )
    return value
