"""`trainer run` on a `command` job, real processes on the CPU: a plain `transformers.Trainer` script
and a TRL SFT script cut into slices and moved between job directories (hosts) end with the same
adapter as an uninterrupted run; the wall-clock cap and SIGTERM end a slice on a complete
checkpoint; any other command is sliced by signal and resumed through its own arguments."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.byo import ROOT, job_json, max_abs_diff, run_slice, write_project
from tests.support.services import wait_until
from trainer.checkpoint import find_latest, verify
from trainer.exitcodes import EXIT_BAD_JOB, EXIT_CAP, EXIT_FAILED, EXIT_FINISHED
from trainer.reporting import parse_line

MAX_STEPS = 24
SAVE_STEPS = 8
SLICE_STEPS = 5  # slices end off the save cadence: each cap forces its own checkpoint


def _events(job_dir: Path) -> list[tuple[str, dict[str, str]]]:
    """The train.log events of a job directory, in order."""
    out = []
    for line in (job_dir / "train.log").read_text().splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            out.append((parsed[1], parsed[2]))
    return out


def _host(root: Path, name: str, project: Path, job: dict[str, object]) -> Path:
    """A job directory as a fresh host has it: the project's files and job.json, no checkpoint."""
    d = root / name
    d.mkdir()
    (d / "base_model").symlink_to(project / "base_model")
    shutil.copy(project / "train.jsonl", d / "train.jsonl")
    shutil.copy(project / "sft.py", d / "sft.py")
    (d / "job.json").write_text(json.dumps(job))
    return d


