"""Nothing secret is shipped to a host: a job's model and data may not come from the state
directory, be a private key, or hold a credential file; refused at submit in one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from app.jobs import JobFileError, parse_job_text
from app.ssh import generate_keypair
from tests.support.jobfiles import sim_needs_section, train_section

ROOT = Path(__file__).resolve().parents[3]


def _job(base_model: str = "model", train_file: str = "train.jsonl") -> str:
    text = "name: ship\n" + train_section() + sim_needs_section()
    return text.replace("base_model: model", f"base_model: {base_model}").replace(
        "train_file: train.jsonl", f"train_file: {train_file}"
    )


@pytest.fixture
def jobdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    generate_keypair(home / "keys" / "job-1")
    monkeypatch.setenv("TUNEHARNESS_HOME", str(home))
    d = tmp_path / "job"
    (d / "model").mkdir(parents=True)
    (d / "model" / "config.json").write_text("{}")
    (d / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    return d


def _refusal(jobdir: Path, text: str) -> str:
    with pytest.raises(JobFileError) as caught:
        parse_job_text(text, source="job.yaml", base_dir=jobdir)
    return str(caught.value)


def test_a_clean_model_and_data_are_accepted(jobdir: Path) -> None:
    """A model directory and a training file with nothing secret in them pass."""
    spec = parse_job_text(_job(), source="job.yaml", base_dir=jobdir)
    assert len(spec.ship) == 2


Setup = Callable[[Path, Path], str]  # (jobdir, state dir) -> the job file's text


def _key_in_state(d: Path, home: Path) -> str:
    return _job(train_file=str(home / "keys" / "job-1" / "id_ed25519"))


def _state_dir_itself(d: Path, home: Path) -> str:
    return _job(base_model=str(home))


def _dir_holding_state(d: Path, home: Path) -> str:
    return _job(base_model=str(home.parent))


def _key_named_like_data(d: Path, home: Path) -> str:
    (d / "data.jsonl").write_bytes((home / "keys" / "job-1" / "id_ed25519").read_bytes())
    return _job(train_file="data.jsonl")


def _pem_key(d: Path, home: Path) -> str:
    (d / "rows.jsonl").write_text("-----BEGIN RSA PRIVATE KEY-----\nMIIE...\n-----END RSA PRIVATE KEY-----\n")
    return _job(train_file="rows.jsonl")


def _env_in_model(d: Path, home: Path) -> str:
    (d / "model" / ".env").write_text("VAST_API_KEY=secret\n")
    return _job()


def _netrc_in_model(d: Path, home: Path) -> str:
    (d / "model" / "sub").mkdir()
    (d / "model" / "sub" / ".netrc").write_text("machine x login y password z\n")
    return _job()


def _ssh_key_in_model(d: Path, home: Path) -> str:
    (d / "model" / "id_rsa").write_text("not even a real key\n")
    return _job()


def _link_into_state(d: Path, home: Path) -> str:
    os.symlink(home / "keys", d / "model" / "keys")
    return _job()


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (_key_in_state, "inside the state directory"),
        (_state_dir_itself, "inside the state directory"),
        (_dir_holding_state, "contains the state directory"),
        (_key_named_like_data, "looks like a private key"),
        (_pem_key, "looks like a private key"),
        (_env_in_model, "credential file (.env)"),
        (_netrc_in_model, "credential file (.netrc)"),
        (_ssh_key_in_model, "credential file (id_rsa)"),
        (_link_into_state, "leads into the state directory"),
    ],
)
def test_secret_paths_are_refused(jobdir: Path, setup: Setup, needle: str) -> None:
    """Each way a secret could ride along is refused, naming the field, the path and the fix."""
    home = Path(os.environ["TUNEHARNESS_HOME"]).resolve()
    msg = _refusal(jobdir, setup(jobdir, home))
    assert needle in msg and "train." in msg and "Fix:" in msg, msg


def test_submit_refuses_in_one_line_with_exit_2(jobdir: Path) -> None:
    """`tuneharness submit` on a job that ships the state directory's key prints one line and exits 2."""
    home = Path(os.environ["TUNEHARNESS_HOME"])
    (jobdir / "job.yaml").write_text(_key_in_state(jobdir, home))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEHARNESS_")}
    env.update(TUNEHARNESS_HOME=str(home), TUNEHARNESS_BROKER_URL="redis://127.0.0.1:1/0", PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "submit", str(jobdir / "job.yaml"), "--dry-run"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "inside the state directory" in lines[0] and "Traceback" not in out.stderr
