"""What a worker on any machine needs of a job is in the fleet's database or its shared artifact
store: SSH keys and host-key pins in tables, the store proven the same by a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.artifacts import LocalArtifactStore
from app.db import init_db, make_engine
from app.errors import ConfigError
from app.fleetstore import check_fleet_store
from app.hostkeys import DbHostKeyPin, JobKey, job_key
from app.ssh import HostKeyChanged, generate_keypair


@pytest.fixture
def engine(db_url: str):  # type: ignore[no-untyped-def]
    eng = make_engine(db_url)
    init_db(eng)
    yield eng
    eng.dispose()


def test_a_job_key_is_made_once_and_every_caller_gets_the_same(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Two lookups from different homes return one key pair, made on the first, with no file written."""
    first = job_key(engine, "job-1", legacy_dir=tmp_path / "a" / "keys" / "job-1")
    again = job_key(engine, "job-1", legacy_dir=tmp_path / "b" / "keys" / "job-1")
    assert again == first and first.public_key.startswith("ssh-ed25519 ")
    assert "OPENSSH PRIVATE KEY" in first.private_key
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_key_an_older_home_keeps_on_disk_is_stored_and_keeps_working(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A key pair already under TUNEHARNESS_HOME/keys/<job> is the job's key, and is in the database after."""
    old = generate_keypair(tmp_path / "keys" / "job-2", comment="tuneharness-job-2")
    got = job_key(engine, "job-2", legacy_dir=tmp_path / "keys" / "job-2")
    assert got.public_key == old.public_key
    assert got.private_key == old.private_key_path.read_text()
    assert job_key(engine, "job-2") == got  # without the home: from the database


def test_a_private_key_never_shows_in_a_repr() -> None:
    """The key pair's repr (what a log line or a traceback prints) leaves out the private half."""
    key = JobKey("j", "ssh-ed25519 AAAA j", "-----BEGIN OPENSSH PRIVATE KEY-----secret")
    assert "secret" not in repr(key) and "PRIVATE" not in repr(key)


def test_a_pin_is_shared_and_a_different_key_is_refused(engine) -> None:  # type: ignore[no-untyped-def]
    """The host key one worker pinned is what another reads; a second, different first contact is refused."""
    mine = DbHostKeyPin(engine, provider="sim", instance_id="i-1")
    theirs = DbHostKeyPin(engine, provider="sim", instance_id="i-1")
    assert theirs.get() is None
    mine.set("ssh-ed25519 AAAAfirst")
    assert theirs.get() == "ssh-ed25519 AAAAfirst"
    theirs.set("ssh-ed25519 AAAAfirst")  # the same key again is harmless
    with pytest.raises(HostKeyChanged):
        theirs.set("ssh-ed25519 AAAAother")


def test_a_pin_file_of_an_older_home_is_read_once_and_stored(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A pin file beside an older home's key is the pin, and stays the pin once the file is gone."""
    legacy = tmp_path / "keys" / "job-3" / "host-sim-i-2.pub"
    legacy.parent.mkdir(parents=True)
    legacy.write_text("ssh-ed25519 AAAAold\n")
    assert DbHostKeyPin(engine, provider="sim", instance_id="i-2", legacy_file=legacy).get() == "ssh-ed25519 AAAAold"
    legacy.unlink()
    assert DbHostKeyPin(engine, provider="sim", instance_id="i-2", legacy_file=legacy).get() == "ssh-ed25519 AAAAold"


def test_the_first_store_is_the_fleets_and_another_is_refused_with_the_fix(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The first worker's store is recorded; the same store passes; a machine-local other one is refused."""
    shared, local = tmp_path / "shared", tmp_path / "machine-b"
    assert not check_fleet_store(engine, LocalArtifactStore(shared), str(shared), record=False).recorded
    assert check_fleet_store(engine, LocalArtifactStore(shared), str(shared), record=True).recorded
    assert check_fleet_store(engine, LocalArtifactStore(shared), "/mnt/same-volume", record=True).recorded
    for record in (True, False):
        with pytest.raises(ConfigError) as refused:
            check_fleet_store(engine, LocalArtifactStore(local), str(local), record=record)
        message = str(refused.value)
        assert "\n" not in message and str(shared) in message and "TUNEHARNESS_ARTIFACTS" in message
    assert not local.exists()  # nothing written into the refused store


def test_a_store_that_already_holds_a_marker_is_adopted_by_a_new_database(engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A store recorded by an earlier database keeps its token, so the workers that use it still agree."""
    store = LocalArtifactStore(tmp_path / "store")
    other = make_engine(f"sqlite:///{tmp_path / 'earlier.db'}")
    init_db(other)
    check_fleet_store(other, store, "store", record=True)
    marker = (tmp_path / "store" / "fleet" / "store-id.json").read_text()
    assert check_fleet_store(engine, store, "store", record=True).recorded
    assert (tmp_path / "store" / "fleet" / "store-id.json").read_text() == marker
    other.dispose()
