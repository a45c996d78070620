"""The compose file deploys what the architecture promises (checked by parsing; no engine here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def _command(service: dict[str, Any]) -> list[str]:
    return [str(x) for x in (service.get("entrypoint") or []) + (service.get("command") or [])]


def test_services_present() -> None:
    """redis, postgres, worker, beat and flower are all defined."""
    assert {"redis", "postgres", "worker", "beat", "flower"} <= set(_compose()["services"])


def test_redis_is_durable_and_never_evicts() -> None:
    """Redis keeps an append-only file and refuses to evict Celery's keys."""
    cmd = " ".join(_command(_compose()["services"]["redis"]))
    assert "--appendonly yes" in cmd and "--maxmemory-policy noeviction" in cmd


def test_exactly_one_beat_and_scalable_workers() -> None:
    """Beat runs as a single replica; workers may scale."""
    services = _compose()["services"]
    assert services["beat"].get("deploy", {}).get("replicas", 1) == 1
    assert "beat" in _command(services["beat"])
    assert "worker" in _command(services["worker"]) and "container_name" not in services["worker"]


def test_flower_is_on_localhost_with_basic_auth() -> None:
    """Flower publishes only on the host's loopback and requires basic-auth credentials."""
    flower = _compose()["services"]["flower"]
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    assert "--basic-auth" not in " ".join(_command(flower))  # never on a command line


def test_no_secret_values_in_the_file() -> None:
    """Secrets are interpolated from the environment, never written in the file."""
    text = (REPO / "docker-compose.yml").read_text()
    for line in text.splitlines():
        if any(k in line for k in ("PASSWORD:", "API_KEY:", "BASIC_AUTH:", "WEBHOOK_URL:")) and ":" in line:
            value = line.split(":", 1)[1].strip()
            assert value == "" or value.startswith("${") or "*" in value or value.startswith("postgresql://"), line


def test_flower_gets_no_secret_but_its_own_basic_auth() -> None:
    """Flower is code we did not write: its environment holds the broker, not keys or passwords."""
    env = _compose()["services"]["flower"]["environment"]
    secret = [
        k
        for k in env
        if k != "FLOWER_BASIC_AUTH" and any(w in k for w in ("KEY", "PASSWORD", "WEBHOOK", "DB_URL", "TOKEN"))
    ]
    assert not secret, secret
    assert env["TUNEHARNESS_BROKER_URL"].startswith("redis://")
