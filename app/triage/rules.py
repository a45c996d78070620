"""The rules stage of train.log triage: pure, deterministic, standard library only.

`classify(tail, idle_seconds=...)` reads the last part of a training log and returns a `Verdict`:
one of the eight states with the lines that decided it, or `UNSURE` with a best guess.

How it decides:

1. The tail is bounded (`max_chars`), ANSI escapes and control bytes are removed, carriage-return
   progress-bar redraws become separate lines.
2. Every rule has cheap lowercase *needles*; its regular expression runs only on the lines that
   hold one of them. Finding those lines on a long tail without a Python-speed pass over it: the
   tail is encoded once, and one `bytes.translate` lowercases it, maps every digit to "0" and
   every character that is in no needle to "#" (each line's *skeleton*). A needle in a line is in
   its skeleton, so the needle scan runs once per distinct skeleton (progress lines repeat a few
   shapes with other numbers), remembered across calls; the rules' regexes run once per distinct
   candidate line, also remembered (both memories are bounded). `_classify_reference` is the
   plain whole-text version; a property test holds the two to identical verdicts.
3. Evidence is ranked by **specificity, not position**: `CUDA out of memory` outranks the
   `ChildFailedError` / `CalledProcessError` wrapper tracebacks that launchers print after it;
   a watchdog timeout on another rank ranks below the OOM that caused it.
4. *Soft* evidence (retry warnings, loss-scale reductions, wandb hiccups) only counts when no
   training progress was logged after it. `completed` loses to a fatal error printed after it.
5. With no failure evidence: progress lines mean `progressing`, unless the log has not grown for
   `stall_after_s` seconds, which means `stalled`.

Patterns are written for how failures print in the wild (HF Trainer, accelerate, DeepSpeed,
torchrun/NCCL, bitsandbytes, axolotl, unsloth, LLaMA-Factory, nanoGPT, Megatron, Lightning,
fairseq, the kernel's OOM killer, NVIDIA Xid), not for one template.

Where each part is: the catalogue of patterns in `app.triage.catalogue`; what a rule is and how its
regex is taken apart in `app.triage.compiler`; the needle tables and the per-line search in
`app.triage.matcher`; reading, normalising, the decision and the bytes fast path here.
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from itertools import compress, pairwise
from pathlib import Path

from app.triage.catalogue import _EXIT_SUMMARY_RULE, _LINE_CHECKS, _SUMMARY_RULE, _TRACEBACK_RULE
from app.triage.compiler import _RULES, _lower_same_length, _Rule
from app.triage.matcher import (
    _ALL_NEEDLES,
    _EVIDENCE_CHARS,
    _RULES_WITH_NEEDLE,
    _candidate_lines,
    _first_match,
    _Hit,
    _line_at,
    _trie_pattern,
)

__all__ = [
    "ACTIONS",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_STALL_AFTER_S",
    "DEFAULT_TAIL_BYTES",
    "STATES",
    "UNSURE",
    "Remedy",
    "Verdict",
    "action_for",
    "classify",
    "normalise",
    "read_tail",
    "read_tail_bytes",
    "remedy_for",
]

STATES: tuple[str, ...] = (
    "progressing",
    "completed",
    "oom",
    "diverged",
    "cuda_fault",
    "data_error",
    "io_error",
    "stalled",
)
UNSURE = "unsure"

ACTIONS: dict[str, str] = {
    "progressing": "continue",
    "completed": "collect the adapter",
    "oom": "resume with a smaller micro-batch and more accumulation, same host",
    "diverged": "stop the job, tell the operator (same config won't fix it)",
    "cuda_fault": "replace the host, record it against the machine",
    "data_error": "stop the job, tell the operator (a new host won't fix it)",
    "io_error": "disk: replace host; access denied: stop the job, tell the operator; network: retry on the same host",
    "stalled": "restart the slice on the same host; replace the host if it repeats",
}

DEFAULT_TAIL_BYTES = 32 * 1024
DEFAULT_MAX_CHARS = 32 * 1024
DEFAULT_STALL_AFTER_S = 900.0


_DISK_WORDS = (
    "no space",
    "quota",
    "read-only file system",
    "input/output error",
    "errno 5]",
    "file write failed",
    "stale file handle",
    "unexpected pos",
    "storagefull",
)
# Refused, not failed: a retry gets the same answer and so does another host (a gated model, an
# expired token, a directory the job may not write). Someone has to grant or fix the access.
_ACCESS_WORDS = (
    "permission denied",
    "access denied",
    "accessdenied",
    "errno 13]",
    "unauthorized",
    "forbidden",
    "401 client error",
    "403 client error",
    "gated repo",
    "gatedrepoerror",
    "is restricted",
    "invalid credentials",
    "invalid token",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
)


class Remedy(StrEnum):
    """What the supervisor does about a dead trainer, by the state it died in (the policy's side of
    this table is `app.policy.supervision.Remedy`; a test checks that they agree)."""

    CONTINUE = "continue"  # the log reads healthy: restart the slice
    COLLECT = "collect"  # the log reads finished: restart the slice, it ends at once
    SAME_HOST = "same_host"  # oom, a stall, the network: once more on the same host
    REPLACE_HOST = "replace_host"  # a CUDA fault, a failing disk: another machine
    STOP_JOB = "stop_job"  # diverged, bad data, access refused: a new host will not fix it


_REMEDIES: dict[str, Remedy] = {
    "progressing": Remedy.CONTINUE,
    "completed": Remedy.COLLECT,
    "oom": Remedy.SAME_HOST,
    "diverged": Remedy.STOP_JOB,
    "cuda_fault": Remedy.REPLACE_HOST,
    "data_error": Remedy.STOP_JOB,
    "stalled": Remedy.SAME_HOST,
}


def _io_kind(evidence: tuple[str, ...]) -> str:
    text = " ".join(evidence).lower()
    if any(d in text for d in _DISK_WORDS):
        return "disk"
    if any(a in text for a in _ACCESS_WORDS):
        return "access"
    return "network"


def remedy_for(state: str, evidence: tuple[str, ...] = ()) -> Remedy:
    """The supervisor's remedy for a state (io_error split by its evidence as `action_for` is);
    an unknown state gets another machine."""
    if state == "io_error":
        return {"disk": Remedy.REPLACE_HOST, "access": Remedy.STOP_JOB}.get(_io_kind(evidence), Remedy.SAME_HOST)
    return _REMEDIES.get(state, Remedy.REPLACE_HOST)


def action_for(state: str, evidence: tuple[str, ...] = ()) -> str:
    """The supervisor's default action for a state; io_error is split by its evidence into a full or
    failing disk (another host), access refused (the operator), and the network (retry here)."""
    if state == "io_error":
        kind = _io_kind(evidence)
        if kind == "disk":
            return "replace the host (disk)"
        if kind == "access":
            return "stop the job, tell the operator (access denied: grant it or fix the credentials)"
        return "retry on the same host (network)"
    return ACTIONS.get(state, "tell the operator")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The rules' answer. `state` is one of STATES or UNSURE; `guess` is always one of STATES."""

    state: str
    confidence: float
    evidence: tuple[str, ...]
    rule: str
    guess: str

    @property
    def action(self) -> str:
        return action_for(self.guess if self.state == UNSURE else self.state, self.evidence)

    @property
    def remedy(self) -> Remedy:
        return remedy_for(self.guess if self.state == UNSURE else self.state, self.evidence)

    @property
    def sure(self) -> bool:
        return self.state != UNSURE


# ---------------------------------------------------------------------------------------------
# Reading and normalising


