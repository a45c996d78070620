"""A submit whose enqueue fails after the job was recorded leaves no job `queued` for ever: the job
(and a gated job with its seed runs) is marked failed with the reason, and the error is raised."""

from __future__ import annotations

from pathlib import Path

import pytest

from app import bootstrap
from app.errors import ServiceUnavailable
from app.jobs import parse_job_text
from tests.support.jobfiles import sim_needs_section, train_section


def test_an_enqueue_refused_after_the_record_fails_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker answered the reachability check, then refused the send: the job is failed, not stranded."""
    from app import api

    monkeypatch.setenv("TUNEHARNESS_HOME", str(tmp_path / "home"))
    for name in ("TUNEHARNESS_DB_URL", "TUNEHARNESS_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    bootstrap._engine_for.cache_clear()
    monkeypatch.setattr(bootstrap, "require_broker", lambda *a, **k: None)

    def refused(job_id: str) -> None:
        raise ConnectionError("connection reset by the broker")

    monkeypatch.setattr(bootstrap, "enqueue_job", refused)
    spec = parse_job_text(f"name: atomic\n{train_section()}{sim_needs_section()}budget_usd: 1.0\n", check_files=False)
    with pytest.raises(ServiceUnavailable, match="not enqueued"):
        api.submit(spec)
    (rec,) = bootstrap.jobs().list()
    assert rec.phase == "failed" and "resubmit" in rec.detail
    bootstrap._engine_for.cache_clear()
