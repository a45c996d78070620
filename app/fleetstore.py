"""The artifact store a fleet's workers share: proven at every worker's start, not assumed.

Checkpoints and adapters pulled by a worker on one machine are resumed from, and evaluated, by
workers on other machines, so every worker must use the same store (TUNEHARNESS_ARTIFACTS: a
network volume mounted on each machine, or one s3:// URL). A path that merely reads the same on
two machines proves nothing, so the first worker writes a random token into its store
(`MARKER_KEY`) and records it in the fleet's database; every later worker reads the marker through
its own store and refuses to start when it does not hold that token. `tuneharness doctor` runs the
same check without recording anything.
"""

from __future__ import annotations

import json
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, select
from sqlmodel import Field, SQLModel

from app.artifacts import ArtifactError, ArtifactStore
from app.db import read_connection, write_transaction
from app.errors import ConfigError

__all__ = ["MARKER_KEY", "FleetStoreRow", "StoreVerdict", "check_fleet_store"]

MARKER_KEY = "fleet/store-id.json"
_NAME = "artifacts"


class FleetStoreRow(SQLModel, table=True):
    __tablename__ = "fleet_artifact_store"

    name: str = Field(primary_key=True)
    token: str
    location: str  # as the worker that recorded it named it (for the messages)
    recorded_at: float


_T = FleetStoreRow.__table__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class StoreVerdict:
    recorded: bool  # the fleet's store is recorded in the database (now or before)
    detail: str


def _marker(store: ArtifactStore) -> str | None:
    """The token in the store's marker; None without one (or with one that is not ours)."""
    if not store.exists(MARKER_KEY):
        return None
    with tempfile.TemporaryDirectory(prefix="tuneharness-store-") as tmp:
        local = Path(tmp) / "marker.json"
        store.get_file(MARKER_KEY, local)
        try:
            data = json.loads(local.read_text(encoding="utf-8"))
        except ValueError:
            return None
    token = data.get("token") if isinstance(data, dict) else None
    return token if isinstance(token, str) and token else None


def _write_marker(store: ArtifactStore, token: str) -> None:
    with tempfile.TemporaryDirectory(prefix="tuneharness-store-") as tmp:
        local = Path(tmp) / "marker.json"
        local.write_text(json.dumps({"token": token}), encoding="utf-8")
        store.put_file(MARKER_KEY, local)


def _refusal(location: str, fleet_location: str) -> ConfigError:
    return ConfigError(
        f"the artifact store {location} is not the fleet's ({fleet_location}): checkpoints pulled here would "
        "be invisible to workers on other machines. Fix: point TUNEHARNESS_ARTIFACTS at the fleet's shared "
        f"store ({fleet_location}, the same network volume or s3:// URL on every machine)"
    )


def check_fleet_store(engine: Engine, store: ArtifactStore, location: str, *, record: bool) -> StoreVerdict:
    """Raise ConfigError (one line, with the fix) when `store` is not the one the fleet's database
    names. With `record` (a worker starting), the first worker's store becomes the fleet's."""
    try:
        if not record:
            with read_connection(engine) as conn:
                row = conn.execute(select(_T).where(_T.c.name == _NAME)).first()
            if row is None:
                return StoreVerdict(False, f"{location}; no worker has recorded the fleet's store yet")
            if _marker(store) != row.token:
                raise _refusal(location, row.location)
            return StoreVerdict(True, f"{location} is the fleet's shared store")
        with write_transaction(engine, lock="tuneharness.fleet.artifacts") as conn:
            row = conn.execute(select(_T).where(_T.c.name == _NAME)).first()
            found = _marker(store)
            if row is None:
                token = found or secrets.token_hex(16)
                if found is None:
                    _write_marker(store, token)
                conn.execute(_T.insert().values(name=_NAME, token=token, location=location, recorded_at=time.time()))
                return StoreVerdict(True, f"{location} recorded as the fleet's shared store")
        if found != row.token:
            raise _refusal(location, row.location)
        return StoreVerdict(True, f"{location} is the fleet's shared store")
    except ArtifactError as exc:
        raise ConfigError(
            f"cannot read the artifact store {location}: {exc}. Fix: check TUNEHARNESS_ARTIFACTS and its credentials"
        ) from None
