"""`python -m trainer predict --serve`: one load, then one answer line per row line, until EOF."""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainer.predict import main_predict
from trainer.run import run_job
from trainer.testing import write_causal_job, write_jsonl

REPO = Path(__file__).resolve().parents[3]


def _answer(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> dict[str, Any]:
    """The server's next line (a bounded wait: it must come without closing stdin)."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        assert sel.select(timeout_s), "no answer: the server did not flush its line"
    finally:
        sel.close()
    line = proc.stdout.readline()
    assert line.endswith("\n"), f"the server ended instead of answering ({proc.poll()})"
    answer: dict[str, Any] = json.loads(line)
    return answer


def test_serve_answers_each_line_as_it_comes_and_survives_bad_rows(
    tmp_path: Path, tiny_model: Path, trainer_env: Callable[..., dict[str, str]]
) -> None:
    """Each row is answered before the next is sent, as batch predict answers it; a bad row gets an
    error line and the server goes on; EOF ends it with exit 0 and nothing else on stdout."""
    job = write_causal_job(
        tmp_path / "job", base_model=tiny_model, max_steps=2, checkpoint_every=2, eval_file=None, warmup_steps=0
    )
    assert run_job(job) == 0
    rows = [{"id": 1, "prompt": "red cat ->"}, {"id": "two", "messages": [{"role": "user", "content": "a b"}]}]
    batch_out = tmp_path / "batch.jsonl"
    assert (
        main_predict(
            job_dir=job,
            base_model=None,
            adapter=None,
            input_path=write_jsonl(tmp_path / "in.jsonl", rows),
            output_path=batch_out,
            max_new_tokens=4,
        )
        == 0
    )
    expected = [json.loads(x) for x in batch_out.read_text().splitlines()]

    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer", "predict", "--serve", "--job-dir", str(job), "--max-new-tokens", "4"],
        cwd=REPO,
        env=trainer_env(),
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdin is not None
        answers = []
        for line in [json.dumps(rows[0]), "", "{not json", json.dumps({"prompt": "no id"}), json.dumps(rows[1])]:
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            if line:
                answers.append(_answer(proc))
        proc.stdin.close()
        assert proc.wait(timeout=60) == 0
        assert proc.stdout is not None and proc.stdout.read() == ""
        stderr = proc.stderr.read() if proc.stderr is not None else ""
    finally:
        if proc.poll() is None:
            proc.kill()
    assert answers[0] == expected[0] and answers[3] == expected[1]
    assert answers[1]["id"] is None and "not JSON" in answers[1]["error"]
    assert answers[2]["id"] is None and "'id'" in answers[2]["error"]
    assert "serving task=causal_lm" in stderr and "after 4 rows" in stderr
