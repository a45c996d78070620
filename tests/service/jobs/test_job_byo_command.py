"""A `train: {kind: command}` job file: accepted with only a script named, refused in one line naming
the field, shipped as the files it names, and turned into a host job.json the trainer accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs import JobFileError, parse_job_text
from app.services.supervisor import bundle_for_spec
from tests.support.jobfiles import sim_needs_section
from trainer.commandspec import parse_command_job


def _project(root: Path) -> Path:
    (root / "model").mkdir(parents=True)
    (root / "model" / "config.json").write_text("{}")
    (root / "sft.py").write_text("print('train')\n")
    (root / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    (root / "cfg.yml").write_text("base_model: ./base_model\n")
    return root


def _job(train: str) -> str:
    return "name: byo\n" + train + sim_needs_section()


SCRIPT = """\
train:
  kind: command
  script: sft.py
  args: [--model, base_model, --seed, "{seed}"]
  base_model: model
  train_file: train.jsonl
  seed: 3
"""


def test_a_script_job_ships_its_files_and_becomes_a_host_job_json(tmp_path: Path) -> None:
    """`script:` is enough: the script, the data and the model are shipped, the command is
    `python sft.py ...` with the seed in place, and the trainer's own parser accepts the job.json."""
    root = _project(tmp_path)
    spec = parse_job_text(_job(SCRIPT), base_dir=root)
    assert {Path(p).name for p in spec.ship} == {"sft.py", "train.jsonl", "model"}
    bundle = bundle_for_spec(spec.train, base_dir=spec.base_dir)
    assert bundle.job_json["command"] == ["python", "sft.py", "--model", "base_model", "--seed", "3"]
    assert {rel for _, rel in bundle.files} == {"sft.py", "train.jsonl", "base_model/config.json"}
    host = parse_command_job(dict(bundle.job_json), job_dir=tmp_path)
    assert host.stack == "trainer" and host.seed == 3


def test_an_axolotl_config_runs_through_accelerate(tmp_path: Path) -> None:
    """`axolotl: cfg.yml` becomes `accelerate launch -m axolotl.cli.train cfg.yml`, the config shipped."""
    root = _project(tmp_path)
    spec = parse_job_text(_job("train:\n  kind: command\n  axolotl: cfg.yml\n"), base_dir=root)
    bundle = bundle_for_spec(spec.train, base_dir=spec.base_dir)
    assert bundle.job_json["command"] == ["accelerate", "launch", "-m", "axolotl.cli.train", "cfg.yml"]
    assert [rel for _, rel in bundle.files] == ["cfg.yml"]


@pytest.mark.parametrize(
    ("train", "says"),
    [
        ("train:\n  kind: command\n", "exactly one of script, axolotl or command"),
        ("train:\n  kind: command\n  script: sft.py\n  axolotl: cfg.yml\n", "exactly one of"),
        ("train:\n  kind: command\n  script: sft.py\n  scirpt: x.py\n", "scirpt"),
        ("train:\n  kind: command\n  script: missing.py\n", "does not exist"),
        ("train:\n  kind: command\n  script: ../../etc/passwd\n", "job file's directory"),
        ("train:\n  kind: command\n  script: sft.py\n  setup: [trl]\n", "setup"),
        ("train:\n  kind: command\n  command: train\n  stack: log\n", "log stack needs"),
    ],
)
def test_a_bad_command_section_is_refused_in_one_line(tmp_path: Path, train: str, says: str) -> None:
    """Each mistake is one line naming the problem and the fix, before anything is rented."""
    root = _project(tmp_path)
    with pytest.raises(JobFileError) as caught:
        parse_job_text(_job(train), source="job.yaml", base_dir=root)
    text = str(caught.value)
    assert says in text and "Fix:" in text and "\n" not in text
