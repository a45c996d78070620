"""A `command` job's job.json on the host: what it accepts, what it refuses (naming the field), and
the checkpoint manifest the injected Trainer callback writes, checked by the built-in verifier."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainer.checkpoint import CorruptCheckpoint, verify
from trainer.commandspec import parse_command_job
from trainer.hfcallback import _publish, is_complete_trainer_checkpoint
from trainer.jobspec import JobError

LOG = {
    "kind": "command",
    "stack": "log",
    "command": ["python", "train.py"],
    "checkpoints": "ck/ck-*",
    "checkpoint_files": ["state.pt"],
    "resume_args": ["--resume", "{checkpoint}"],
    "output": "final",
}


def test_a_trainer_command_needs_only_its_command(tmp_path: Path) -> None:
    """`kind` and `command` are enough: the stack defaults to trainer, three checkpoints are kept."""
    spec = parse_command_job({"kind": "command", "command": ["python", "sft.py"]}, job_dir=tmp_path)
    assert spec.stack == "trainer" and spec.keep_checkpoints == 3 and spec.grace_s == 60.0
    assert spec.argv(resume=tmp_path / "ck") == ["python", "sft.py"]  # the Trainer resumes through the hook


def test_a_command_line_runs_through_the_shell_and_resume_args_are_appended(tmp_path: Path) -> None:
    """A string command is `sh -c`; a log stack's resume appends its arguments with the checkpoint's path."""
    spec = parse_command_job({**LOG, "command": "python train.py --fast"}, job_dir=tmp_path)
    assert spec.argv(resume=None) == ["sh", "-c", "python train.py --fast"]
    assert spec.argv(resume=Path("/j/checkpoints/step-00000006")) == [
        "sh",
        "-c",
        "python train.py --fast --resume /j/checkpoints/step-00000006",
    ]
    listed = parse_command_job(LOG, job_dir=tmp_path)
    assert listed.argv(resume=Path("/c")) == ["python", "train.py", "--resume", "/c"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"stak": "log"}, "stak"),
        ({"stack": "bash"}, "stack"),
        ({"command": []}, "command"),
        ({"setup": ["trl>=1"]}, "setup"),
        ({"env": {"TUNEHARNESS_JOB_DIR": "/x"}}, "env"),
        ({"grace_s": math.nan}, "grace_s"),
        ({"max_steps": 0}, "max_steps"),
        ({"progress": "no step group"}, "progress"),
        ({"checkpoints": "../elsewhere/*"}, "checkpoints"),
        ({"resume_args": ["--resume"]}, "resume_args"),
    ],
)
def test_a_bad_field_is_refused_by_name(tmp_path: Path, change: dict[str, object], field: str) -> None:
    """Each bad field is refused with a JobError naming that field."""
    with pytest.raises(JobError) as caught:
        parse_command_job({**LOG, **change}, job_dir=tmp_path)
    assert caught.value.field == field


def test_a_log_stack_without_its_checkpoint_layout_is_refused(tmp_path: Path) -> None:
    """Without `checkpoints` a log stack cannot resume: refused before anything starts."""
    raw = {k: v for k, v in LOG.items() if k != "checkpoints"}
    with pytest.raises(JobError, match="checkpoints"):
        parse_command_job(raw, job_dir=tmp_path)


def test_the_callbacks_checkpoint_copy_verifies_as_a_builtin_checkpoint(tmp_path: Path) -> None:
    """A Trainer checkpoint copied by the callback carries a manifest the built-in verifier accepts,
    and a changed byte afterwards is caught."""
    src = tmp_path / "checkpoint-8"
    src.mkdir()
    assert not is_complete_trainer_checkpoint(src)
    (src / "trainer_state.json").write_text(json.dumps({"global_step": 8}))
    assert not is_complete_trainer_checkpoint(src)  # no weights yet
    (src / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    (src / "optimizer.pt").write_bytes(b"\x01" * 32)
    assert is_complete_trainer_checkpoint(src)
    final = tmp_path / "checkpoints" / "step-00000008"
    final.parent.mkdir()

    def fill(tmp: Path) -> None:
        for p in src.iterdir():
            (tmp / p.name).write_bytes(p.read_bytes())

    _publish(final, fill, marker={"step": 8, "kind": "checkpoint"})
    marker = verify(final)
    assert marker["step"] == 8 and set(marker["files"]) == {
        "trainer_state.json",
        "adapter_model.safetensors",
        "optimizer.pt",
    }
    (final / "optimizer.pt").write_bytes(b"\x02" * 32)
    with pytest.raises(CorruptCheckpoint):
        verify(final)


def test_a_sharded_trainer_checkpoint_is_complete_only_with_every_shard(tmp_path: Path) -> None:
    """A sharded model's checkpoint is complete once every shard its index names is there."""
    (tmp_path / "trainer_state.json").write_text("{}")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x")
    assert not is_complete_trainer_checkpoint(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"y")
    assert is_complete_trainer_checkpoint(tmp_path)
