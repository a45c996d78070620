"""Bad input gets one clear line and exit 2: never a traceback, never a hang, nothing half-written.

Each row of the table is a command a person might type with input that is wrong in a way that
costs money or hangs a terminal (NaN and infinite numbers, binary files, a YAML alias bomb, a
FIFO, a device, a path that climbs out of the job's directory). The real CLI runs as a
subprocess against a fresh TUNEHARNESS_HOME and a reachable broker, so a file that slipped
through validation would really be recorded and enqueued.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.jobfiles import train_section

REPO = Path(__file__).resolve().parents[3]

GOOD_JOB = (
    "name: demo\n"
    + train_section()
    + """\
needs:
  gpu: [RTX 3090]
  providers: [sim]
  max_usd_per_hour: 0.5
  min_reliability: 0.9
  train_hours: 0.5
budget_usd: 3.0
"""
)

BOMB = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True)
)
EVAL_ROW = '{"id": "h1", "slice": "heldout", "prompt": "p", "expected": "e"}\n'
PRED_ROW = '{"id": "h1", "slice": "heldout", "expected": "e", "predicted": "e"}\n'


def _job(text: str) -> Callable[[Path], list[str]]:
    """A job directory holding `text` as job.yaml; the command submits it."""

    def setup(d: Path) -> list[str]:
        (d / "model").mkdir()
        (d / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
        (d / "eval.jsonl").write_text(EVAL_ROW)
        (d.parent / "outside.jsonl").write_text(EVAL_ROW)  # exists: only the climb out is wrong
        (d / "job.yaml").write_text(text)
        return ["submit", str(d / "job.yaml")]

    return setup


def _swap(old: str, new: str) -> Callable[[Path], list[str]]:
    assert old in GOOD_JOB
    return _job(GOOD_JOB.replace(old, new))


def _job_bytes(data: bytes) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        (d / "job.yaml").write_bytes(data)
        return ["submit", str(d / "job.yaml")]

    return setup


def _fifo(*cmd: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        os.mkfifo(d / "pipe")
        return [*cmd, str(d / "pipe")]

    return setup


def _dir(*cmd: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        (d / "sub").mkdir()
        return [*cmd, str(d / "sub")]

    return setup


def _args(*cmd: str) -> Callable[[Path], list[str]]:
    return lambda d: list(cmd)


def _trial(gate_json: str) -> Callable[[Path], list[str]]:
    """A trial directory whose gate.json is `gate_json` (JSON's NaN and Infinity included)."""

    def setup(d: Path) -> list[str]:
        t = d / "trial"
        t.mkdir()
        (t / "gate.json").write_text(gate_json)
        for name in ("baseline.jsonl", "candidate-seed-1.jsonl", "candidate-seed-2.jsonl"):
            (t / name).write_text(PRED_ROW)
        return ["gate", "judge", str(t)]

    return setup


def _triage_jsonl(row: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        (d / "rows.jsonl").write_text(row + "\n")
        return ["triage", "--jsonl", str(d / "rows.jsonl"), "--no-specialist", "--no-llm"]

    return setup


GATE = (
    "gate: {config: {metric: accuracy, min_canaries: 0}, eval: eval.jsonl, baseline: predictions:eval.jsonl, "
    "timeout_s: %s}\n"
)

# (id, how to build the command, words the one line on stderr must hold)
CASES: list[tuple[str, Callable[[Path], list[str]], str]] = [
    ("budget-nan", _swap("budget_usd: 3.0", "budget_usd: .nan"), "budget_usd: is NaN"),
    ("budget-inf", _swap("budget_usd: 3.0", "budget_usd: .inf"), "budget_usd: is infinite"),
    ("budget-1e309", _swap("budget_usd: 3.0", "budget_usd: 1.0e+309"), "budget_usd: is infinite"),
    ("budget-negative", _swap("budget_usd: 3.0", "budget_usd: -1"), "budget_usd: must be at least 0"),
    ("budget-huge", _swap("budget_usd: 3.0", "budget_usd: 1.0e+300"), "budget_usd: must be at most"),
    ("price-nan", _swap("max_usd_per_hour: 0.5", "max_usd_per_hour: .nan"), "needs.max_usd_per_hour: is NaN"),
    ("price-inf", _swap("max_usd_per_hour: 0.5", "max_usd_per_hour: .inf"), "needs.max_usd_per_hour: is infinite"),
    ("reliability-nan", _swap("min_reliability: 0.9", "min_reliability: .nan"), "needs.min_reliability: is NaN"),
    ("train-hours-inf", _swap("train_hours: 0.5", "train_hours: .inf"), "needs.train_hours: is infinite"),
    ("max-steps-huge", _swap("max_steps: 20", "max_steps: 100000000000000000000"), "train.max_steps: must be at most"),
    ("learning-rate-nan", _swap("learning_rate: 2.0e-4", "learning_rate: .nan"), "train.learning_rate: is NaN"),
    ("gate-timeout-nan", _job(GOOD_JOB + GATE % ".nan"), "gate.timeout_s: is NaN"),
    ("job-binary", _job_bytes(b"\xff\xfe\x00\x01binary\x00"), "not UTF-8 text"),
    ("job-latin-1", _job_bytes(b"name: caf\xe9\n"), "not UTF-8 text"),
    ("job-control-bytes", _job_bytes(b"name: a\x1b[2J\x00\n"), "not valid YAML"),
    ("job-alias-bomb", _job(BOMB), "YAML aliases"),
    ("job-deeply-nested", _job("[" * 3000 + "]" * 3000), "nested too deeply"),
    ("job-directory", _dir("submit"), "is a directory"),
    ("job-fifo", _fifo("submit"), "is not a regular file"),
    ("job-device", _args("submit", "/dev/zero"), "is not a regular file"),
    ("train-file-escapes", _swap("train_file: train.jsonl", "train_file: ../outside.jsonl"), "leaves the job file's"),
    ("train-file-etc", _swap("train_file: train.jsonl", "train_file: ../../../../../../../etc/passwd"), "leaves the"),
    ("train-file-device", _swap("train_file: train.jsonl", "train_file: /dev/zero"), "not a regular file"),
    (
        "gate-eval-escapes",
        _job(GOOD_JOB + GATE.replace("eval: eval", "eval: ../outside") % "60"),
        "leaves the job file's",
    ),
    ("cap-nan", _args("budget", "set", "day", "--cap-usd", "nan"), "--cap-usd: is NaN"),
    ("cap-inf", _args("budget", "set", "day", "--cap-usd", "inf"), "--cap-usd: is infinite"),
    ("cap-1e309", _args("budget", "set", "day", "--cap-usd", "1e309"), "--cap-usd: is infinite"),
    ("cap-negative", _args("budget", "set", "day", "--cap-usd=-1"), "--cap-usd: must be at least 0"),
    ("cap-gpu-minutes-nan", _args("budget", "set", "gpu-minutes-day", "--cap-gpu-minutes", "nan"), "is NaN"),
    ("gate-margin-nan", _trial('{"metric": "accuracy", "min_margin": NaN}'), "'min_margin' is nan"),
    ("gate-margin-inf", _trial('{"metric": "accuracy", "min_margin": Infinity}'), "'min_margin' is inf"),
    ("gate-margin-1e309", _trial('{"metric": "accuracy", "min_margin": 1e309}'), "'min_margin' is inf"),
    ("gate-ood-floor-nan", _trial('{"metric": "accuracy", "ood": {"x": {"floor": NaN}}}'), "'floor' is nan"),
    (
        "gate-run-timeout-nan",
        _args(
            *("gate", "run", "--out", "o", "--config", "c", "--eval", "e"),
            *("--baseline", "predictions:b", "--candidate", "1=predictions:c", "--timeout-s", "nan"),
        ),
        "--timeout-s: is NaN",
    ),
    ("triage-fifo", _fifo("triage"), "is not a regular file"),
    ("triage-device", _args("triage", "/dev/zero"), "is not a regular file"),
    ("triage-directory", _dir("triage"), "is a directory"),
    ("triage-idle-nan", _args("triage", "/etc/hostname", "--idle-seconds", "nan"), "--idle-seconds: is NaN"),
    ("triage-jsonl-device", _args("triage", "--jsonl", "/dev/zero"), "is not a JSONL file or a pipe"),
    ("triage-jsonl-idle-nan", _triage_jsonl('{"id": 1, "log": "x", "idle_seconds": NaN}'), "idle_seconds must be"),
]


@pytest.fixture
def env(th_env: dict[str, str]) -> dict[str, str]:
    return th_env


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli.main", *args],
        env=env,
        cwd=cwd,
        text=True,
        capture_output=True,
        timeout=60,  # a hang (a FIFO opened for reading) fails the test instead of the suite
        stdin=subprocess.DEVNULL,
    )


def _money_rows(home: Path) -> list[tuple[str, int]]:
    """Rows in the tables a half-done command would have written (none when there is no database)."""
    db = home / "tuneharness.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        wanted = ("jobs", "budget_caps", "budget_reservations", "ledger_events")
        counts = [(t, conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]) for t in wanted if t in tables]
    return [(t, n) for t, n in counts if n]


