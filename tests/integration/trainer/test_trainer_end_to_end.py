"""The trainer as a program: train, predict, refuse, report."""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from trainer.models import load_for_inference, minilm_path
from trainer.predict import main_predict, serve
from trainer.reporting import parse_line
from trainer.run import run_job
from trainer.testing import write_causal_job, write_classification_job, write_jsonl

Run = Callable[..., subprocess.CompletedProcess[str]]
Env = Callable[..., dict[str, str]]


def _last_line(job_dir: Path) -> tuple[str, dict[str, str]]:
    parsed = parse_line((job_dir / "train.log").read_text().splitlines()[-1])
    assert parsed is not None
    return parsed[1], parsed[2]


@pytest.mark.slow
def test_causal_nf4_job_trains_and_predicts(tmp_path: Path, tiny_model: Path, run_trainer: Run) -> None:
    """A causal_lm NF4 job finishes with a PEFT adapter, a finished status, and predicts greedily."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, max_steps=6, checkpoint_every=3)
    result = run_trainer("run", "--job-dir", str(job))
    assert result.returncode == 0, result.stdout + result.stderr
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in (job / "adapter").iterdir()}
    status = json.loads((job / "status.json").read_text())
    assert (status["phase"], status["step"], status["last_checkpoint_step"]) == ("finished", 6, 6)
    assert status["eval"]["eval_loss"] > 0
    steps = [parse_line(x) for x in (job / "train.log").read_text().splitlines()]
    step_lines = [p[2] for p in steps if p is not None and p[1] == "step"]
    assert [int(s["step"]) for s in step_lines] == [1, 2, 3, 4, 5, 6]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "samples_per_s", "elapsed_s"} <= set(step_lines[0])
    assert _last_line(job)[0] == "finished"

    rows = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": 1, "prompt": "red cat ->"}, {"id": "two", "messages": [{"role": "user", "content": "a b"}]}],
    )
    out = tmp_path / "preds.jsonl"
    code = main_predict(job_dir=job, base_model=None, adapter=None, input_path=rows, output_path=out, max_new_tokens=4)
    assert code == 0
    preds = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["id"] for p in preds] == [1, "two"]
    assert all(isinstance(p["predicted"], str) for p in preds)


@pytest.mark.slow
def test_classification_minilm_nf4_trains_and_predicts(tmp_path: Path, run_trainer: Run) -> None:
    """A MiniLM NF4 classification job stores its labels; predict (explicit base + adapter) scores each."""
    job = write_classification_job(
        tmp_path / "job", base_model=minilm_path(), max_steps=6, checkpoint_every=3, learning_rate=5e-3
    )
    assert run_job(job) == 0
    assert json.loads((job / "adapter" / "labels.json").read_text()) == ["negative", "positive"]
    rows = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": i, "text": t} for i, t in enumerate(["the film was great", "the meal was awful"])],
    )
    out = tmp_path / "preds.jsonl"
    result = run_trainer(
        "predict",
        "--base-model",
        str(minilm_path()),
        "--adapter",
        str(job / "adapter"),
        "--input",
        str(rows),
        "--output",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    preds = [json.loads(x) for x in out.read_text().splitlines()]
    assert [p["id"] for p in preds] == [0, 1]
    for p in preds:
        assert p["predicted"] in ("negative", "positive")
        assert set(p["scores"]) == {"negative", "positive"}
        assert abs(sum(p["scores"].values()) - 1) < 1e-4

    # the long-lived mode the triage chain keeps loaded answers the same rows the same way
    # (its protocol over pipes is tested in test_trainer_predict_serve.py)
    served = io.StringIO()
    loaded = load_for_inference(job / "adapter", base_model=minilm_path())
    assert serve(loaded, io.BytesIO(rows.read_bytes()), served, max_seq_len=32) == 2
    answers = [json.loads(x) for x in served.getvalue().splitlines()]
    assert [a["predicted"] for a in answers] == [p["predicted"] for p in preds]
    for a, p in zip(answers, preds, strict=True):
        assert all(abs(a["scores"][k] - p["scores"][k]) < 1e-4 for k in p["scores"])


def test_serving_box_is_refused(tmp_path: Path, tiny_model: Path, run_trainer: Run, trainer_env: Env) -> None:
    """With a serving marker present the trainer exits 4, trains nothing, and says why last in train.log."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model)
    marker = tmp_path / "serving"
    marker.write_text("")
    result = run_trainer("run", "--job-dir", str(job), env=trainer_env(TUNEHARNESS_SERVING_MARKER=str(marker)))
    assert result.returncode == 4
    event, fields = _last_line(job)
    assert event == "failed" and "serving box" in fields["reason"]
    assert not (job / "checkpoints").exists()
    result = run_trainer("run", "--job-dir", str(job), env=trainer_env(TUNEHARNESS_ROLE="serving"))
    assert result.returncode == 4


def test_bad_job_field_is_named_in_train_log(tmp_path: Path, tiny_model: Path, run_trainer: Run) -> None:
    """An invalid job.json field makes the trainer exit 2 with the field named on the last log line."""
    job = write_causal_job(tmp_path / "job", base_model=tiny_model, checkpoint_every=0)
    result = run_trainer("run", "--job-dir", str(job))
    assert result.returncode == 2
    event, fields = _last_line(job)
    assert event == "failed" and "'checkpoint_every'" in fields["reason"]


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits_resumable(tmp_path: Path, tiny_model: Path, trainer_env: Env) -> None:
    """SIGTERM during training ends the slice at a step boundary with a checkpoint of that step, exit 3."""
    import signal
    import sys

    from trainer import checkpoint as ckpt

    job = write_causal_job(
        tmp_path / "job",
        base_model=tiny_model,
        max_steps=100000,
        checkpoint_every=100000,
        warmup_steps=0,
        eval_file=None,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--job-dir", str(job)],
        env=trainer_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(2400):  # bounded wait (at most ~120 s) for the first steps
            status = json.loads((job / "status.json").read_text()) if (job / "status.json").exists() else {}
            if status.get("phase") == "training" and "step step=2 " in (job / "train.log").read_text():
                break
            try:
                proc.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                continue
            pytest.fail("the trainer exited before training")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 3
    finally:
        if proc.poll() is None:
            proc.kill()
    latest = ckpt.find_latest(job / "checkpoints")
    event, fields = _last_line(job)
    assert event == "cap" and latest is not None and latest.step == int(fields["step"]) >= 2


def test_full_precision_job_trains_and_predicts_in_process(tmp_path: Path, tiny_model: Path) -> None:
    """quantization "none" trains a LoRA on the full-precision base, and predict reads its adapter."""
    job = write_causal_job(
        tmp_path / "job",
        base_model=tiny_model,
        max_steps=3,
        checkpoint_every=3,
        warmup_steps=0,
        quantization="none",
        lr_schedule="linear",
    )
    assert run_job(job) == 0
    meta = json.loads((job / "adapter" / "trainer_meta.json").read_text())
    assert (meta["quantization"], meta["steps"]) == ("none", 3)
    rows = write_jsonl(tmp_path / "in.jsonl", [{"id": "x", "prompt": "blue dog ->"}])
    out = tmp_path / "out.jsonl"
    assert (
        main_predict(job_dir=job, base_model=None, adapter=None, input_path=rows, output_path=out, max_new_tokens=3)
        == 0
    )
    assert json.loads(out.read_text())["id"] == "x"
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "no id"}])
    assert main_predict(job_dir=job, base_model=None, adapter=None, input_path=bad, output_path=out) == 2
