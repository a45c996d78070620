"""How `python -m trainer run` ends: its exit codes are part of the file protocol.

The control plane reads them from `slice.exit` (`app.policy.supervision.TrainerExit` mirrors
this table; a test checks that the two agree, since neither side imports the other).
"""

from __future__ import annotations

__all__ = ["EXIT_BAD_JOB", "EXIT_CAP", "EXIT_DISK_FULL", "EXIT_FAILED", "EXIT_FINISHED", "EXIT_REFUSED"]

EXIT_FINISHED = 0  # max_steps reached, the adapter written
EXIT_FAILED = 1  # training failed; the reason is the last line of train.log
EXIT_BAD_JOB = 2  # job.json or the data refused, or a checkpoint of another model's shape
EXIT_CAP = 3  # the slice's cap (seconds or steps) reached: resumable
EXIT_REFUSED = 4  # a serving box: this host must never train
EXIT_DISK_FULL = 5  # a checkpoint could not be written: the disk is full
