"""`python -m trainer fetch-model` against the fake Hugging Face Hub on loopback, serving the tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from providers.fakes.hf import FakeHub
from trainer.fetch import EXIT_FETCH_FAILED, EXIT_HASH_MISMATCH, FETCH_MANIFEST, main_fetch

REPO = Path(__file__).resolve().parents[3]
MODEL = "tiny-org/tiny-causal"
REV = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(tiny_model: Path) -> Iterator[FakeHub]:
    with FakeHub(page_size=3, lfs_min_bytes=4096) as fake:
        fake.add_repo(MODEL, REV, tiny_model)
        yield fake


def _same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    return all((b / f).read_bytes() == (a / f).read_bytes() for f in files) and len(files) > 3


def test_the_host_fetches_the_pinned_model_and_verifies_it(hub: FakeHub, tiny_model: Path, tmp_path: Path) -> None:
    """The trainer's fetch-model, run as a program, lists the paged tree, downloads every file and verifies it."""
    dest = tmp_path / "base_model"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    args = ["fetch-model", "--endpoint", hub.url, "--repo", MODEL, "--revision", REV, "--dest", str(dest)]
    done = subprocess.run(
        [sys.executable, "-m", "trainer", *args, "--progress", str(tmp_path / "progress.json")],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["downloaded_bytes"] == result["bytes_total"] > 0
    assert _same_tree(tiny_model, dest)
    assert json.loads((tmp_path / "progress.json").read_text())["state"] == "done"
    assert any("lfs" in hub.entry(n, d) for n, d in hub.repos[(MODEL, REV)].files.items())


def test_a_second_fetch_moves_no_bytes(hub: FakeHub, tmp_path: Path) -> None:
    """Files already verified (the manifest's sizes and hashes) are not downloaded again."""
    dest = tmp_path / "m"
    assert main_fetch(hub.url, MODEL, REV, dest) == 0
    served = hub.bytes_served
    assert main_fetch(hub.url, MODEL, REV, dest) == 0
    assert hub.bytes_served == served
    assert (dest / FETCH_MANIFEST).is_file()


def test_a_broken_download_resumes_with_a_range_request(hub: FakeHub, tiny_model: Path, tmp_path: Path) -> None:
    """A connection dropped mid-file leaves a partial file; the next run asks for the rest only."""
    dest = tmp_path / "m"
    total = sum(len(d) for d in hub.repos[(MODEL, REV)].files.values())
    hub.break_once_after(5000)
    assert main_fetch(hub.url, MODEL, REV, dest) == EXIT_FETCH_FAILED
    assert main_fetch(hub.url, MODEL, REV, dest) == 0
    assert any(rng.startswith("bytes=") for _, rng in hub.requests)
    assert hub.bytes_served <= total + 16 * 1024  # the broken response's bytes are not sent twice
    assert _same_tree(tiny_model, dest)


def test_a_file_that_does_not_match_its_hash_fails_by_name(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corrupted LFS file fails the fetch with exit 4, naming the file; nothing unverified is left in place."""
    big = max(hub.repos[(MODEL, REV)].files.items(), key=lambda kv: len(kv[1]))[0]
    hub.corrupt(big)
    dest = tmp_path / "m"
    assert main_fetch(hub.url, MODEL, REV, dest) == EXIT_HASH_MISMATCH
    out = capsys.readouterr()
    assert json.loads(out.out.strip().splitlines()[-1])["file"] == big
    assert big in out.err
    assert not (dest / big).exists()


def test_a_revision_that_is_not_pinned_is_refused_in_one_line(
    hub: FakeHub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A branch name instead of a 40-hex commit is bad input: exit 2 and one line naming the fix."""
    assert main_fetch(hub.url, MODEL, "main", tmp_path / "m") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "40-hex" in err[0]


def test_huggingface_hub_reads_the_fakes_tree(hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake's tree answer is what huggingface_hub itself parses (paths, sizes, LFS hashes)."""
    from huggingface_hub import HfApi, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # loopback only: the fake

    from huggingface_hub.hf_api import RepoFile

    entries = list(HfApi(endpoint=hub.url).list_repo_tree(MODEL, revision=REV, recursive=True))
    files = hub.repos[(MODEL, REV)].files
    assert all(isinstance(e, RepoFile) for e in entries)
    assert sorted(e.path for e in entries) == sorted(files)
    assert all(isinstance(e, RepoFile) and e.size == len(files[e.path]) for e in entries)
    assert any(isinstance(e, RepoFile) and e.lfs is not None for e in entries)
