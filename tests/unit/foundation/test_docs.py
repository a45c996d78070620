"""The README and the guides: short enough to read, true to the CLI, and about the product only."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer

from app.cli.main import cli

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    names = [n for n in out.decode().split("\0") if n]
    keep = (".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".cfg", ".ini", ".sh", "Makefile", "Dockerfile")
    return [ROOT / n for n in names if n.endswith(keep) and (ROOT / n).is_file()]


def test_readme_is_at_most_200_lines() -> None:
    """A renter reads the README in two minutes."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


@pytest.mark.parametrize("guide", sorted((ROOT / "docs").glob("*.md")), ids=lambda p: p.name)
def test_each_guide_is_at_most_400_lines(guide: Path) -> None:
    """Each guide answers one reader's question and stays short enough to read through."""
    assert len(guide.read_text(encoding="utf-8").splitlines()) <= 400


def _readme_commands() -> list[str]:
    """Every `tuneharness ...` command line the README names, in code blocks or inline."""
    text = README.read_text(encoding="utf-8")
    found = re.findall(r"`(tuneharness [^`]+)`", text)
    in_block = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block and line.startswith("tuneharness "):
            found.append(re.split(r"\s{2,}|\s#", line)[0])
    return found


# typer may bring its own copy of click, so commands are read by shape, not by class.
def _params(cmd: Any) -> dict[str, Any]:
    return {opt: p for p in cmd.params for opt in getattr(p, "opts", [])}


def _subcommands(cmd: Any) -> dict[str, Any]:
    return dict(getattr(cmd, "commands", {}) or {})


def _check(line: str, root: Any) -> None:
    tokens = [t for t in re.split(r"\s+", line.replace("[", " ").replace("]", " ")) if t][1:]
    path: list[Any] = [root]
    skip_value = False
    for tok in tokens:
        if skip_value:
            skip_value = False
            continue
        if tok in ("|", "..."):
            continue
        name = tok.split("=")[0]
        if name.startswith("-"):
            owner = next((c for c in reversed(path) if name in _params(c)), None)
            assert owner is not None, f"{line!r}: no option {name} on {' '.join(c.name or '' for c in path)}"
            param = _params(owner)[name]
            skip_value = "=" not in tok and not getattr(param, "is_flag", False) and param.nargs != 0
            continue
        if not re.fullmatch(r"[a-z][a-z-]*", tok):
            continue  # a placeholder (JOB, FILE) or a value
        here = path[-1]
        if tok in _subcommands(here):
            path.append(_subcommands(here)[tok])
            continue
        if len(path) > 1 and tok in _subcommands(path[-2]):
            path[-1] = _subcommands(path[-2])[tok]  # an alternative: `ledger show | verify`
            continue
        takes_args = any(p.param_type_name == "argument" for p in here.params)
        assert takes_args, f"{line!r}: {tok!r} is not a command of {here.name!r}"


def test_every_command_and_flag_the_readme_names_exists() -> None:
    """The README's commands are checked against the CLI itself, so a renter's copy-paste works."""
    root = typer.main.get_command(cli)
    lines = _readme_commands()
    assert len(lines) >= 20, lines
    for line in lines:
        _check(line, root)


def test_a_misspelled_command_in_a_doc_would_be_caught() -> None:
    """The checker itself refuses a subcommand or a flag that does not exist."""
    root = typer.main.get_command(cli)
    for bad in ("tuneharness jbos", "tuneharness budget set day --cap 3", "tuneharness ledger shwo"):
        with pytest.raises(AssertionError):
            _check(bad, root)


# How the work went belongs in git, not in the product's text: no "session 12's rules", no
# "issue 7's hedges", no "this session". The real excerpts are quoted text from public threads.
_NUMBER = r"(?:\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen)"
NARRATION = re.compile(
    rf"(?i)(?<![a-z])(?:sessions?|issues?)[ _]?#?{_NUMBER}(?![a-z0-9])|\b(?:this|last|previous) session\b"
)
QUOTED_DATA = ("data/triage/",)


def test_no_text_narrates_how_the_work_went() -> None:
    """Code, comments, docs and test names say what is and what was measured, not the history."""
    me = Path(__file__).resolve()
    hits = []
    for path in _tracked_text_files():
        rel = path.relative_to(ROOT).as_posix()
        if path.resolve() == me or rel.startswith(QUOTED_DATA):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if NARRATION.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:120]}")
    assert not hits, "\n".join(hits[:40])
