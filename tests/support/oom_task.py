"""A test-only Celery task that kills its worker process on every delivery, as the OOM killer would:
the product's app plus `always_oom`, which the product itself never sends."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from workers.celery_app import app
from workers.tasks import task

__all__ = ["always_oom", "app"]


@task("provision", "always_oom")
def always_oom(self: Any, job_id: str, marker_dir: str) -> None:
    """Write a marker (one per delivery), then SIGKILL this worker process."""
    n = len(list(Path(marker_dir).iterdir()))
    (Path(marker_dir) / f"delivery-{n + 1}").write_text(str(os.getpid()))
    os.kill(os.getpid(), signal.SIGKILL)
