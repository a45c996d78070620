"""Pulling checkpoints and the adapter off a host into an ArtifactStore (local dir and real loopback S3)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.artifacts import (
    ArtifactError,
    ArtifactStore,
    LocalArtifactStore,
    fetch_dir,
    latest_checkpoint,
    open_store,
    pull_adapter,
    pull_checkpoints,
)
from app.ports import CommandResult, HostShell
from trainer import checkpoint as ckpt
from trainer.run import EXIT_FINISHED, run_job
from trainer.testing import write_causal_job


class LocalHostShell:
    """A HostShell whose 'remote' host is this machine's filesystem (remote paths are local paths)."""

    def run(self, command: str, *, timeout_s: float = 60.0, max_output_bytes: int = 4 * 2**20) -> CommandResult:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout_s, check=False)
        return CommandResult(done.returncode, done.stdout, done.stderr)

    def put(self, local: Path, remote: str) -> None:
        shutil.copyfile(local, remote)

    def get(self, remote: str, local: Path, *, max_bytes: int | None = None) -> None:
        shutil.copyfile(remote, local)

    def listdir(self, remote: str) -> list[str]:
        return sorted(p.name for p in Path(remote).iterdir())

    def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def host_job(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """A finished job on the 'host': checkpoints 2 and 4 and the final adapter."""
    job = write_causal_job(
        tmp_path_factory.mktemp("host") / "job",
        base_model=tiny_model,
        max_steps=4,
        checkpoint_every=2,
        warmup_steps=0,
        eval_file=None,
    )
    assert run_job(job) == EXIT_FINISHED
    return job


@pytest.fixture
def s3_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[ArtifactStore]:
    """An S3ArtifactStore on a real moto S3 server on 127.0.0.1 (ephemeral port)."""
    from moto.server import ThreadedMotoServer

    for var, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(var, value)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    bucket = f"artifacts-{uuid.uuid4().hex[:12]}"  # moto's backend is shared by every server in the process
    store = open_store(f"s3://{bucket}/runs", s3_endpoint_url=f"http://{host}:{port}")
    store.client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    yield store
    server.stop()


def _with_partial(host_job: Path, tmp_path: Path) -> Path:
    """A copy of the host job plus a newer checkpoint without its COMPLETE marker (a write in flight)."""
    job = tmp_path / "hostcopy"
    shutil.copytree(host_job, job)
    partial = job / "checkpoints" / "step-00000006"
    shutil.copytree(job / "checkpoints" / "step-00000004", partial)
    (partial / ckpt.MARKER).unlink()
    return job


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_pull_only_complete_checkpoints_then_fetch_verified(
    kind: str, tmp_path: Path, host_job: Path, request: pytest.FixtureRequest
) -> None:
    """Complete checkpoints and the adapter are pulled, the incomplete one is not, and they come back intact."""
    store = LocalArtifactStore(tmp_path / "store") if kind == "local" else request.getfixturevalue("s3_store")
    job = _with_partial(host_job, tmp_path)
    shell: HostShell = LocalHostShell()
    report = pull_checkpoints(shell, str(job), store, job="job-1", staging=tmp_path / "staging")
    assert report.pulled == ("step-00000004", "step-00000002")
    assert report.skipped == (("step-00000006", "incomplete: no COMPLETE marker"),)
    assert latest_checkpoint(store, job="job-1") == "step-00000004"
    again = pull_checkpoints(shell, str(job), store, job="job-1", staging=tmp_path / "staging")
    assert again.pulled == () and again.already_stored == ("step-00000004", "step-00000002")

    fetched = fetch_dir(store, "jobs/job-1/checkpoints/step-00000004", tmp_path / "back")
    assert ckpt.verify(fetched)["step"] == 4  # the trainer accepts what the store gives back
    assert pull_adapter(shell, str(job), store, job="job-1", staging=tmp_path / "staging")
    adapter = fetch_dir(store, "jobs/job-1/adapter", tmp_path / "adapter")
    assert json.loads((adapter / "trainer_meta.json").read_text())["steps"] == 4


def test_tampered_file_is_not_stored(tmp_path: Path, host_job: Path) -> None:
    """A checkpoint whose file does not match its manifest is skipped and never marked complete in the store."""
    job = tmp_path / "hostcopy"
    shutil.copytree(host_job, job)
    state = job / "checkpoints" / "step-00000004" / "trainer_state.pt"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    store = LocalArtifactStore(tmp_path / "store")
    report = pull_checkpoints(LocalHostShell(), str(job), store, job="j", staging=tmp_path / "staging")
    assert report.pulled == ("step-00000002",)
    assert report.skipped[0][0] == "step-00000004" and "checksum" in report.skipped[0][1]
    assert not store.exists("jobs/j/checkpoints/step-00000004/COMPLETE")


def test_host_without_checkpoints_and_bad_keys(tmp_path: Path) -> None:
    """A host with nothing yet pulls nothing; keys that escape the store are refused."""
    store = LocalArtifactStore(tmp_path / "store")
    report = pull_checkpoints(LocalHostShell(), str(tmp_path / "nothing"), store, job="j", staging=tmp_path / "s")
    assert report.pulled == () and report.skipped == ()
    assert not pull_adapter(LocalHostShell(), str(tmp_path / "nothing"), store, job="j", staging=tmp_path / "s")
    with pytest.raises(ArtifactError):
        store.put_file("../escape", tmp_path / "x")
