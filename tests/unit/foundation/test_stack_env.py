"""`tuneharness up` hands Flower the broker and its basic auth, never a vendor key or a password."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.settings import load_settings
from app.stack import Stack


def test_flower_environment_holds_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Vendor keys, the webhook, the LLM key and the database URL stay out of Flower's environment."""
    for name, value in {
        "VAST_API_KEY": "vk",
        "RUNPOD_API_KEY": "rk",
        "TUNEHARNESS_LLM_KEY": "lk",
        "TUNEHARNESS_ALERT_WEBHOOK_URL": "https://hooks.example/T0K3N",
    }.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(
        {
            "TUNEHARNESS_HOME": str(tmp_path),
            "TUNEHARNESS_DB_URL": "postgresql://th:pw@db:5432/th",
            "TUNEHARNESS_FLOWER_USER": "ops",
            "TUNEHARNESS_FLOWER_PASSWORD": "pw2",
        }
    )
    stack = Stack(settings, run_dir=tmp_path / "run", broker_url="redis://127.0.0.1:6379/0")
    env = stack.flower_env()
    assert env["FLOWER_BASIC_AUTH"] == "ops:pw2"
    assert env["TUNEHARNESS_BROKER_URL"] == "redis://127.0.0.1:6379/0"
    leaked = {
        k for k, v in env.items() if k != "FLOWER_BASIC_AUTH" and ("pw" in v or v in ("vk", "rk", "lk") or "T0K3N" in v)
    }
    assert not leaked, leaked
    assert "VAST_API_KEY" in stack.env()  # the worker runs our code and needs the key


@pytest.mark.parametrize(
    ("address", "auth", "refused"),
    [
        ("0.0.0.0", False, True),
        ("10.0.0.5", False, True),
        ("0.0.0.0", True, False),
        ("127.0.0.1", False, False),
        ("localhost", False, False),
    ],
)
def test_flower_on_a_public_address_needs_auth(tmp_path: Path, address: str, auth: bool, refused: bool) -> None:
    """`up` refuses, before starting anything, to put Flower on a reachable address without basic auth."""
    from app.errors import UserError
    from app.stack import refuse_open_flower

    env = {"TUNEHARNESS_HOME": str(tmp_path), "TUNEHARNESS_FLOWER_ADDRESS": address}
    if auth:
        env |= {"TUNEHARNESS_FLOWER_USER": "ops", "TUNEHARNESS_FLOWER_PASSWORD": "pw2"}
    settings = load_settings(env)
    if refused:
        with pytest.raises(UserError, match="without authentication"):
            refuse_open_flower(settings)
        stack = Stack(settings, run_dir=tmp_path / "run")
        with pytest.raises(UserError):
            stack.start()
        assert not stack.children and not (tmp_path / "run").exists()
    else:
        refuse_open_flower(settings)
