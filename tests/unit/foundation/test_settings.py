"""Settings are validated once, and every error names the variable and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import SettingsError
from app.settings import load_settings


def test_defaults_use_sqlite_under_home_and_local_redis(tmp_path: Path) -> None:
    """With only a home set, the database is SQLite inside it and the broker is local Redis."""
    s = load_settings({"TUNEHARNESS_HOME": str(tmp_path)})
    assert s.db_url == f"sqlite:///{tmp_path / 'tuneharness.db'}"
    assert s.broker_url == "redis://127.0.0.1:6379/0"
    assert s.result_url == s.broker_url
    assert s.flower_address == "127.0.0.1"


def test_postgres_urls_are_normalised_to_psycopg() -> None:
    """postgres:// and postgresql:// both select the psycopg driver."""
    s = load_settings({"TUNEHARNESS_DB_URL": "postgres://u@h:5432/db"})
    assert s.db_url == "postgresql+psycopg://u@h:5432/db"
    assert s.is_postgres


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"TUNEHARNESS_DB_URL": "mysql://root@localhost/db"}, "TUNEHARNESS_DB_URL"),
        ({"TUNEHARNESS_DB_URL": "sqlite://"}, "TUNEHARNESS_DB_URL"),
        ({"TUNEHARNESS_BROKER_URL": "amqp://guest@localhost//"}, "TUNEHARNESS_BROKER_URL"),
        ({"TUNEHARNESS_BROKER_URL": "redis://127.0.0.1:notaport/0"}, "TUNEHARNESS_BROKER_URL"),
        ({"TUNEHARNESS_RESULT_URL": "rpc://"}, "TUNEHARNESS_RESULT_URL"),
        ({"TUNEHARNESS_FLOWER_PORT": "99999"}, "TUNEHARNESS_FLOWER_PORT"),
        ({"TUNEHARNESS_FLOWER_USER": "admin"}, "TUNEHARNESS_FLOWER_PASSWORD"),
    ],
)
def test_each_bad_variable_is_named_with_a_fix(env: dict[str, str], variable: str) -> None:
    """A bad value raises SettingsError naming that variable and saying how to fix it."""
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert info.value.variable == variable
    assert "Fix:" in str(info.value)


def test_home_that_is_a_file_is_refused(tmp_path: Path) -> None:
    """TUNEHARNESS_HOME pointing at a file is refused before anything is written."""
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SettingsError, match="TUNEHARNESS_HOME"):
        load_settings({"TUNEHARNESS_HOME": str(f)})
