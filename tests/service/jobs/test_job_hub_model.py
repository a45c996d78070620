"""A job file's base model as a public Hugging Face model pinned to a commit: checked at submit,
fetched by the host (nothing shipped from here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.jobs import JobFileError, parse_job_text
from app.services.supervisor import bundle_for_spec
from tests.support.jobfiles import train_section

REV = "0123456789abcdef0123456789abcdef01234567"
NEEDS = "needs:\n  gpu: [RTX 3090]\n"


def _text(base_model: str) -> str:
    return "name: demo\n" + train_section("nf4").replace("  base_model: model", f"  base_model: {base_model}") + NEEDS


@pytest.fixture
def jobdir(tmp_path: Path) -> Path:
    (tmp_path / "train.jsonl").write_text('{"prompt": "a", "completion": "b"}\n')
    return tmp_path


def test_a_pinned_hub_model_is_accepted_and_not_shipped(jobdir: Path) -> None:
    """`{hf: ORG/NAME, revision: <40-hex>}` parses; the bundle carries the hub reference and no model files."""
    spec = parse_job_text(_text(f"{{hf: Qwen/Qwen2.5-0.5B, revision: {REV}}}"), base_dir=jobdir)
    assert {Path(p).name for p in spec.ship} == {"train.jsonl"}
    bundle = bundle_for_spec(spec.train, base_dir=jobdir)
    assert bundle.hub == ("Qwen/Qwen2.5-0.5B", REV)
    assert bundle.job_json["base_model"] == "base_model"  # where the host fetches it, as the trainer reads it
    assert [remote for _, remote in bundle.files] == ["data/train.jsonl"]


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("{hf: Qwen/Qwen2.5-0.5B, revision: main}", "train.base_model.revision", "40-hex commit"),
        (f"{{hf: not-a-repo, revision: {REV}}}", "train.base_model.hf", "ORG/NAME"),
        ("{hf: Qwen/Qwen2.5-0.5B}", "train.base_model", "`revision` is missing"),
        (f"{{hf: Qwen/Qwen2.5-0.5B, revision: {REV}, token: x}}", "train.base_model.token", "token"),
    ],
)
def test_a_hub_model_that_is_not_pinned_is_refused_by_field(jobdir: Path, value: str, field: str, words: str) -> None:
    """A branch instead of a commit, a malformed id, a missing key or an unknown key each name the field and the fix."""
    with pytest.raises(JobFileError) as info:
        parse_job_text(_text(value), source="job.yaml", base_dir=jobdir)
    assert info.value.field == field and words in str(info.value) and "Fix:" in str(info.value)
