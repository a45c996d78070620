"""The control plane checks a job's `train` section by the same keys the trainer reads on the host.

app/jobs.py validates a job file before anything is rented; trainer/jobspec.py reads job.json on
the host. Neither imports the other, so a key added on one side only would be refused (or
silently dropped) on the other, after money was spent on a host.
"""

from __future__ import annotations

from app import jobs
from trainer import jobspec


def test_the_train_sections_required_and_optional_keys_agree() -> None:
    assert jobs._TRAIN_REQUIRED == jobspec._REQUIRED
    assert jobs._TRAIN_OPTIONAL == jobspec._OPTIONAL