def read_tail(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
    """The last `max_bytes` of a file, decoded leniently; seeks, so a 2 GB log costs one read."""
    return read_tail_bytes(path, max_bytes=max_bytes).decode("utf-8", errors="replace")


def read_tail_bytes(path: str | os.PathLike[str], *, max_bytes: int = DEFAULT_TAIL_BYTES) -> bytes:
    """`read_tail` without the decoding: what `classify` takes as is (it decodes only the lines
    it reads, so a 32 KB tail is not decoded and encoded again)."""
    p = Path(path)
    with p.open("rb") as fh:
        fh.seek(0, os.SEEK_END)
        size = fh.tell()
        start = max(0, size - max_bytes)
        fh.seek(start)
        data = fh.read(max_bytes)
    if start > 0:
        # Drop the partial first line (and any split UTF-8 sequence) unless that is all we have.
        nl = data.find(b"\n")
        if 0 <= nl < len(data) - 1:
            data = data[nl + 1 :]
    return data


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_HAS_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# The same escapes in UTF-8: every class is ASCII, and [^\x07\x1b] consumes a multi-byte character
# byte by byte, so the bytes removed are exactly those of the characters `_ANSI` removes.
_ANSI_BYTES = re.compile(_ANSI.pattern.encode("ascii"))


# torchrun >= 2.2 prefixes every line of a worker's output with "[rankN]: " (older: "[defaultN]:"),
# which would hide line-anchored shapes such as "TypeError: ..." or "Traceback (most recent ...".
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:[ ]?", re.MULTILINE)


def normalise(text: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> str:
    """Bound, strip ANSI/control bytes and torchrun's per-rank line prefixes, and turn
    carriage-return redraws into lines."""
    if len(text) > max_chars:
        text = text[-max_chars:]
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "[rank" in text or "[default" in text:
        text = _RANK_PREFIX.sub("", text)
    return _HAS_CONTROL.sub("", text)


_FATAL_FLOOR = 55  # hits at or above this weight are terminal failures (unless progress followed a soft one)

_GENERIC_WRAPPERS = re.compile(r"ChildFailedError|CalledProcessError|exitcode\s*:\s*1\b")

# An epoch counter and a batch/iteration/step counter, each of its total: "[Epoch 16/30, Batch 4410/7329]".
_EPOCH_AND_BATCH = r"\bepoch\W{0,3}(\d+)\s*/\s*(\d+)\W{1,4}(?:batch|iter(?:ation)?|step)\W{0,3}(\d+)\s*/\s*(\d+)"
_ONMT_STEP = r"\bStep +(\d+)(?:/ *(\d+))?; acc: *[-\d.]+;"
_PROGRESS_ALTERNATIVES = (
    r"\d{1,3}%\|[^|\n]{0,80}\|\s*\d+/\d+ \[",  # tqdm
    r"""[{,]\s*['"](?:loss|train_loss|grad_norm|learning_rate)['"]\s*:\s*['"]?[-+\d.e]+""",  # HF dicts, Paddle
    r"\biter(?:ation)?\s+\d+\s*(?:/\s*\d+)?\s*[:|,]?\s*(?:loss|train loss|lm loss)",  # nanoGPT
    r"\biteration\s+\d+\s*/\s*\d+\s*\|",  # Megatron
    r"\b(?:step|iter)[=:\s]\s*\d+.{0,40}\b(?:loss|lr)\b",  # generic step/iter lines, DeepSpeed, Paddle
    # HiFi-GAN's train.py and the many vocoders built on it: "Steps : 210005, Gen Loss Total : 25.663, ..."
    r"^Steps : \d+, Gen Loss Total : [-+\d.]",
    r"\b(?:epoch|Epoch)\s*[:=]?\s*\d+.{0,60}\bloss\b",
    r"(?:\b|_|(?<=[a-z]))loss\s*[=:]\s*[-+\d.]|(?:\b|_)loss\s+\d+\.\d+",
    r"\bprogress:\s*\d+/\d+",  # mmf and other "progress: N/M" loggers
    r"^\|\s*\d+\s*\|\s*[-+\d.e]+\s*\|",  # unsloth / TRL step table
    r"^\|\s*[\w/ ]{0,30}loss\s*\|\s*[-+]?\d[\d.]*(?:e[-+]?\d+)?\s*\|",  # key/value tables: stable-baselines, rl_games
    r"^\|\s*\S+\s*\|\s*RUNNING\s*\|",  # Ray Tune's trial table
    r"\bepoch:?\s*\d+\s*\|\s*\w+ [-+]?\d+\.\d+\s*\|",  # CenterNet-style epoch lines: `epoch: 6 |tot 4.98 | hm 0.70 |`
    r"saving (?:model )?checkpoint to",
    r"\bepoch\s*\[\s*\d+\s*\]\s*batch\s*\[\s*\d+\s*\]|\[epoch \d+\]\s*\[batch \d+\]",  # MXNet, GluonCV
    # gradient boosting's evaluation lines: XGBoost/LightGBM `[1680]\tcv_agg's l1: 0.59`, `[2]\tvalidation-mlogloss:14.3`,
    # the LightGBM CLI's `Iteration:40, valid_1 auc : 0.81`; Kaldi's `On iteration 221, learning rate is 0.0017`
    r"^\[\d+\]\t[\w@-]+(?:'s [\w@-]+)?\s*:\s*[-+]?\d|\biteration:\d+, \S+ [\w@-]+ : [-+]?\d"
    r"|\biteration \d+, learning rate is\b",
    r"\bStep: \d+\. Time Elapsed: [\d.]+ s",  # Unity ML-Agents' trainer summaries
    _EPOCH_AND_BATCH,
    # darknet's iteration line: "1104: 3.21, 3.54 avg loss, 0.001000 rate, 3.21 seconds, 64 images"
    r"^\s*\d+: [-+\d.e]+, [-+\d.e]+ avg(?: loss)?, [-+\d.e]+ rate, [\d.]+ seconds, \d+ images",
    # OpenNMT-py's report: "Step 1500/100000; acc:  41.23; ppl: 22.10; xent: 3.10; lr: 0.00100; ..." (no "loss")
    _ONMT_STEP,
)
_PROGRESS = re.compile("|".join(_PROGRESS_ALTERNATIVES), re.IGNORECASE)
# The same alternatives one by one (`_is_progress` runs only those whose words a line has).
_PROGRESS_PARTS = tuple(re.compile(a, re.IGNORECASE) for a in _PROGRESS_ALTERNATIVES)
# The same matches as \bgrad[ _]norm...: the word boundary is checked after the literal "grad",
# which `re` then searches for at C speed instead of trying every position.
_GRAD_NORM_VALUE = re.compile(
    r"""grad(?<!\wgrad)[ _]norm['"]?\s*[:=]?\s*['"]?([-+]?(?:nan|inf(?:inity)?|[\d.]+(?:e[-+]?\d+)?))"""
)
_LOSS_VALUE = re.compile(
    r"""loss(?:(?<=['"]loss)['"]\s*:\s*|(?<!\wloss)\s*[=:]?\s*)([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"""
)  # searched in lowercased text. The same values as (?:['"]loss['"]\s*:\s*|\bloss\s*[=:]?\s*)(...), whose
#   matches may start one character earlier (at the quote), but starts with a literal, which `re`
#   searches for at C speed instead of trying every position.


_PROGRESS_MARKERS = (
    "%|",
    "loss",
    "step=",
    "iteration",
    "it/s",
    "s/it",
    "checkpoint to",
    "|",
    "batch [",
    "[batch ",
    "]\t",
    "time elapsed",
    "epoch",
    "images",
    "; acc:",
)
_PROGRESS_TRIES = 40


def _last_progress(text: str, low: str) -> tuple[int, str]:
    """Position and text of the last progress line (-1 when none), searching back from the end."""
    end = len(text)
    for _ in range(_PROGRESS_TRIES):
        pos = max(low.rfind(m, 0, end) for m in _PROGRESS_MARKERS)
        if pos < 0:
            break
        start = text.rfind("\n", 0, pos) + 1
        stop = text.find("\n", pos)
        line = text[start : stop if stop >= 0 else len(text)]
        if _PROGRESS.search(line):
            return start, line.strip()[:_EVIDENCE_CHARS]
        end = start
    return -1, ""


# A bare "step value" log (a script printing `print(step, loss)`): the step, then one number.
_STEP_VALUE_ROW = re.compile(
    r"^[ \t]*(\d+)[ \t]+([-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|[-+]?inf)[ \t]*$", re.MULTILINE
)


def _nan_after_values(window: str) -> int:
    """Where a bare step/value log turned NaN for good: the last two such rows are nan or inf after
    at least three finite ones, with the steps never going back; else -1. (A table that merely
    holds a NaN cell has more columns, or no steps before it.)"""
    end = window[-512:]  # the series' last rows are near the end, or something else decides
    if not any(v in end for v in (" nan\n", "\tnan\n", " inf\n", "\tinf\n")) and not end.endswith(("nan", "inf")):
        return -1  # no row there ends in a NaN (the row scan tries every line start: ~30 us on 4 KB)
    rows = [(int(m.group(1)), m.group(2), m.start()) for m in _STEP_VALUE_ROW.finditer(window)]
    if len(rows) < 5 or any(b[0] < a[0] for a, b in pairwise(rows)):
        return -1
    bad = [v.lstrip("+-") in ("nan", "inf") for _, v, _ in rows]
    if not (bad[-1] and bad[-2]) or sum(1 for b in bad if not b) < 3:
        return -1
    first = len(bad) - 1
    while first > 0 and bad[first - 1]:
        first -= 1
    return rows[first][2]


def _exploding(text: str, window: str) -> tuple[str, str] | None:
    """(rule, evidence) for an exploding loss or gradient norm, or a loss collapsed to exactly 0.0, or None.

    `window` is the last 4,096 characters of `text` (the tail, or an end of it that begins at a
    line start), lowercased (its ASCII letters, at least: see `_tail_of`).
    """
    if "nan" in window:
        nan_row = _nan_after_values(window)
        if nan_row >= 0:
            return "loss-column-nan", _line_at(text, len(text) - len(window) + nan_row)
    found = _LOSS_VALUE.findall(window)  # every match is a number float() reads (\d: any script)
    if len(found) < 3:
        return _grad_norm_exploding(text, window)
    values = list(map(float, found[-50:]))
    last, floor = values[-1], min(values)
    if last >= 1e3 and last >= 20 * max(floor, 1e-3):
        name = "loss-exploding"
    elif len(values) >= 4 and values[-1] == 0.0 and values[-2] == 0.0 and max(values[:-2]) > 0.05:
        name = "loss-zero"  # fp16 runs whose loss collapses to exactly 0.0 (NaN logged as 0): suspicious, not proof
    else:
        return _grad_norm_exploding(text, window)
    # The last value's line: matches start at a "loss" and cannot overlap, so the last match is the
    # one at the last "loss" where the pattern matches.
    at = window.rfind("loss")
    while (m := _LOSS_VALUE.match(window, at)) is None:
        at = window.rfind("loss", 0, at)
    return name, _line_at(text, len(text) - len(window) + m.start())


_GRAD_NORM_BLOWN = 1e10  # no healthy run logs a gradient norm this large
_GRAD_NORM_HIGH = 1e4


def _grad_norm_exploding(text: str, window: str) -> tuple[str, str] | None:
    """("grad-norm-exploding", evidence) when the logged gradient norm has blown up, or None: its
    last value at 1e10 or more, or its last three values each at least 1e4 and a hundredfold the
    least value in the window (sustained, not one spike). `window` as in `_exploding`."""
    if "grad" not in window:
        return None
    read: list[tuple[float, int]] = []  # (value, where)
    for m in _GRAD_NORM_VALUE.finditer(window):
        if m.group(1)[:1].isdigit():  # (nan and inf are the nan-grad-norm rule's)
            try:
                read.append((float(m.group(1)), m.start()))
            except ValueError:  # "1.2.3"
                continue
    values = [v for v, _ in read[-50:]]
    if len(values) < 3:
        return None
    high = max(_GRAD_NORM_HIGH, 100 * max(min(values), 1e-3))
    if values[-1] < _GRAD_NORM_BLOWN and not all(v >= high for v in values[-3:]):
        return None
    return "grad-norm-exploding", _line_at(text, len(text) - len(window) + read[-1][1])


# "Epoch 10/10" (Keras, most hand-written loops), "Train epoch [1/1]", "epoch: 3/3": the counter
# with the run's epoch count in it. A full bar after the LAST such counter, when it is at its count,
# is the last epoch finished: the run's training loop is over. Both searches start from a literal
# (`re` finds it at C speed; a pattern that starts with \b or \d is tried at every position).
_EPOCH_OF = re.compile(r"epoch(?<=\bepoch)\s*[:\[]?\s*(\d+)\s*/\s*(\d+)\b")
_KERAS_COUNT = re.compile(r"(\d+)/(\d+) $")  # the "1875/1875 " before a Keras bar
# Keras 3's progress line: "1875/1875 ━━━━━━━━━━━━━━━━━━━━ 5s 3ms/step - loss: ...", its count and bar
# in bold and green ("[1m1875/1875[0m [32m━━━━...", as posted without the ESC). Its bar is the same
# glyph done or not (only the colour differs), so the count alone says the epoch's last step.
_KERAS3_COUNT = re.compile(r"^[ \t]*(?:\[1m)?(\d+)/(\d+)(?:\[0m)? (?:\[32m)?\u2501", re.MULTILINE)


def _final_epoch_done(text: str, window: str) -> tuple[str, ...] | None:
    """Evidence that the last epoch ran to its end (its counter at the epoch count, a full bar
    after it: tqdm's `100%|`, or Keras' `k/k [=====]`), or None. `window` as in `_exploding`."""
    if "epoch" not in window:
        return None
    last = None
    for last in _EPOCH_OF.finditer(window):  # noqa: B007  (the last match is wanted)
        pass
    if last is None or last.group(1) != last.group(2) or int(last.group(1)) < 1:
        return None
    at = window.rfind("100%|", last.start())
    if at < 0 and "\u2501" in window:
        keras3 = None
        for keras3 in _KERAS3_COUNT.finditer(window, last.end()):  # noqa: B007  (the last match is wanted)
            pass
        if keras3 is not None and keras3.group(1) == keras3.group(2):
            at = keras3.start()
    if at < 0:
        end = window.rfind("=]", last.start())  # only a full Keras bar has no ">" or "." before its "]"
        start = window.rfind("[", last.start(), end) if end >= 0 else -1
        count = _KERAS_COUNT.search(window, max(last.start(), start - 24), start) if start >= 0 else None
        if count is None or count.group(1) != count.group(2) or "\n" in window[start:end]:
            return None
        at = count.start()
    base = len(text) - len(window)
    return tuple(dict.fromkeys([_line_at(text, base + last.start()), _line_at(text, base + at)]))


_EPOCH_BATCH = _PROGRESS_PARTS[_PROGRESS_ALTERNATIVES.index(_EPOCH_AND_BATCH)]  # the progress part, compiled once
_ONMT_STEP_PART = _PROGRESS_PARTS[_PROGRESS_ALTERNATIVES.index(_ONMT_STEP)]


# The run's step counter at its total, in the key-value logs of LLaMA-Factory (trainer_log.jsonl and
# its console: "current_steps": 3235, "total_steps": 3235) and ms-swift ('global_step/max_steps': '3235/3235').
_STEPS_OF_TOTAL = re.compile(
    r"""current_steps["']: *(\d+), *["']total_steps["']: *(\d+)"""
    r"""|global_step/max_steps["']: *["'](\d+)/(\d+)["']"""
)


def _final_steps_done(line: str) -> tuple[str, ...] | None:
    """(line,) when it holds the run's step counter at its total (`_STEPS_OF_TOTAL`), else None."""
    if "total_steps" not in line and "max_steps" not in line:
        return None
    m = _STEPS_OF_TOTAL.search(line)
    if m is None:
        return None
    done, total = (int(g) for g in m.groups() if g is not None)
    return (line.strip()[:_EVIDENCE_CHARS],) if total >= 1 and done == total else None


# A tqdm bar over the run's steps, at its total: diffusers' and kohya's training scripts name it
# "Steps"/"steps" (their other bars count one epoch's batches); a bar whose own line logs "Step N" at
# the bar's N counts steps too (starVLA's accelerate loop).
_FULL_BAR = re.compile(r"(?:(?<![\w-])(steps) *: *)?100%\|[^|\n]*\| *(\d+)/(\d+) \[", re.IGNORECASE)
_STEP_N = re.compile(r"\bstep[ :=]+(\d+)\b", re.IGNORECASE)


def _final_onmt_step(line: str) -> tuple[str, ...] | None:
    """(line,) when it is OpenNMT-py's report at its last step ("Step 100000/100000; acc: ..."): its
    trainer stops at train_steps, and the report of that step is the last it prints."""
    m = _ONMT_STEP_PART.search(line) if "; acc:" in line else None
    if m is None or m.group(2) is None:
        return None
    return (line.strip()[:_EVIDENCE_CHARS],) if int(m.group(1)) == int(m.group(2)) >= 1 else None


# OpenMMLab's iteration-based runs log the train iteration over max_iters: mmengine's LogProcessor
# "Iter(train) [80000/80000]  base_lr: ..." (the count right-justified: "[  50/80000]"), mmcv 1.x's
# TextLoggerHook "Iter [80000/80000]\tlr: ...". The runner stops at max_iters, so the report of that
# iteration is the run's last (a validation and a checkpoint may follow it).
_MM_ITER = re.compile(r"\bIter(?:\(train\))? \[ *(\d+)/(\d+)\]")


def _final_mm_iter(line: str) -> tuple[str, ...] | None:
    """(line,) when it is an OpenMMLab train iteration report at max_iters (`_MM_ITER`), else None."""
    m = _MM_ITER.search(line) if "Iter" in line else None
    if m is None:
        return None
    return (line.strip()[:_EVIDENCE_CHARS],) if int(m.group(1)) == int(m.group(2)) >= 1 else None


def _final_step_bar(line: str) -> tuple[str, ...] | None:
    """(line,) when it holds a full bar over the run's steps (`_FULL_BAR`), else None."""
    if "100%|" not in line:
        return None
    m = _FULL_BAR.search(line)
    if m is None or m.group(2) != m.group(3) or int(m.group(2)) < 1:
        return None
    if m.group(1) is not None:  # the bar is named for the run's steps
        return (line,)
    step = _STEP_N.search(line, m.end())
    return (line,) if step is not None and step.group(1) == m.group(2) else None


# TF Estimator scripts (BERT's run_classifier/run_squad and their many forks) evaluate after training
# and write the result one sorted `key = value` line each, global_step among them: "eval_accuracy =
# 0.91", "eval_loss = 0.27", "global_step = 78750", "loss = 0.27" (after "***** Eval results *****").
_KEY_VALUE_LINE = re.compile(r"^[ \t]*(?:INFO:tensorflow:[ \t]*)?([A-Za-z_][\w./-]*) = \S+[ \t]*$")


def _final_eval_block(text: str) -> tuple[str, ...] | None:
    """Evidence that the log ends in such an evaluation write-out (its last three or more non-empty
    lines are `key = value`, an `eval_` key and `global_step` among them), or None."""
    keys: list[str] = []
    lines: list[str] = []
    for line in reversed(text[-2048:].splitlines()):
        if not line.strip():
            continue
        m = _KEY_VALUE_LINE.match(line)
        if m is None:
            break
        keys.append(m.group(1))
        lines.append(line.strip())
    if len(keys) >= 3 and "global_step" in keys and any(k.startswith("eval_") for k in keys):
        return tuple(reversed(lines))[:3]
    return None


def _final_batch_done(line: str) -> tuple[str, ...] | None:
    """Evidence that the last progress line is the last batch of the last epoch, or None: the epoch
    counter at its total (counted from 1) and the batch counter at its total or one short (counted
    from 0, as llama-recipes' "Training Epoch: 3/3, step 49/50" is). An epoch counter one short is
    not read as counted from 0: llama-recipes' "Epoch: 2/3, step 49/50" is the end of epoch 2 of 3."""
    m = _EPOCH_BATCH.search(line)
    if m is None:
        return None
    epoch, epochs, batch, batches = map(int, m.groups())
    if epochs >= 1 and batches >= 1 and epoch == epochs and batch in (batches, batches - 1):
        return (line,)
    return None


# An OS-level error raised while a checkpoint was being saved: a failed checkpoint write, whatever the
# exception's own line says (it may be cut: `FileExistsError: [Errno 17] File e`). Shared and network
# filesystems raise these from `os.makedirs(..., exist_ok=True)` and renames under a save. Read from the
# traceback's frames: one in a function whose name says it saves, and a checkpoint named in them.
_OS_ERROR_LINE = re.compile(
    r"^(?:FileExistsError|FileNotFoundError|IsADirectoryError|NotADirectoryError|OSError): "
    r"[^\n]*",
    re.M,
)
_SAVING_FRAME = re.compile(r'^[ \t]*File "[^"\n]*", line \d+, in \w*sav(?:e|ing)\w*[ \t]*$', re.M)


def _os_error_while_saving(text: str) -> tuple[str, ...] | None:
    """Evidence (the exception's line, the saving frame) when `text`'s last OS-level exception line
    ends a traceback whose frames (the indented lines right above it) pass through a checkpoint save;
    else None."""
    if "sav" not in text:
        return None
    errors = list(_OS_ERROR_LINE.finditer(text))
    if not errors:
        return None
    last = errors[-1]
    # The traceback's body: the indented lines right above the exception (the excerpt may begin inside it).
    lines = text[: last.start()].splitlines()
    body = len(lines)
    while body > 0 and lines[body - 1][:1] in (" ", "\t"):
        body -= 1
    frames = "\n".join(lines[body:])
    saving = _SAVING_FRAME.search(frames)
    if saving is None:
        return None
    low = frames.lower()
    if "checkpoint" not in low and "ckpt" not in low:
        return None
    return (last.group(0).strip()[:_EVIDENCE_CHARS], saving.group(0).strip()[:_EVIDENCE_CHARS])


# A tqdm bar that ended at zero: no total ("0it [00:00, ?it/s]") or an empty one ("0/0"). One such bar
# may be a first draw that the next redraw replaces (a carriage return made a line of each draw); two
# or more left as they were after the last real progress, epoch after epoch, are epochs that ran no
# batch: an empty dataset (every sample filtered out, a wrong path that globbed nothing).
_ZERO_BAR = re.compile(
    r"[ \t]*(?:[^|\n]{0,40}: *)?(?:0it \[00:00, \?it/s\]|0%\|[ \t]*\| 0/0 \[00:00<\?, \?it/s\])"
    r"[ \t]*$"
)
_BAR_DRAW = re.compile(r"[ \t]*(?:[^|\n]{0,40}: *)?(?:\d+it \[|\d{1,3}%\|)")


def _empty_epochs(text: str) -> tuple[str, ...] | None:
    """Evidence of epochs that ran no batch: two or more bars left at zero (each not redrawn by the
    line after it) after the last other progress line of `text`; else None."""
    if "0it [00:00" not in text and "| 0/0 [" not in text:
        return None
    zeros: list[str] = []
    after = ""  # the next non-empty line
    for line in reversed(text.splitlines()):
        if not line.strip():
            continue
        if _ZERO_BAR.match(line):
            if not _BAR_DRAW.match(after):
                zeros.append(line.strip())
        elif _is_progress(line):
            break
        after = line
    return tuple(reversed(zeros))[-2:] if len(zeros) >= 2 else None


_LAZY_MAX_WEIGHT = max(r.weight for r in _RULES if r.lazy)


def _decided(hits: list[_Hit], progress_pos: int) -> bool:
    """Whether a specific rule already decides, so that no lazy (generic) rule could change the answer.

    True when a live terminal hit outranks every lazy rule and no `completed` evidence follows it
    (a lazy hit can neither outrank it nor be a later fatal error after a completion it beats).
    """
    live = [h for h in hits if not (h.rule.soft and progress_pos > h.pos)]
    top = [h for h in live if h.rule.state != "completed" and h.rule.weight > _LAZY_MAX_WEIGHT]
    if not top:
        return False
    last_top = max(h.pos for h in top)
    return not any(h.rule.state == "completed" for h in live) and last_top >= 0


def _guess(*, idle: float | None, stall_after_s: float) -> str:
    if idle is not None and idle >= stall_after_s:
        return "stalled"
    return "progressing"


def _decide(
    hits: list[_Hit],
    lazy_hits: Callable[[], list[_Hit]],
    *,
    progress_pos: int,
    progress_line: str,
    text: Callable[[], str],
    tail: Callable[[int], tuple[str, str]],
    idle: float | None,
    stall_after_s: float,
) -> Verdict:
    """The verdict from the hits of the specific rules (`lazy_hits` gives the generic ones, called
    only when the specific ones do not decide), the last progress line, and the normalised tail.

    Positions (`_Hit.pos`, `progress_pos`) are only compared with each other, so any index space
    that keeps the order of the tail's characters will do. `text()` is the normalised tail;
    `tail(n)` is (an end of it that starts at a line start and holds the last n characters, those
    n characters lowercased).
    """
    idle_evidence = f"log idle for {idle:.0f}s (stall threshold {stall_after_s:.0f}s)" if idle is not None else ""
    if not _decided(hits, progress_pos):
        hits = hits + lazy_hits()
    if any(h.rule.name == "nan-grad-norm" for h in hits):
        # fp16 runs log an occasional inf grad norm on a skipped step: only the last value counts.
        values = _GRAD_NORM_VALUE.findall(tail(8192)[1])
        if values and values[-1].lstrip("+-")[:1].isdigit():
            hits = [h for h in hits if h.rule.name != "nan-grad-norm"]
    live = [h for h in hits if not (h.rule.soft and progress_pos > h.pos)]
    fatal = [h for h in live if h.rule.state != "completed" and h.rule.weight >= _FATAL_FLOOR]
    done = [
        h
        for h in live
        if h.rule.state == "completed"
        and not (h.rule.name == _SUMMARY_RULE and any(f.pos < h.pos for f in fatal))
        and not (h.rule.name == _EXIT_SUMMARY_RULE and any(f.pos < h.pos for f in live if f.rule.state != "completed"))
    ]

    def verdict(best: _Hit, confidence: float | None = None) -> Verdict:
        others = sorted(
            (h for h in live if h is not best and h.rule.state == best.rule.state and h.line != best.line),
            key=lambda h: -h.rule.weight,
        )
        evidence = tuple(dict.fromkeys([best.line, *[h.line for h in others]]))[:3]
        return Verdict(best.rule.state, confidence or best.rule.confidence, evidence, best.rule.name, best.rule.state)

    if done:
        last_done = max(done, key=lambda h: h.pos)
        # A failure after the completion, or on its very line: a closing summary that reports a NaN
        # loss (`TrainOutput(global_step=1276, training_loss=nan, metrics={'train_runtime': ...`).
        later_fatal = [h for h in fatal if h.pos > last_done.pos or h.line_start == last_done.line_start]
        if not later_fatal:
            return verdict(last_done)
        fatal = later_fatal
    if fatal:
        best = max(fatal, key=lambda h: (h.rule.weight, h.pos))
        return verdict(best)

    end = tail(4096)  # read several times below: decoded and lowercased once
    # (an exception's line is a `traceback-any` hit: only then can the last one be an OS error)
    saving = _os_error_while_saving(end[0]) if any(h.rule.name == _TRACEBACK_RULE for h in hits) else None
    if saving is not None:
        return Verdict("io_error", 0.8, saving, "os-error-while-saving", "io_error")
    boom = _exploding(*end)
    if boom is not None:
        name, line = boom
        return Verdict("diverged", 0.6 if name == "loss-zero" else 0.8, (line,), name, "diverged")

    guess = _guess(idle=idle, stall_after_s=stall_after_s)
    weak = [h for h in live if h.rule.state != "completed"]
    if weak:
        best = max(weak, key=lambda h: (h.rule.weight, h.pos))
        if best.rule.soft or best.rule.confidence < 0.6:
            # A soft warning with nothing after it, or a bare Python exception: not sure.
            return Verdict(UNSURE, best.rule.confidence, (best.line,), best.rule.name, best.rule.state)
        return verdict(best)

    empty = _empty_epochs(end[0])
    if empty is not None:
        return Verdict("data_error", 0.7, empty, "empty-epochs", "data_error")
    if progress_pos >= 0:
        if guess == "stalled":
            return Verdict("stalled", 0.9, (idle_evidence, progress_line), "idle-after-progress", "stalled")
        # The step counter is read on the last progress line and on the last line: LLaMA-Factory's
        # last trainer_log entry has "loss": null, so it is no progress line, but it holds the count.
        final = (
            _final_epoch_done(*end)
            or _final_batch_done(progress_line)
            or _final_steps_done(progress_line)
            or _final_steps_done(end[0][end[0].rstrip().rfind("\n") + 1 :])
            or _final_step_bar(progress_line)
            or _final_onmt_step(progress_line)
            or _final_mm_iter(progress_line)
            or _final_eval_block(end[0])
        )
        if final is not None:
            return Verdict("completed", 0.8, final, "final-epoch-done", "completed")
        return Verdict("progressing", 0.9 if idle is not None else 0.85, (progress_line,), "progress", "progressing")
    if guess == "stalled":
        return Verdict("stalled", 0.8, (idle_evidence,), "idle", "stalled")
    last = next((ln.strip() for ln in reversed(text().splitlines()) if ln.strip()), "")
    return Verdict(UNSURE, 0.0, (last[:_EVIDENCE_CHARS],) if last else (), "no-evidence", guess)


def _idle(idle_seconds: float | None) -> float | None:
    return idle_seconds if idle_seconds is not None and idle_seconds == idle_seconds else None


def _classify_reference(
    tail: str,
    *,
    idle_seconds: float | None = None,
    stall_after_s: float = DEFAULT_STALL_AFTER_S,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> Verdict:
    """`classify` the straightforward way: normalise and lowercase the whole tail, one needle scan
    over all of it. The fast path must agree with this exactly (a property test checks it); it is
    also the path for input the fast one does not take (lone surrogates, the Kelvin sign)."""
    text = normalise(tail, max_chars=max_chars)
    low = _lower_same_length(text)
    progress_pos, progress_line = _last_progress(text, low)
    cands = sorted(_candidate_lines(low).items())

    def search(lazy: bool) -> list[_Hit]:
        found: list[_Hit] = []
        for idx, spans in cands:
            if _RULES[idx].lazy is lazy:
                m = _first_match(_RULES[idx], low, spans)
                if m is not None:
                    found.append(
                        _Hit(_RULES[idx], m.start(), _line_at(text, m.start()), text.rfind("\n", 0, m.start()) + 1)
                    )
        return found

    return _decide(
        search(False),
        lambda: search(True),
        progress_pos=progress_pos,
        progress_line=progress_line,
        text=lambda: text,
        tail=lambda n: (text, low[-n:]),
        idle=_idle(idle_seconds),
        stall_after_s=stall_after_s,
    )


# ---------------------------------------------------------------------------------------------
# The fast path: the same verdict as `_classify_reference`, without a Python-speed pass over the
# whole tail. Long tails are mostly healthy progress lines that hold no needle, and the same few
# line shapes repeat with other numbers. So the tail is encoded once and handled as bytes, where
# lowercasing and mapping are C loops at GB/s: every digit becomes "0" and every character that is
# in no needle becomes "#" (the line's *skeleton*). A needle in a line is in its skeleton (with
# its digits mapped), so the needle scan runs once per DISTINCT skeleton (remembered across calls,
# bounded), and the rules' regexes run only on the lines whose skeleton holds a needle, each
# decoded back to text (and remembered per distinct line). Needles without digits are in a line
# exactly when they are in its skeleton; the few with digits are checked in the line itself.

_SKELETON_KEEP = frozenset(ord(c) for n in (*_ALL_NEEDLES, *_PROGRESS_MARKERS) for c in n if not c.isdigit())
_CONTROL_BYTES = bytes([*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F])


def _skeleton_byte(b: int) -> int:
    if b in _CONTROL_BYTES:
        return 0x00  # marks a tail that still has control bytes to drop
    low = bytes([b]).lower()[0]
    if b == 0x0A or low in _SKELETON_KEEP:
        return low
    return 0x30 if 0x30 <= b <= 0x39 else 0x23  # every digit "0", every other character "#"


_SKELETON = bytes(_skeleton_byte(b) for b in range(256))
assert 0x23 not in _SKELETON_KEEP and 0x30 not in _SKELETON_KEEP


def _skeleton_of(needle: str) -> bytes:
    return needle.encode("ascii").translate(_SKELETON)


_SK_NEEDLES: tuple[bytes, ...] = tuple(dict.fromkeys(_skeleton_of(n) for n in _ALL_NEEDLES))
_SK_TRIE = tuple(n for n in _SK_NEEDLES if n[:1].isalpha())
_SK_FIND = tuple(n for n in _SK_NEEDLES if not n[:1].isalpha())
_SK_SCAN = re.compile(_trie_pattern(tuple(n.decode("ascii") for n in _SK_TRIE)).encode("ascii"))
# A greedy scan match `f` means: every needle inside f is present; a needle that starts inside f
# and runs past its end is the longest needle an anchored scan finds at that offset, or a prefix
# of it. (The scan resumes at f's end and finds the needles that start there or later.)
_SK_NEEDLE_SET = frozenset(_SK_NEEDLES)
_SK_WITHIN: dict[bytes, frozenset[bytes]] = {
    f: frozenset(f[a:b] for a in range(len(f)) for b in range(a + 1, len(f) + 1) if f[a:b] in _SK_NEEDLE_SET)
    for f in _SK_TRIE
}
_SK_PREFIXES: dict[bytes, frozenset[bytes]] = {
    f: frozenset(f[:j] for j in range(1, len(f) + 1) if f[:j] in _SK_NEEDLE_SET) for f in _SK_TRIE
}
_SK_PROPER_PREFIXES = frozenset(n[:j] for n in _SK_TRIE for j in range(1, len(n)))  # of trie needles
_SK_STRADDLE: dict[bytes, tuple[int, ...]] = {
    f: tuple(k for k in range(1, len(f)) if f[k:] in _SK_PROPER_PREFIXES) for f in _SK_TRIE
}
# Per skeleton needle: the rules it decides by itself (needles without digits), and the needles
# with digits behind it, each to be checked in the line.
# (A needle whose digits are all "0" is its own skeleton, but "1 valid" has that skeleton too: any
# digit puts a needle among those checked in the line.)
_NEEDLES_OF_SKELETON: dict[bytes, list[str]] = {}
for _n in _ALL_NEEDLES:
    _NEEDLES_OF_SKELETON.setdefault(_skeleton_of(_n), []).append(_n)
del _n
_SK_EXACT: dict[bytes, frozenset[int]] = {
    s: frozenset(i for n in _NEEDLES_OF_SKELETON[s] if not any(c.isdigit() for c in n) for i in _RULES_WITH_NEEDLE[n])
    for s in _SK_NEEDLES
}
_SK_DIGITS: dict[bytes, tuple[tuple[bytes, tuple[int, ...]], ...]] = {
    s: tuple((n.encode("ascii"), _RULES_WITH_NEEDLE[n]) for n in _NEEDLES_OF_SKELETON[s] if any(c.isdigit() for c in n))
    for s in _SK_NEEDLES
}

# A skeleton's profile: () when it holds no needle, else (rules, needles with digits to check,
# whether the line may begin with torchrun's rank prefix); `_RANKED` for such a line without needles.
_Profile = tuple[()] | tuple[frozenset[int], tuple[tuple[bytes, tuple[int, ...]], ...], bool]
_RANKED: _Profile = (frozenset(), (), True)
_RANKED_SKELETON = re.compile(rb"\[(?:rank|default)[0#]+\]:")  # `_RANK_PREFIX` as seen in a skeleton
_PROFILES: dict[bytes, _Profile] = {}
_PROFILES_MAX = 20_000  # distinct skeletons remembered ...
_PROFILES_MAX_BYTES = 4 << 20  # ... and their bytes (one long line must not fill it); then start afresh
_PROFILES_BYTES = [0]
# Encoded line -> (rule index, byte offset of its first match in the line) for every specific
# (lazy) rule that matches the line. Lines repeat verbatim (warnings, banners, a log written
# twice), so each rule's regex runs once per distinct line.
_SPECIFIC_MATCHES: dict[bytes, tuple[tuple[int, int], ...]] = {}
_LAZY_MATCHES: dict[bytes, tuple[tuple[int, int], ...]] = {}
# Skeleton -> whether it holds a progress marker (`_last_progress_lines`), filled and emptied with _PROFILES.
_MARKED: dict[bytes, bool] = {}
_LINE_MATCHES_MAX = 20_000  # lines of at most _MEMO_LINE_BYTES: 20 MB at the very most
_MEMO_LINE_BYTES = 1_000  # longer lines are not remembered


class _MemoryEmptied(Exception):
    """Another thread emptied the shared skeleton memory while this call was filling it."""


def _forget() -> None:
    """Empty the fast path's memories (benchmarks of cold tails, tests)."""
    _PROFILES.clear()
    _MARKED.clear()
    _PROFILES_BYTES[0] = 0
    _SPECIFIC_MATCHES.clear()
    _LAZY_MATCHES.clear()


def _learn(skeletons: list[bytes], profiles: dict[bytes, _Profile]) -> None:
    """Profile new skeleton lines: ONE scan over all of them finds every skeleton needle in each
    (exact, as in `_candidate_lines`), then the needles give the rules."""
    joined = b"\n".join(skeletons)
    starts: list[int] = []
    at = 0
    for sk in skeletons:
        starts.append(at)
        at += len(sk) + 1
    found: dict[int, set[bytes]] = {}
    for m in _SK_SCAN.finditer(joined):
        f = m.group(0)
        here = found.setdefault(bisect_right(starts, m.start()) - 1, set())
        here |= _SK_WITHIN[f]
        for k in _SK_STRADDLE[f]:
            inner = _SK_SCAN.match(joined, m.start() + k)
            if inner is not None:
                here |= _SK_PREFIXES[inner.group(0)]
    for needle in _SK_FIND:
        pos = joined.find(needle)
        while pos >= 0:
            found.setdefault(bisect_right(starts, pos) - 1, set()).add(needle)
            pos = joined.find(needle, pos + 1)
    with_marker: set[int] = set()
    for marker in _PROGRESS_MARKERS_B:  # the lines that hold a progress marker: one find per such line
        pos = joined.find(marker)
        while pos >= 0:
            i = bisect_right(starts, pos) - 1
            with_marker.add(i)
            pos = joined.find(marker, starts[i + 1]) if i + 1 < len(starts) else -1
    marked = _MARKED
    for i, sk in enumerate(skeletons):
        marked[sk] = i in with_marker
        ranked = _RANKED_SKELETON.match(sk) is not None
        needles = found.get(i)
        if not needles:
            profiles[sk] = _RANKED if ranked else ()
            continue
        exact = frozenset(r for n in needles for r in _SK_EXACT[n])
        digits = tuple(d for n in sorted(needles) for d in _SK_DIGITS[n])
        profiles[sk] = (exact, digits, ranked)


def _first_in_line(rule: _Rule, line_low: str) -> int:
    """Offset of a rule's first match in one lowercased line, or -1 (`_first_match` on one line)."""
    if rule.check is not None:
        line_ok = _LINE_CHECKS.get(rule.check)
        if line_ok is not None and not line_ok(line_low):
            return -1
    if rule.parts is not None and (rule.check is None or rule.check in _LINE_CHECKS):
        # (a line check passed above holds for every match on the line)
        first = -1
        for literals, alt in rule.parts:
            if literals is not None:
                for literal in literals:
                    if literal in line_low:
                        break
                else:
                    continue
            m = alt.search(line_low)
            if m is not None and (first < 0 or m.start() < first):
                first = m.start()
        return first
    for m in rule.pattern.finditer(line_low):
        if rule.check is None or rule.check(m):
            return m.start()
    return -1


def _line_matches(line: bytes, profile: _Profile, lazy: bool) -> tuple[tuple[int, int], ...]:
    """(rule index, byte offset) of the first match of every rule (lazy or not) that one encoded
    candidate line holds a needle of and that matches it. A match never spans lines, and every
    pattern reads the same on a line alone as inside the tail (`^` and lookbehinds at a line
    start see a newline there), so searching the line alone is searching the tail's span."""
    exact, digits, _ = profile  # type: ignore[misc]  # candidate lines have non-empty profiles
    idxs: frozenset[int] | set[int] = exact
    if digits:
        low_line = line.lower()
        idxs = exact | {r for needle, rs in digits if needle in low_line for r in rs}
    text = line.decode("utf-8")
    low = _lower_same_length(text)
    out: list[tuple[int, int]] = []
    for idx in sorted(idxs):
        if _RULES[idx].lazy is lazy:
            k = _first_in_line(_RULES[idx], low)
            if k >= 0:
                out.append((idx, k if k == 0 or text.isascii() else len(text[:k].encode("utf-8"))))
    return tuple(out)


# torchrun's rank prefix at the start of a line, written so that `re` can search for its literal
# start instead of trying every position (the same substitution as `_RANK_PREFIX`).
_CRLF = re.compile(rb"\r\n")
_RANK_PREFIX_AFTER_NL = re.compile(r"\n\[(?:rank|default)\d+\]:[ ]?")
_RANK_PREFIX_AT_START = re.compile(r"\[(?:rank|default)\d+\]:[ ]?")
# "%|" is left out: where it is, "|" is one character later, so it is never the last marker.
_PROGRESS_MARKERS_B = tuple(m.encode("ascii") for m in _PROGRESS_MARKERS if m != "%|")


# The only characters that match an ASCII letter case-insensitively without being one (and that
# str.lower() does not turn into it): with none of them, a literal in a match is in line.lower().
_FOLDS_TO_ASCII = ("\u0130", "\u0131", "\u017f", "\u212a")


def _is_progress(line: str) -> bool:
    """`_PROGRESS.search(line) is not None`, running only the alternatives whose words the line has
    (a search of an alternation finds a match exactly when one of its alternatives does)."""
    if not line.isascii() and any(c in line for c in _FOLDS_TO_ASCII):
        return _PROGRESS.search(line) is not None
    low = line.lower()
    loss = "loss" in low
    (
        tqdm,
        hf,
        nano,
        megatron,
        step,
        hifigan,
        epoch,
        bare_loss,
        progress,
        table,
        kv_table,
        tune_table,
        epoch_table,
        saving,
        mxnet,
        boosting,
        mlagents,
        counters,
        darknet,
        onmt,
    ) = _PROGRESS_PARTS
    return bool(
        ("%|" in low and tqdm.search(line))
        or ((loss or "grad_norm" in low or "learning_rate" in low) and hf.search(line))
        or (loss and "iter" in low and nano.search(line))
        or ("iteration" in low and megatron.search(line))
        or (("step" in low or "iter" in low) and (loss or "lr" in low) and step.search(line))
        or ("gen loss total" in low and hifigan.search(line))
        or (loss and "epoch" in low and epoch.search(line))
        or (loss and bare_loss.search(line))
        or ("progress:" in low and progress.search(line))
        or (low.startswith("|") and table.search(line))
        or (loss and low.startswith("|") and kv_table.search(line))
        or ("running" in low and low.startswith("|") and tune_table.search(line))
        or ("epoch" in low and "|" in low and epoch_table.search(line))
        or ("checkpoint to" in low and saving.search(line))
        or ("batch" in low and "epoch" in low and mxnet.search(line))
        or (("]\t" in low or "iteration" in low) and boosting.search(line))
        or ("time elapsed" in low and mlagents.search(line))
        or ("epoch" in low and counters.search(line))
        or ("images" in low and darknet.search(line))
        or ("; acc:" in low and onmt.search(line))
    )


def _last_progress_lines(raw: bytes, skeletons: list[bytes]) -> tuple[int, str]:
    """`_last_progress` on the encoded tail (positions are byte offsets), walking back over its
    lines' skeletons (`raw` split at the same places): only the lines whose skeleton holds a
    progress marker are decoded and read, the last `_PROGRESS_TRIES` of them at most."""
    marked = _MARKED
    end = len(raw)
    tries = 0
    for sk in reversed(skeletons):
        start = end - len(sk)
        has = marked.get(sk)
        if has is None:  # another thread emptied the memory meanwhile
            has = any(map(sk.__contains__, _PROGRESS_MARKERS_B))
        if has:
            line = raw[start:end].decode("utf-8")
            if _is_progress(line):
                return start, line.strip()[:_EVIDENCE_CHARS]
            tries += 1
            if tries == _PROGRESS_TRIES:
                break
        end = start - 1
    return -1, ""


_Candidate = tuple[int, bytes, _Profile]  # (byte offset, line, its skeleton's profile)


def _prepare(raw: bytes, *, ranks_done: bool) -> tuple[bytes, list[bytes], list[_Candidate]] | None:
    """Drop control bytes from the encoded tail (ANSI and CRs already handled); the candidate
    lines, in order, each distinct line once (a rule's first match is in the first of them where
    it matches at all). None (unless `ranks_done`): a line may begin with torchrun's rank prefix,
    which has to be stripped first. Returns (the tail, its lines' skeletons, the candidates)."""
    skeleton = raw.translate(_SKELETON)
    if b"\x00" in skeleton:  # control bytes: dropped, as `normalise` does
        raw = raw.translate(None, _CONTROL_BYTES)
        skeleton = raw.translate(_SKELETON)
    profiles = _PROFILES
    if len(profiles) > _PROFILES_MAX or _PROFILES_BYTES[0] > _PROFILES_MAX_BYTES:
        profiles.clear()
        _MARKED.clear()
        _PROFILES_BYTES[0] = 0
    skeletons = skeleton.split(b"\n")
    # The distinct shapes first (hashing each line once: bytes keep their hash), then only the new
    # ones are looked for: cheaper than a lookup of every line that a new shape interrupts.
    new = list(set(skeletons).difference(profiles))
    if new:
        _PROFILES_BYTES[0] += sum(map(len, new))
        _learn(new, profiles)
    try:
        profs = list(map(profiles.__getitem__, skeletons))
    except KeyError:
        raise _MemoryEmptied from None
    cands: list[_Candidate] = []
    seen: set[bytes] = set()
    # Offsets of candidate lines only: the lengths of the lines between two candidates are summed
    # (at C speed) when the next candidate comes.
    at = 0  # byte offset of line `nxt`
    nxt = 0
    for i in compress(range(len(skeletons)), profs):
        prof = profs[i]
        if prof[2]:  # type: ignore[misc]  # compress keeps the non-empty profiles only
            if not ranks_done:
                return None
            if prof is _RANKED:
                continue
        if i > nxt:
            at += sum(map(len, skeletons[nxt:i])) + (i - nxt)
        n = len(skeletons[i])
        line = raw[at : at + n]
        if line not in seen:
            seen.add(line)
            cands.append((at, line, prof))
        at += n + 1
        nxt = i + 1
    return raw, skeletons, cands


def _strip_rank_prefixes(text: str) -> str:
    """`_RANK_PREFIX.sub("", text)`, searching for its literal start instead of every position."""
    text = _RANK_PREFIX_AFTER_NL.sub("\n", text)
    m = _RANK_PREFIX_AT_START.match(text)
    return text[m.end() :] if m is not None else text


def classify(
    tail: str | bytes,
    *,
    idle_seconds: float | None = None,
    stall_after_s: float = DEFAULT_STALL_AFTER_S,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> Verdict:
    """Decide a state from a log tail and how long the log has been idle (pure, bounded).

    `tail` is text, or the bytes of a log as read (UTF-8; the last `max_chars` bytes are read).
    Bytes give the verdict of `tail.decode("utf-8", errors="replace")` without decoding the lines
    no rule reads; a tail whose invalid bytes are in a line that is read is decoded leniently first.
    """
    if not isinstance(tail, str):
        raw = tail if type(tail) is bytes and len(tail) <= max_chars else bytes(tail[-max_chars:])
        # The Kelvin sign (see below) takes the text path. Its last byte is looked for first: one
        # byte is a memchr, where the three-byte search crawls over tqdm's many other E2 sequences.
        if b"\xaa" not in raw or b"\xe2\x84\xaa" not in raw:
            try:
                return _classify_encoded(raw, idle_seconds=idle_seconds, stall_after_s=stall_after_s)
            except (UnicodeDecodeError, _MemoryEmptied):
                pass
        return classify(
            raw.decode("utf-8", errors="replace"),
            idle_seconds=idle_seconds,
            stall_after_s=stall_after_s,
            max_chars=max_chars,
        )
    text = tail[-max_chars:] if len(tail) > max_chars else tail
    if not text.isascii() and "\u212a" in text:
        # The Kelvin sign lowercases to an ASCII "k", which bytes.lower() does not know.
        return _classify_reference(tail, idle_seconds=idle_seconds, stall_after_s=stall_after_s, max_chars=max_chars)
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return _classify_reference(tail, idle_seconds=idle_seconds, stall_after_s=stall_after_s, max_chars=max_chars)
    try:
        return _classify_encoded(raw, idle_seconds=idle_seconds, stall_after_s=stall_after_s)
    except _MemoryEmptied:
        return _classify_reference(tail, idle_seconds=idle_seconds, stall_after_s=stall_after_s, max_chars=max_chars)


def _classify_encoded(raw: bytes, *, idle_seconds: float | None, stall_after_s: float) -> Verdict:
    """The fast path on an encoded, bounded tail. Lines are decoded strictly: bytes that are not
    UTF-8 raise UnicodeDecodeError when a line holding them is read (the caller decodes leniently
    and starts again); lines never read may hold anything. Raises _MemoryEmptied (see there)."""
    # `normalise`, on the encoded text: ANSI escapes, carriage returns, rank prefixes, control bytes.
    if b"\x1b" in raw:
        raw = _ANSI_BYTES.sub(b"", raw)
    if b"\r" in raw:
        # bytes.replace of a two-byte pattern searches at ~1 ns a byte; the regex searches for
        # its first byte at C speed, and most progress bars redraw with bare CRs.
        if _CRLF.search(raw) is not None:
            raw = raw.replace(b"\r\n", b"\n")
        raw = raw.replace(b"\r", b"\n")
    head = raw[:512]
    # torchrun prefixes every line of a worker ("[rank0]: ..."): then strip before anything else;
    # otherwise only if a line turns out to begin with a prefix (the prefix's \d is Unicode-aware,
    # so it is stripped from the text).
    ranked = b"[rank" in head or b"[default" in head
    if ranked:
        raw = _strip_rank_prefixes(raw.decode("utf-8")).encode("utf-8")
    prepared = _prepare(raw, ranks_done=ranked)
    if prepared is None:
        prepared = _prepare(_strip_rank_prefixes(raw.decode("utf-8")).encode("utf-8"), ranks_done=True)
    assert prepared is not None
    raw, skeletons, cands = prepared
    progress_pos, progress_line = _last_progress_lines(raw, skeletons)
    if len(_SPECIFIC_MATCHES) + len(_LAZY_MATCHES) > _LINE_MATCHES_MAX:
        _forget()

    def search(lazy: bool) -> list[_Hit]:
        memo = _LAZY_MATCHES if lazy else _SPECIFIC_MATCHES
        found: dict[int, _Hit] = {}
        for start, line, prof in cands:
            got = memo.get(line)
            if got is None:
                got = _line_matches(line, prof, lazy)
                if len(line) <= _MEMO_LINE_BYTES:
                    memo[line] = got
            for idx, k in got:
                if idx not in found:
                    found[idx] = _Hit(_RULES[idx], start + k, _line_at(line.decode("utf-8"), 0), start)
        return [found[idx] for idx in sorted(found)]

    return _decide(
        search(False),
        lambda: search(True),
        progress_pos=progress_pos,
        progress_line=progress_line,
        text=lambda: raw.decode("utf-8"),
        tail=lambda n: _tail_of(raw, n),
        idle=_idle(idle_seconds),
        stall_after_s=stall_after_s,
    )


def _tail_of(raw: bytes, n: int) -> tuple[str, str]:
    """(an end of the encoded tail that starts at a line start and holds its last n characters,
    decoded; those n characters lowercased): what `_decide` reads near the end, without decoding
    it all. n bytes hold at most n characters, and 4n bytes at least n; mostly n bytes are n."""
    back = n
    while True:
        start = raw.rfind(b"\n", 0, max(0, len(raw) - back)) + 1
        text = raw[start:].decode("utf-8")
        if len(text) >= n or start == 0:
            break
        back += 4 * (n - len(text))  # each character still missing is at most 4 bytes
    if text.isascii():
        return text, text[-n:].lower()
    # bytes.lower() lowercases the ASCII letters only, at C speed (str.lower() on non-ASCII text
    # looks up every character). Every pattern read in this window is ASCII letters, digits and
    # classes (\d, \s, \w) that no case mapping changes, so it reads the same in either; the
    # Kelvin sign, the one character that lowercases to ASCII, never comes this way (`classify`).
    low = raw[start:].lower().decode("utf-8")
    return text, low[-n:]