@pytest.mark.parametrize(("setup", "words"), [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    setup: Callable[[Path], list[str]], words: str, env: dict[str, str], tmp_path: Path
) -> None:
    """The command exits 2 with one line on stderr naming the problem and the fix; nothing is recorded."""
    work = tmp_path / "work"
    work.mkdir()
    out = _cli(setup(work), env, work)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr[-2000:]
    assert words in out.stderr and "Fix:" in out.stderr, out.stderr
    assert out.stderr.isascii() or out.stderr[:-1].isprintable(), "control characters reached the terminal"
    assert "Traceback" not in out.stderr + out.stdout
    assert _money_rows(Path(env["TUNEHARNESS_HOME"])) == []


def test_triage_escapes_control_bytes_a_log_carries(env: dict[str, str], tmp_path: Path) -> None:
    """A log with escape sequences (ESC, the C1 CSI, backspace) is triaged, and what is printed
    holds none of them: they are shown escaped."""
    log = tmp_path / "train.log"
    log.write_bytes(
        b"step 1 loss 2.0\x08\x08\x7f\r\xc2\x9b2J\n"
        b'Traceback (most recent call last):\xc2\x9b31m\n  File "x", line 1\nValueError: bad\xc2\x9b0m\x1bc\x07\n'
        + bytes(range(256))
        + b"\n"
    )
    out = _cli(["triage", str(log), "--no-specialist", "--no-llm"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        assert line.isprintable(), repr(line)
    assert "\\x9b" in out.stdout


def test_a_job_file_alias_bomb_is_refused_fast_in_bounded_memory(tmp_path: Path) -> None:
    """A 'billion laughs' job file is refused in well under a second, without expanding it."""
    import resource
    import time

    from app.jobs import JobFileError, parse_job_text

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with pytest.raises(JobFileError, match="YAML aliases"):
        parse_job_text(BOMB, source="bomb.yaml", base_dir=tmp_path)
    assert time.perf_counter() - t0 < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB


def test_a_good_job_file_still_passes_check(env: dict[str, str], tmp_path: Path) -> None:
    """The table's base job file is valid: each row fails for its own reason only."""
    work = tmp_path / "work"
    work.mkdir()
    args = _job(GOOD_JOB + GATE % "60")(work)
    out = _cli([*args, "--check"], env, work)
    assert out.returncode == 0 and "ok (demo)" in out.stdout, out.stderr