@pytest.mark.slow
@pytest.mark.parametrize("script", ["trainer", "trl"])
@pytest.mark.long
def test_a_trainer_run_cut_into_slices_across_two_hosts_equals_an_uninterrupted_run(
    script: str, tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """Slices of 5 steps on one host, the newest checkpoint moved to a second host, slices to the end:
    every slice but the last exits 3 on a verified checkpoint and the adapter equals the uninterrupted one."""
    if script == "trl" and importlib.util.find_spec("trl") is None:
        pytest.skip("trl is not installed (pip install -e '.[dev]')")
    env = trainer_env(HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    project = write_project(tmp_path / "project", script=script, model=tiny_model)
    job = job_json(max_steps=MAX_STEPS, save_steps=SAVE_STEPS)
    whole = _host(tmp_path, "whole", project, job)
    first, second = _host(tmp_path, "first", project, job), _host(tmp_path, "second", project, job)

    assert run_slice(whole, env) == EXIT_FINISHED, (whole / "train.log").read_text()[-3000:]
    for _ in range(3):  # steps 0-5, 5-10, 10-15 on the first host
        assert run_slice(first, env, "--slice-steps", str(SLICE_STEPS)) == EXIT_CAP, (first / "train.log").read_text()
        latest = find_latest(first / "checkpoints")
        assert latest is not None and verify(latest.path)["kind"] == "checkpoint"
    assert latest.step == 15
    (second / "checkpoints").mkdir()
    shutil.copytree(latest.path, second / "checkpoints" / latest.path.name)  # what recovery moves
    codes = [run_slice(second, env, "--slice-steps", str(SLICE_STEPS)) for _ in range(2)]
    assert codes == [EXIT_CAP, EXIT_FINISHED], (second / "train.log").read_text()[-3000:]

    verify(second / "adapter")
    meta = json.loads((second / "adapter" / "trainer_meta.json").read_text())
    assert meta["steps"] == MAX_STEPS and meta["task"] == "causal_lm"
    assert max_abs_diff(second / "adapter", whole / "adapter") == 0.0
    resumes = [int(f["step"]) for e, f in _events(second) if e == "resume"]
    assert resumes == [15, 20]
    status = json.loads((second / "status.json").read_text())
    assert status["phase"] == "finished" and status["step"] == MAX_STEPS and status["exit_code"] == 0


@pytest.mark.slow
def test_the_wall_clock_cap_ends_a_trainer_slice_on_a_complete_checkpoint(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """A cap shorter than the start-up: the Trainer saves and stops after its first step, exit 3,
    a `cap` line, status.json exit_code 3, and the script's code after train() never runs."""
    project = write_project(tmp_path / "project", script="trainer", model=tiny_model)
    host = _host(tmp_path, "host", project, job_json(max_steps=MAX_STEPS, save_steps=SAVE_STEPS))
    assert run_slice(host, trainer_env(), "--max-seconds", "1") == EXIT_CAP
    latest = find_latest(host / "checkpoints")
    assert latest is not None and latest.step == 1
    assert verify(latest.path)["step"] == 1
    assert {"trainer_state.json", "adapter_model.safetensors", "optimizer.pt"} <= {
        p.name for p in latest.path.iterdir()
    }
    assert [e for e, _ in _events(host)][-2:] == ["checkpoint", "cap"]
    assert json.loads((host / "status.json").read_text())["exit_code"] == EXIT_CAP
    assert not (host / "out" / "final").exists()  # save_model after train() did not run


@pytest.mark.slow
def test_sigterm_ends_a_trainer_slice_resumable(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """SIGTERM to `trainer run` while the Trainer trains: a `stop_requested` line, a checkpoint of
    the step reached, exit 3."""
    project = write_project(tmp_path / "project", script="trainer", model=tiny_model)
    host = _host(tmp_path, "host", project, job_json(max_steps=400, save_steps=100))
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(host)],
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: (host / "command" / "progress.json").is_file(), timeout_s=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == EXIT_CAP
    finally:
        if proc.poll() is None:
            proc.kill()
    names = [e for e, _ in _events(host)]
    assert "stop_requested" in names and names[-1] == "cap"
    latest = find_latest(host / "checkpoints")
    assert latest is not None and 0 < latest.step < 400


LOG_SCRIPT = """\
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
step, state = 0, 0
if "--resume" in args:
    ck = Path(args[args.index("--resume") + 1])
    step, state = json.loads((ck / "state.json").read_text())["step"], json.loads((ck / "state.json").read_text())["x"]
stop_at = int(os.environ.get("FAIL_AT", "0"))
while step < 12:
    step += 1
    state = (state * 31 + step) % 1000003
    print(f"step {step}/12 loss={1.0 / step:.4f}", flush=True)
    if step == stop_at:
        print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    if step % 3 == 0:
        d = Path("ck") / f"ck-{step}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "state.json").write_text(json.dumps({"step": step, "x": state}))
    if step == int(os.environ.get("BLOCK_AT", "0")):  # a step that never ends (until a signal ends it)
        import signal, threading
        if os.environ.get("IGNORE_TERM"):
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        threading.Event().wait()
Path("final").mkdir(exist_ok=True)
(Path("final") / "result.json").write_text(json.dumps({"x": state}))
"""


def _log_job(root: Path, name: str, **env: str) -> Path:
    """A job directory whose command is LOG_SCRIPT (12 steps, a checkpoint every 3), with `env`."""
    d = root / name
    d.mkdir(exist_ok=True)
    (d / "train.py").write_text(LOG_SCRIPT)
    job = {
        "kind": "command",
        "stack": "log",
        "command": ["python", "train.py"],
        "checkpoints": "ck/ck-*",
        "checkpoint_files": ["state.json"],
        "resume_args": ["--resume", "{checkpoint}"],
        "output": "final",
        "max_steps": 12,
        "grace_s": 1,
        "env": env,
    }
    (d / "job.json").write_text(json.dumps(job))
    return d


def test_any_command_is_sliced_by_signal_and_resumed_through_its_arguments(
    tmp_path: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """A `log` command: progress read off its output, a step cap ends it (exit 3) with its complete
    checkpoints copied and verified, the next slice resumes from the newest, and the output becomes
    the adapter, equal to an uninterrupted run's."""
    env = trainer_env()
    whole = _log_job(tmp_path, "whole")
    assert run_slice(whole, env) == EXIT_FINISHED, (whole / "train.log").read_text()
    # Each slice's command stalls at its fourth step, so the cap of 4 steps always lands there.
    for block_at, newest in ((4, 3), (7, 6), (10, 9)):
        sliced = _log_job(tmp_path, "sliced", BLOCK_AT=str(block_at))
        assert run_slice(sliced, env, "--slice-steps", "4") == EXIT_CAP, (sliced / "train.log").read_text()
        latest = find_latest(sliced / "checkpoints")
        assert latest is not None and latest.step == newest
    sliced = _log_job(tmp_path, "sliced")
    assert run_slice(sliced, env, "--slice-steps", "4") == EXIT_FINISHED, (sliced / "train.log").read_text()
    assert [int(f["step"]) for e, f in _events(sliced) if e == "resume"] == [3, 6, 9]
    verify(sliced / "adapter")
    # A slice started after the end trains nothing: the adapter stands, exit 0 at once.
    before = (sliced / "command.log").read_text()
    assert run_slice(sliced, env) == EXIT_FINISHED
    assert (sliced / "command.log").read_text() == before
    assert (sliced / "adapter" / "result.json").read_text() == (whole / "adapter" / "result.json").read_text()
    steps = [int(f["step"]) for e, f in _events(whole) if e == "step"]
    assert steps == list(range(1, 13))
    assert json.loads((whole / "status.json").read_text())["loss"] == pytest.approx(1 / 12, abs=1e-4)


def test_a_command_that_hangs_past_the_cap_is_killed_after_the_grace_period(
    tmp_path: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """A `log` command that ignores SIGTERM and never ends: the cap's SIGKILL after `grace_s` ends
    it, exit 3, its complete checkpoints up to the cap kept."""
    host = _log_job(tmp_path, "host", BLOCK_AT="7", IGNORE_TERM="1")
    assert run_slice(host, trainer_env(), "--slice-steps", "7") == EXIT_CAP
    latest = find_latest(host / "checkpoints")
    assert latest is not None and latest.step == 6


def test_a_failing_command_leaves_its_output_tail_and_a_failed_line(
    tmp_path: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """The command exits 1: exit 1, its last output lines (the CUDA error) in train.log before a
    `failed` line that names the exit code, so triage reads it as for the built-in trainer."""
    host = _log_job(tmp_path, "host", FAIL_AT="5")
    assert run_slice(host, trainer_env()) == EXIT_FAILED
    text = (host / "train.log").read_text()
    assert "CUDA out of memory" in text
    last = parse_line(text.splitlines()[-1])
    assert last is not None and last[1] == "failed" and "exit 1" in last[2]["reason"]
    assert json.loads((host / "status.json").read_text())["phase"] == "failed"


def test_a_command_that_cannot_start_or_a_bad_job_json_is_refused_with_exit_2(
    tmp_path: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """A missing program and a job.json with an unknown field both end with exit 2 and one line that names the fix."""
    missing = tmp_path / "missing"
    missing.mkdir()
    (missing / "job.json").write_text(json.dumps({"kind": "command", "command": ["no-such-program-xyz"]}))
    assert run_slice(missing, trainer_env()) == EXIT_BAD_JOB
    assert "Fix:" in (missing / "train.log").read_text().splitlines()[-1]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "job.json").write_text(json.dumps({"kind": "command", "command": "true", "stak": "log"}))
    assert run_slice(bad, trainer_env()) == EXIT_BAD_JOB
    assert "'stak'" in (bad / "train.log").read_text()
    assert not os.path.exists(bad / "checkpoints")


def test_setup_pins_are_installed_once_and_on_the_commands_path(
    tmp_path: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """A `setup` pin this Python lacks is installed from the wheelhouse into the host's cache, the
    command imports it, and the next slice finds it cached (the wheelhouse may be gone by then)."""
    from tests.unit.trainer.test_trainer_bootstrap import make_wheel

    wheels, cache = tmp_path / "wheels", tmp_path / "cache"
    make_wheel(wheels, "th_byo_pkg", "1.0")
    host = tmp_path / "host"
    host.mkdir()
    (host / "train.py").write_text(
        "import pathlib, th_byo_pkg\npathlib.Path('final').mkdir()\nprint('step 1/1', th_byo_pkg.__name__)\n"
    )
    job = json.loads((_log_job(tmp_path, "template") / "job.json").read_text())
    job.update(env={}, setup=["th-byo-pkg==1.0"])
    (host / "job.json").write_text(json.dumps(job))
    env = trainer_env(TUNEHARNESS_STACK_CACHE=str(cache), TUNEHARNESS_WHEELHOUSE=str(wheels))
    assert run_slice(host, env) == EXIT_FINISHED, (host / "train.log").read_text()
    installed = sorted(p.name for p in cache.iterdir() if p.name.startswith("byo-"))
    assert len(installed) == 1
    shutil.rmtree(wheels)
    shutil.rmtree(host / "adapter")
    shutil.rmtree(host / "final")
    assert run_slice(host, env) == EXIT_FINISHED, (host / "train.log").read_text()
    assert (host / "command.log").read_text().count("th_byo_pkg") == 2  # imported by both slices
