"""The specialist's view of a log tail: a short digest of the lines that carry signal.

A MiniLM classifier reads a couple of hundred tokens, not 32 KB. The digest keeps, in log order,
the idle bucket, then (newest first) the last lines that look like errors, warnings or milestones, the last progress
line and the last two lines. The same function builds the training rows and the inference rows,
so the model sees at run time exactly what it was trained on. Pure, stdlib only.
"""

from __future__ import annotations

import re

from app.triage.rules import DEFAULT_STALL_AFTER_S, normalise

__all__ = ["digest", "idle_bucket"]

_SIGNAL = re.compile(
    r"error|exception|fail|killed|kill|\bnan\b|\binf\b|timed? ?out|timeout|memory|xid|ecc|nccl|assert"
    r"|denied|refused|no space|not found|complete|finished|traceback|abort|terminate|signal"
    r"|exit|overflow|scale|warn|retry|unable|cannot|can't|invalid|mismatch|missing|stopped|done",
    re.IGNORECASE,
)
_PROGRESS_HINT = re.compile(r"%\||\bloss\b|\bstep\b|\biter(?:ation)?\b|\bepoch\b", re.IGNORECASE)
_DIGITS = re.compile(r"\d+")
_LINE_CHARS = 140


_EXC = re.compile(
    r"^[\w.]*(?:Error|Exception|Failure|Interrupt)\b:?|\bKilled\b|NVRM|Xid|\bnan\b|oom-kill", re.IGNORECASE
)
_BOILERPLATE = re.compile(
    r"ChildFailedError|error_file:|To enable traceback|Root Cause|^Failures:|NO_OTHER_FAILURES|^=+$|^-+$"
    r"|CUDA_LAUNCH_BLOCKING|might be asynchronously reported|TORCH_USE_CUDA_DSA|CalledProcessError"
    r"|exits with return code = 1|exitcode\s*:\s*1\b|Traceback \(most recent call last\)",
    re.IGNORECASE,
)


def _score(line: str) -> int:
    if _BOILERPLATE.search(line):
        return 0
    if _EXC.search(line):
        return 3
    if _SIGNAL.search(line):
        return 2 if re.search(r"error|fail|timed? ?out|memory|killed", line, re.IGNORECASE) else 1
    return 0


def idle_bucket(idle_seconds: float | None, *, stall_after_s: float = DEFAULT_STALL_AFTER_S) -> str:
    """A coarse, model-friendly idle tag."""
    if idle_seconds is None:
        return "idle unknown"
    if idle_seconds >= stall_after_s:
        return "idle long"
    if idle_seconds >= 120:
        return "idle minutes"
    return "idle fresh"


def digest(log: str, idle_seconds: float | None = None, *, max_chars: int = 700, max_signal_lines: int = 6) -> str:
    """A short text for the specialist: idle tag, signal lines, last progress, last lines."""
    text = normalise(log, max_chars=16384)
    lines = [ln.strip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln and not ln.startswith('File "')]
    scored: list[tuple[int, int]] = []
    seen: set[str] = set()
    for i in range(len(lines) - 1, max(-1, len(lines) - 400), -1):
        ln = lines[i]
        score = _score(ln)
        if score <= 0:
            continue
        shape = _DIGITS.sub("#", ln)[:80]
        if shape in seen:
            continue
        seen.add(shape)
        scored.append((score, i))
    scored.sort(key=lambda t: (-t[0], -t[1]))
    picked: dict[int, str] = {i: lines[i] for _, i in scored[:max_signal_lines]}
    for i in range(len(lines) - 1, max(-1, len(lines) - 60), -1):
        if _PROGRESS_HINT.search(lines[i]):
            picked.setdefault(i, lines[i])
            break
    tail = [i for i in range(len(lines) - 1, max(-1, len(lines) - 40), -1) if not _BOILERPLATE.search(lines[i])]
    for i in tail[:2]:
        picked.setdefault(i, lines[i])
    # Strongest signal first, then the newest context: the model reads a bounded number of
    # tokens and truncates the rest.
    order = [i for _, i in scored[:max_signal_lines]]
    order += [i for i in sorted(picked, reverse=True) if i not in order]
    body = " | ".join(picked[i][:_LINE_CHARS] for i in order)
    out = f"{idle_bucket(idle_seconds)} | {body}" if body else f"{idle_bucket(idle_seconds)} | (empty log)"
    return out[:max_chars]
