"""Push mode against a real loopback S3 server: prefix-scoped presigned POST, optional AES-GCM."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.artifacts import (
    ArtifactError,
    S3ArtifactStore,
    decrypt_object,
    fetch_dir,
    fetch_encrypted_dir,
    grant_push,
    latest_checkpoint,
    open_store,
)
from trainer import checkpoint as ckpt
from trainer.run import EXIT_FINISHED, run_job
from trainer.testing import write_causal_job


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3ArtifactStore]:
    """An S3ArtifactStore on a moto S3 server on 127.0.0.1 (ephemeral port), bucket created."""
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
    assert isinstance(store, S3ArtifactStore)
    store.client.create_bucket(Bucket=bucket)
    yield store
    server.stop()


def _job(tmp_path: Path, tiny_model: Path, grant: dict[str, object]) -> Path:
    job = write_causal_job(
        tmp_path / "job", base_model=tiny_model, max_steps=4, checkpoint_every=2, warmup_steps=0, eval_file=None
    )
    (job / "push.json").write_text(json.dumps(grant))
    return job


def test_encrypted_push_lands_under_job_prefix_as_ciphertext(
    tmp_path: Path, tiny_model: Path, s3: S3ArtifactStore
) -> None:
    """Checkpoints and the adapter are pushed under jobs/<job>/ sealed; the control plane's key opens them."""
    grant, key = grant_push(s3, job="job-7", now=time.time(), expires_s=300, encrypt=True)
    assert key is not None and grant.key_prefix == "runs/jobs/job-7/"
    job = _job(tmp_path, tiny_model, grant.to_json())
    assert run_job(job) == EXIT_FINISHED
    assert "pushed dir=adapter" in (job / "train.log").read_text()
    keys = s3.list_keys("jobs/")
    assert keys and all(k.startswith("jobs/job-7/") for k in keys)
    assert latest_checkpoint(s3, job="job-7") == "step-00000004"

    raw = tmp_path / "raw"
    s3.get_file("jobs/job-7/adapter/adapter_model.safetensors", raw)
    sealed = raw.read_bytes()
    plain = (job / "adapter" / "adapter_model.safetensors").read_bytes()
    assert sealed.startswith(b"THE1") and plain[8:40] not in sealed
    assert decrypt_object(sealed, key=key, aad="jobs/job-7/adapter/adapter_model.safetensors") == plain

    back = fetch_encrypted_dir(s3, "jobs/job-7/checkpoints/step-00000004", tmp_path / "back", key=key)
    assert ckpt.verify(back)["step"] == 4
    with pytest.raises(ArtifactError, match="authentication"):
        fetch_encrypted_dir(s3, "jobs/job-7/adapter", tmp_path / "bad", key=bytes(32))


def test_plain_push_and_expired_grant(tmp_path: Path, tiny_model: Path, s3: S3ArtifactStore) -> None:
    """An unencrypted push is fetched and verified as is; an expired grant pushes nothing and
    training still finishes."""
    grant, key = grant_push(s3, job="plain", now=time.time(), expires_s=300)
    assert key is None
    job = _job(tmp_path / "a", tiny_model, grant.to_json())
    assert run_job(job) == EXIT_FINISHED
    assert ckpt.verify(fetch_dir(s3, "jobs/plain/adapter", tmp_path / "adapter"))["kind"] == "adapter"

    stale, _ = grant_push(s3, job="stale", now=time.time() - 600, expires_s=300)
    job = _job(tmp_path / "b", tiny_model, stale.to_json())
    assert run_job(job) == EXIT_FINISHED
    assert "push_failed" in (job / "train.log").read_text() and "expired" in (job / "train.log").read_text()
    assert s3.list_keys("jobs/stale/") == []
