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
"""

from __future__ import annotations

import os
import re
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from itertools import compress, pairwise
from pathlib import Path
from typing import Any

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
_EVIDENCE_CHARS = 240
_SUMMARY_RULE = "run-summary"
_EXIT_SUMMARY_RULE = "shell-time-summary"
_TRACEBACK_RULE = "traceback-any"


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


# ---------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    state: str
    weight: int  # specificity: higher wins regardless of position
    confidence: float
    needles: tuple[str, ...]
    pattern: re.Pattern[str]
    soft: bool = False  # overridden when progress was logged after it
    check: Callable[[re.Match[str]], bool] | None = None
    lazy: bool = False  # generic semantics: only searched when no specific rule already decided
    # The pattern's top-level alternatives, each with a literal that every match of it holds (see
    # `_alternatives`); None when the pattern is searched whole.
    parts: tuple[tuple[tuple[str, ...] | None, re.Pattern[str]], ...] | None = None


_RULES: list[_Rule] = []


def _rule(
    name: str,
    state: str,
    weight: int,
    needles: str | tuple[str, ...],
    pattern: str,
    *,
    confidence: float = 0.97,
    soft: bool = False,
    flags: int = re.IGNORECASE,
    check: Callable[[re.Match[str]], bool] | None = None,
    lazy: bool = False,
) -> None:
    if isinstance(needles, str):
        needles = (needles,)
    if flags & re.IGNORECASE:
        # Case-insensitive matching is done by searching lowercased text with a lowercased
        # pattern: an order of magnitude faster than re.IGNORECASE on long tails.
        pattern, flags = _fold(pattern), flags & ~re.IGNORECASE
    _RULES.append(
        _Rule(
            name,
            state,
            weight,
            confidence,
            tuple(n.lower() for n in needles),
            re.compile(pattern, flags | re.MULTILINE),
            soft,
            check,
            lazy,
            _alternatives(pattern, flags | re.MULTILINE),
        )
    )


def _outside_classes(pattern: str, i: int = 0) -> Iterator[tuple[int, str, int]]:
    """(index, character, group depth) of a pattern's characters from `i` on that are neither
    escaped nor inside a character class; a "(" is given at the depth outside it, as is its ")"."""
    depth, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":  # a class: "]" right after "[" or "[^" is a member, escapes are skipped
            i += 2 if pattern.startswith("[^", i) else 1
            if i < n and pattern[i] == "]":
                i += 1
            while i < n and pattern[i] != "]":
                i += 2 if pattern[i] == "\\" else 1
        else:
            depth -= c == ")"
            yield i, c, depth
            depth += c == "("
        i += 1


def _split_top(pattern: str) -> list[str]:
    """A pattern cut at its top-level `|` (outside groups and character classes)."""
    cuts = [i for i, c, depth in _outside_classes(pattern) if c == "|" and depth == 0]
    return [pattern[a + 1 : b] for a, b in pairwise([-1, *cuts, len(pattern)])]


def _closing(pattern: str, i: int) -> int:
    """The index of the ")" that closes the group opened at `pattern[i]`, or -1."""
    return next((j for j, c, depth in _outside_classes(pattern, i) if c == ")" and depth == 0), -1)


_ZERO_WIDTH_START = re.compile(r"\^|\\b|\(\?<?[=!](?:[^()\\]|\\.)*\)")  # ^, \b, a lookaround without groups
_LITERAL_ESCAPE = re.compile(r"\\[^A-Za-z0-9]")


def _leading_literal(alt: str, i: int) -> str:
    """A literal that every match of `alt` holds: the plain characters it starts with from `i` (past
    its zero-width assertions), "" when it starts otherwise. A character made optional by the
    quantifier after it is left out."""
    out: list[str] = []
    while i < len(alt):
        esc = _LITERAL_ESCAPE.match(alt, i)
        if esc is not None:
            c, nxt = alt[i + 1], i + 2
        elif alt[i] in ".^$*+?{}[]()|\\":
            break
        else:
            c, nxt = alt[i], i + 1
        if nxt < len(alt) and alt[nxt] in "?*{":
            break  # c is optional
        out.append(c)
        if nxt < len(alt) and alt[nxt] == "+":
            break
        i = nxt
    return "".join(out)


def _leading_literals(alt: str) -> tuple[str, ...] | None:
    """Literals of which every match of `alt` holds at least one: its leading literal, or the
    leading literals of the alternatives of the (non-optional) group it starts with. None when
    there is no such set of literals of 2 characters or more."""
    i = 0
    while (z := _ZERO_WIDTH_START.match(alt, i)) is not None:
        i = z.end()
    if alt.startswith("(?:", i):
        close = _closing(alt, i)
        if close < 0 or alt[close + 1 : close + 2] in ("?", "*", "{"):
            return None
        found: list[str] = []
        for inner in _split_top(alt[i + 3 : close]):
            lits = _leading_literals(inner)
            if lits is None:
                return None
            found += lits
        return tuple(dict.fromkeys(found))
    literal = _leading_literal(alt, i)
    return (literal,) if len(literal) >= 2 else None


_Part = tuple[tuple[str, ...] | None, re.Pattern[str]]


def _alternatives(pattern: str, flags: int) -> tuple[_Part, ...] | None:
    """The pattern's top-level alternatives, each compiled alone with literals of which each of
    its matches holds one (None: no such literals, the alternative is always searched).

    A search of `a|b|c` matches first at the leftmost position where any alternative matches, so
    the first match starts at the least of the alternatives' first starts, and an alternative
    none of whose literals is in the line cannot match there. `re` searches for a leading
    literal at C speed, where a whole alternation is tried at every position. None (search the
    whole pattern) for a pattern whose alternatives cannot be compiled alone (a back-reference)."""
    parts: list[_Part] = []
    for alt in _split_top(pattern):
        try:
            parts.append((_leading_literals(alt), re.compile(alt, flags)))
        except re.error:
            return None
    if len(parts) == 1 and parts[0][0] is None:
        return None  # nothing to gain
    return tuple(parts)


_FOLD_KEEP = re.compile(r"\\.|\(\?P<\w+>|\(\?P=\w+\)")


def _fold(pattern: str) -> str:
    """Lowercase a pattern's literal letters, leaving escapes (\\S, \\d) and group names alone."""
    out: list[str] = []
    last = 0
    for m in _FOLD_KEEP.finditer(pattern):
        out.append(pattern[last : m.start()].lower())
        out.append(m.group(0))
        last = m.end()
    out.append(pattern[last:].lower())
    return "".join(out)


def _lower_same_length(text: str) -> str:
    """text.lower(), keeping positions aligned with `text` (a few characters lowercase to two)."""
    low = text.lower()
    if len(low) == len(text):
        return low
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in text)


def _scale_below_one(m: re.Match[str]) -> bool:
    """The loss scale fell below 1, or the scaler is at its floor and still overflowing
    (DeepSpeed's `Attempted loss scale: 1, reducing to 1`: min_loss_scale reached, every step skipped)."""
    try:
        groups = m.groupdict()
        if groups.get("scale") is not None:
            return float(groups["scale"]) < 1.0
        if groups.get("lg") is not None:  # the scale's log2
            return float(groups["lg"]) < 0.0
        return float(groups["to"]) < 1.0 or float(groups["attempt"]) == float(groups["to"])
    except (TypeError, ValueError):
        return False


def _scale_tiny(m: re.Match[str]) -> bool:
    try:
        return float(m.group("scale")) < 1e-5
    except (TypeError, ValueError):
        return False


def _nonzero(m: re.Match[str]) -> bool:
    try:
        return int(m.group("n")) > 0
    except (TypeError, ValueError):
        return False


# --- oom: GPU and host memory, the kernel's OOM killer ---------------------------------------
_rule(
    "cuda-oom",
    "oom",
    99,
    ("cudaerrormemoryallocation", "cuda_error_out_of_memory", "out of memory", "outofmemory"),
    r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory|cuda failure 'out of memory'"
    r"|HIP out of memory|cudaErrorMemoryAllocation|CUDA_ERROR_OUT_OF_MEMORY",
)
_rule("tried-to-allocate", "oom", 98, "tried to allocate", r"Tried to allocate [\d.]+ ?[KMGT]i?B")
_rule(
    "oom-killer",
    "oom",
    98,
    ("oom-kill", "out of memory: kill", "oom_reaper", "memory cgroup out of memory", "invoked oom-killer"),
    r"Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|oom_reaper: reaped"
    r"|Memory cgroup out of memory",
)
_rule(
    "cpu-alloc",
    "oom",
    97,
    (
        "resource_exhausted",
        "that was not possible",
        "defaultcpuallocator",
        "cannot allocate memory",
        "can't allocate memory",
        "std::bad_alloc",
        "memoryerror",
        "not enough memory",
        "memory allocation error on worker",
    ),
    r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)|\bMemoryError\b"
    r"|\bMemory allocation error on worker \d+"  # XGBoost's device allocator (dh::ThrowOOMError)
    r"|Cannot allocate memory|std::bad_alloc|RESOURCE_EXHAUSTED.{0,40}memory"
    # XLA (TPU/GPU): "RESOURCE_EXHAUSTED: Attempting to reserve 11.35G at the bottom of memory.
    # That was not possible. There are 12.18G free, ..." (also "Attempting to allocate 50.00M.")
    r"|RESOURCE_EXHAUSTED.{0,80}Attempting to (?:reserve|allocate) [\d.]+ ?[KMGT]"
    r"|Attempting to (?:reserve|allocate) [\d.]+ ?[KMGT]i?B?\b.{0,40}That was not possible",
)
_rule(
    "shm-oom",
    "oom",
    85,
    (
        "shared memory",
        "exited unexpectedly",
        "is killed by signal",
        "bus error",
        "enough gpu ram",
        "dispatched on the cpu",
    ),
    r"insufficient shared memory|bus error encountered in worker|DataLoader worker \(pid\(?s?\)? [\d, ]+\) (?:is killed|exited unexpectedly)"
    r"|enough GPU RAM to fit|modules are dispatched on the CPU or the disk",
    confidence=0.85,
)
_rule(
    "bnb-oom",
    "oom",
    96,
    (
        "cudamalloc",
        "cublas_status_alloc_failed",
        "alloc_failed",
        "memory object allocation failure",
        "mem_object_allocation_failure",
    ),
    r"cudaMalloc(?:Async)? (?:failed|retries)|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    r"|CUFFT_ALLOC_FAILED|CUSOLVER_STATUS_ALLOC_FAILED|CUSPARSE_STATUS_ALLOC_FAILED"
    r"|Memory Object Allocation Failure|CL_MEM_OBJECT_ALLOCATION_FAILURE",
)  # OpenCL (LightGBM's GPU trainer, ...)
_rule(
    "oom-recovered",
    "oom",
    70,
    ("attempting to recover", "skipping batch"),
    r"(?:ran out of memory|OOM).{0,80}(?:attempting to recover|skipping batch)",
    soft=True,
    confidence=0.7,
)
_rule(
    "generic-oom",
    "oom",
    80,
    ("out of memory", "oom"),
    r"\bout of memory\b|\bOOM(?:ed)?\b(?! *[:=]? *0(?:\.0+)?(?![\d.]))",
    confidence=0.85,
)
# (not a counter at zero: "oom 0", "OOM: 0", fairseq's progress stats "oom=0.000")
# TensorFlow's BFC allocator dumps its chunks and this total only when an allocation failed (before
# its "ran out of memory" line and the ResourceExhaustedError, which a cut excerpt may lack).
_rule(
    "tf-allocator-dump", "oom", 80, ("sum total of in-use chunks",), r"\bSum Total of in-use chunks: ", confidence=0.85
)
_rule(
    "sigkill",
    "oom",
    60,
    ("sigkill", "exitcode", "exit code", "return code", "exit status", "killed", "error code -"),
    r"Signals\.SIGKILL|Signal 9 \(SIGKILL\)|exit ?code:? ?-9\b|exitcode\s*:\s*-9\b|return code = -9\b"
    r"|\berror code -9\b"  # NVIDIA DIGITS, for the Caffe/Torch process it ran
    r"|killed by signal: Killed"
    r"|exit status (?:-9|137)\b|exit code 137\b|^(?:\S*: line \d+: +\d+ )?Killed\b"
    # The shell's "Killed" lands at the cursor: after a progress bar that ended without a newline,
    # bare or as a script's job report ("<script>: line 6:  3305 Killed   <command>").
    r"|(?<=\])Killed[ \t]*$|: line \d+: +\d+ Killed\b",
    confidence=0.8,
)

# --- diverged: NaN/inf loss or grad norm, loss-scale underflow, exploding loss ---------------
_INF_NEEDLES = ("nan", ": inf", "=inf", "= inf", "loss inf", "norm inf", "-inf", "+inf", "infinity", "'inf")
_rule(
    "nan-loss",
    "diverged",
    94,
    _INF_NEEDLES,
    r"""loss(?:_(?!scale)\w+)?['"]?\s*[:=|]?\s*['"]?(?:\[\s*|tensor\(\s*)?[-+]?(?:nan|inf(?:inity)?)\b"""
    # ("| loss | nan |": a logger's key-value table, OpenAI baselines' and the repos built on it;
    # "Loss: epoch NaN - batch NaN": a loss given with what it is averaged over, burn's metrics)
    r"""|loss\s*[:=]\s*(?:epoch|batch|step|iter|avg|average|mean|ema|running|smoothed|total|train|val|valid|test)"""
    r"""\s+[-+]?(?:nan|inf(?:inity)?)\b"""
    # (mmdet/mmseg log every loss term by its key: `decode.loss_seg: nan`, `loss_cls: nan`)
    # losses logged by their own names (GluonCV/MXNet metrics: CrossEntropy=nan, SmoothL1=nan)
    r"""|\b(?:cross_?entropy|smooth_?l1|nll|bce|focal|kl_?div)\w*['"]?\s*[:=]\s*['"]?[-+]?nan\b"""
    # the terms of a loss listed by name and value without a separator, their total NaN (the YOLOv3
    # ports' `[Losses: x 0.1, y 0.2, ..., total nan]`)
    r"""|\blosses\b[^\n]{0,160}?\btotal\s*[:=]?\s*[-+]?nan\b""",
)
# A printed tensor of NaNs (the model's outputs or loss, printed by the script): torch or TensorFlow
_rule(
    "nan-tensor",
    "diverged",
    85,
    ("nan, nan", "nan nan"),
    r"\btensor\(\[+(?:[-+]?nan(?:, *| +)){2,}[-+]?nan\b",
    confidence=0.85,
)
# DeepXDE's step table once the losses are NaN: "2000      [nan]         [nan]         [nan]" (each
# column a list of loss terms; a row whose train and test columns are both all NaN)
_rule(
    "nan-table-row", "diverged", 88, ("[nan",), r"^\d+[ \t]+\[nan(?:, *nan)*\][ \t]+\[nan(?:, *nan)*\]", confidence=0.9
)
# darknet's region layers: a NaN IOU where the layer had objects (with `count: 0` it is 0/0, and normal)
_rule("darknet-nan", "diverged", 90, ("avg iou",), r"\bAvg IOU: -?nan\b[^\n]*\bcount: [1-9]", confidence=0.9)
_rule(
    "nan-grad-norm",
    "diverged",
    60,
    _INF_NEEDLES,
    r"""\bgrad[ _]norm['"]?\s*[:=]?\s*['"]?[-+]?(?:nan|inf(?:inity)?)\b""",
    confidence=0.8,
)
_rule(
    "loss-is-nan",
    "diverged",
    95,
    (
        "nan",
        "non-finite",
        "not finite",
        "infinite",
        "loss is",
        "loss became",
        "loss has become",
        "detected inf",
        "inf loss",
        "inf gradient",
        "norm is inf",
        "norm was inf",
        "norm became inf",
    ),
    r"loss (?:is|became|has become|returned[^.\n]{0,40}is) (?:nan|inf|non-finite|infinite)"
    r"|non-finite (?:loss|gradient|grad norm|values?)|is not finite|returned nan values"
    r"|found NaN in local grad norm|NaN or Inf found in input tensor|detected (?:inf|nan)"
    r"|(?:nan|inf) (?:loss|gradients?) detected|\b(?:nan|inf) loss with\b|\bgave (?:a )?NaN loss\b|loss contains nan|Encountered nan"
    # a script's own check raising on the loss: DDSP-SVC's `raise ValueError(' [x] nan loss ')`
    r"|(?:Error|Exception):[^\n]{0,30}?\b(?:nan|inf) loss\b"
    # a check raising on any tensor gone NaN: MONAI's "ValueError: cls_logits is NaN or Inf."
    r"|(?:Error|Exception): ?[^\n]{0,60}?\b(?:is|are|became|become) nan\b"
    r"|grad(?:ient)?[ _]norm (?:is|was|became) (?:nan|inf)"
    # TensorFlow's CheckNumerics (clip_by_global_norm's, or tf.debugging.check_numerics on a loss)
    r"|Found Inf or NaN global norm|Tensor had (?:NaN|Inf) values",
)
_rule(
    "min-loss-scale",
    "diverged",
    96,
    (
        "decrease scale",
        "minimum loss scale",
        "already at minimum",
        "underflow",
        "reached minimum",
        "scale is too small",
        "reached the minimum",
        "fell below",
        "too small",
        "in a row due to overflow",
    ),
    r"Minimum loss scale reached|loss scale already at minimum|cannot decrease scale anymore|grad_scale is too small"
    r"|loss[ _]scale (?:has )?(?:underflow|reached (?:the )?minimum|fell below|too small)"
    # GPT-NeoX's overflow monitor, giving up after so many fp16 overflow skips in a row
    r"|Skipped \d+ iterations in a row due to Overflow",
)
_rule(
    "scale-underflow",
    "diverged",
    90,
    ("reducing loss scale to", "reducing to", "setting loss scale to", "decreased lg_loss_scale to"),
    r"(?:reducing loss scale to|setting loss scale to:?) (?P<scale>[0-9.eE+-]+)"
    r"|Attempted loss scale: (?P<attempt>[0-9.eE+-]+), reducing to (?P<to>[0-9.eE+-]+)"
    # OpenAI's guided-/improved-diffusion keep the scale's log2: "Found NaN, decreased lg_loss_scale to -3.0"
    r"|decreased lg_loss_scale to (?P<lg>[0-9.eE+-]+)",
    check=_scale_below_one,
)
# icefall/k2 warn while the fp16 grad scale is below 1 (it may recover) and give up below 1e-5
# ("grad_scale is too small"): a scale that far down is an overflow that never ends.
_rule(
    "grad-scale-small",
    "diverged",
    85,
    "grad scale is small",
    r"Grad scale is small: (?P<scale>[0-9.eE+-]+)",
    check=_scale_tiny,
    confidence=0.9,
)
# torch.distributions refuses a parameter that went NaN (an RL policy's mean, a VAE's scale).
_rule(
    "distribution-nan",
    "diverged",
    92,
    ("found invalid values", "normal expects all elements of std"),
    r"to satisfy the constraint \w+\(\), but found invalid values"
    r"|normal expects all elements of std >= 0",  # torch.normal on a NaN std: an RL policy's std blew up
    confidence=0.85,
)
_rule(
    "megatron-nan-iters",
    "diverged",
    85,
    "number of nan iterations",
    r"number of nan iterations:\s*(?P<n>\d+)",
    check=_nonzero,
    confidence=0.9,
)
_rule(
    "loss-exploded",
    "diverged",
    90,
    ("explosion", "explod", "diverg"),
    r"loss (?:is |has )?(?:probably )?(?:exploding|exploded|diverg(?:ed|ing))|training diverged"
    r"|gradient explosion|exploding gradients? detected",
)

# --- cuda_fault: driver/runtime mismatch, no device, illegal access, Xid/ECC, NCCL errors ----
_rule(
    "xid",
    "cuda_fault",
    97,
    ("xid", "fallen off the bus"),
    r"NVRM: Xid|\bXid \(?PCI|\bXid:? ?\d+\b|GPU has fallen off the bus"
    # the kernel wraps long NVRM messages: "NVRM: The NVIDIA GPU ... / NVRM: fallen off the bus and ..."
    r"|NVRM: .{0,80}fallen off the bus|fallen off the bus and is not responding",
)
_rule(
    "ecc",
    "cuda_fault",
    97,
    ("ecc", "row remap"),
    r"uncorrectable ECC error|\bECC error|double[- ]bit ECC|row remap(?:ping)? (?:failure|pending)",
)
_rule(
    "illegal-access",
    "cuda_fault",
    96,
    (
        "launchfailure",
        "illegal",
        "misaligned",
        "unspecified launch failure",
        "launch failure",
        "launch timed out",
        "memory access fault by gpu",
    ),
    r"illegal memory access|illegal instruction was encountered|misaligned address"
    r"|Memory access fault by GPU node"  # ROCm/HIP
    r"|unspecified launch failure|CUDA_ERROR_ILLEGAL_ADDRESS|cudaErrorIllegalAddress"
    r"|the launch timed out and was terminated|cudaErrorLaunchFailure",
)
_rule(
    "driver-mismatch",
    "cuda_fault",
    96,
    (
        "not compatible with the current pytorch",
        "driver",
        "nvml",
        "compute capability",
        "sm_",
        "no kernel image",
        "forward compatibility",
        "error 802:",
        "error 803:",
        "error 804:",
        "nvidia-container-cli",
        "rminitadapter",
        "device handle",
    ),
    r"driver version is insufficient|NVIDIA driver on your system is too old"
    r"|Driver/library version mismatch|Failed to initialize NVML|couldn't communicate with the NVIDIA driver"
    r"|no kernel image is available|forward compatibility was attempted"
    r"|unsupported display driver|CUDA capability sm_\d+ is not compatible"
    r"|not compatible with the current PyTorch installation|CUDA driver initialization failed"
    r"|Found no NVIDIA driver|cudaErrorInsufficientDriver|CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"
    r"|Error 80[234]:|could not select device driver|nvidia-container-cli: .{0,80}error"
    r"|RmInitAdapter failed|Unable to determine the device handle|compute capability of at least",
)
_rule(
    "no-device",
    "cuda_fault",
    96,
    (
        "no cuda gpus",
        "cuda-capable",
        "no_device",
        "nodevice",
        "not compiled with cuda",
        "cudagetdevicecount",
        "cuda unknown error",
        "invalid device ordinal",
        "gpu is lost",
        "unavailable",
        "cuinit",
        "cuda initialization",
        "no visible gpu",
        "cpu training is not allowed",
    ),
    r"No CUDA GPUs are available|no CUDA-capable device is detected|CUDA_ERROR_NO_DEVICE"
    r"|cudaErrorNoDevice|CUDA-capable device\(s\) is/are busy or unavailable"
    r"|Torch not compiled with CUDA enabled|Unexpected error from cudaGetDeviceCount"
    r"|CUDA unknown error - this may be due to an incorrectly set up environment"
    r"|invalid device ordinal|GPU is lost|GPU (?:\d+ )?(?:is )?unavailable|cuInit\(\) failed"
    r"|CUDA initialization: .{0,80}(?:error|failed)|cudaErrorDevicesUnavailable"
    r"|No visible GPU is found"  # XGBoost asked for a GPU that the process cannot see
    # VITS' train.py and its many forks (so-vits-svc, Bert-VITS2, ...): assert torch.cuda.is_available()
    r"|CPU training is not allowed",
)
# The TPU's runtime failing to come up or to be had: JAX/libtpu, TensorFlow's TPU strategy, torch_xla's
# XRT configuring the TPU's topology. (JAX's INFO line about a backend it could not load on a GPU or
# CPU machine, and its "No GPU/TPU found, falling back to CPU" warning, are no failure.)
_rule(
    "tpu-runtime",
    "cuda_fault",
    94,
    (
        "tpu initialization failed",
        "tpus not found",
        "tpu is already in use",
        "global core array",
        "initialize backend 'tpu'",
    ),
    r"TPU initialization failed|TPUs not found in the cluster|TPU is already in use by"
    r"|Global core array does not contain host cores|RuntimeError: Unable to initialize backend 'tpu'",
)
_rule(
    "hw-unsupported",
    "cuda_fault",
    93,
    ("ampere", "bf16", "bfloat16", "flashattention", "flash attention"),
    r"FlashAttention only supports Ampere GPUs or newer|Your setup doesn't support bf16"
    r"|bf16 \(?bfloat16\)? (?:is )?not supported|does not support bfloat16|requires (?:an )?Ampere",
)
_rule(
    "cuda-lib",
    "cuda_fault",
    88,
    (
        "libcuda",
        "libcudart",
        "libcublas",
        "libnvrtc",
        "libcudnn",
        "bitsandbytes cuda binary",
        "compiled without gpu",
        "cuda setup",
        "libbitsandbytes",
        "nvcc",
        "cuda_home",
        "detected cuda version",
        "named symbol not found",
    ),
    r"lib(?:cuda|cudart|cublas(?:Lt)?|nvrtc|cudnn)[\w.]*\.so[\d.]*: cannot open shared object file"
    r"|CUDA Setup failed|Could not find the bitsandbytes CUDA binary|libbitsandbytes_cuda\d+\S*\.so"
    r"|bitsandbytes was compiled without GPU support|CUDA SETUP: .{0,60}(?:not found|failed|Problem)"
    r"|nvcc fatal\s*:\s*Unsupported gpu architecture|CUDA_HOME does not exist"
    r"|detected CUDA version \([\d.]+\) mismatches the version that was used to compile PyTorch"
    r"|Error named symbol not found at line \d+ in file|libbitsandbytes_cpu\.so: undefined symbol",
    soft=True,
    confidence=0.9,
)
# The CUDA toolkit itself is missing on the host (a JIT extension build cannot find nvcc): no
# ambiguity left, unlike a bare "Error building extension" (often a compiler or code problem).
# A CUDA extension (flash-attn, xformers, apex, ...) built against another torch or CUDA: the
# environment on the host is broken, not the job's data.
_rule(
    "cuda-ext-abi",
    "cuda_fault",
    88,
    ("undefined symbol",),
    r"\S*cuda\S*\.so: undefined symbol|undefined symbol: _ZN3c10\d*cuda",
    confidence=0.85,
)
_rule(
    "cuda-toolkit-missing",
    "cuda_fault",
    80,
    ("nvcc", "no cuda runtime"),
    r"nvcc: (?:not found|No such file or directory)|/nvcc\S*: (?:not found|No such file)"
    r"|No CUDA runtime is found",
    confidence=0.9,
)
_rule(
    "ext-build",
    "cuda_fault",
    70,
    ("error building extension", "ninja", "nvcc"),
    r"Error building extension '\w+'|ninja: build stopped: subcommand failed|nvcc: not found",
    confidence=0.75,
)
_rule(
    "bnb-nogpu-warn",
    "cuda_fault",
    40,
    ("compiled without gpu support", "setting accelerator to cpu"),
    r"compiled without GPU support|Setting accelerator to CPU",
    soft=True,
    confidence=0.6,
)
# Intel XPU (IPEX, torch.xpu): the Unified Runtime under SYCL failed a device call.
_rule(
    "xpu-runtime",
    "cuda_fault",
    85,
    ("ur error", "ur_result_error"),
    r"RuntimeError: UR error\b|\bUR_RESULT_ERROR_[A-Z_]+",
    confidence=0.9,
)
_rule(
    "cublas-fault",
    "cuda_fault",
    85,
    (
        "cublas_status",
        "cudnn_status",
        "cuda error",
        "cudaerror",
        "cuda_error",
        "deferredcudacallerror",
        "find an engine",
        "cudnn algorithm",
        "cufft_",
        "cusolver_status",
        "curand_status",
        "cusparse_status",
    ),
    r"CUBLAS_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|NOT_SUPPORTED)"
    r"|CUDNN_STATUS_(?:EXECUTION_FAILED|INTERNAL_ERROR|NOT_INITIALIZED|ARCH_MISMATCH|MAPPING_ERROR|NOT_SUPPORTED)"
    r"|unable to find an engine to execute this computation|Unable to find a valid cuDNN algorithm"
    r"|CUDA error: (?:unknown error|operation not permitted|an? \w+ error|initialization error"
    r"|operation not supported|uncorrectable|invalid argument|system not yet initialized)"
    r"|DeferredCudaCallError|cudaErrorUnknown|CUDA_ERROR_UNKNOWN|CUDA_ERROR_LAUNCH_FAILED"
    # the other CUDA libraries' internal failures (a runtime that does not match the driver, most often)
    r"|CUFFT_(?:INTERNAL_ERROR|EXEC_FAILED|SETUP_FAILED)|CUSOLVER_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED|NOT_INITIALIZED)"
    r"|CURAND_STATUS_(?:INTERNAL_ERROR|INITIALIZATION_FAILED|LAUNCH_FAILURE)|CUSPARSE_STATUS_(?:INTERNAL_ERROR|EXECUTION_FAILED)",
    confidence=0.9,
)
_rule(
    "nccl-error",
    "cuda_fault",
    84,
    (
        "nccl error",
        "ncclsystem",
        "ncclinternal",
        "ncclunhandled",
        "ncclinvalid",
        "ncclremote",
        "nccl warn",
        "distbackenderror",
        "communicator was aborted",
        "unhandled system error",
        "unhandled cuda error",
    ),
    r"NCCL error(?: in)?|nccl(?:System|Internal|UnhandledCuda|Invalid\w*|RemoteError)Error?"
    r"|NCCL WARN (?:Cuda failure|NET/IB\s*:\s*Got completion|Call to)"
    r"|DistBackendError|NCCL communicator was aborted|unhandled (?:system|cuda) error",
    confidence=0.9,
)
# NCCL's own error trail: each function an error passes through logs "file.cc:line -> result" (a non-zero
# ncclResult_t), and its bootstrap's socket connect fails with a WARN. Above the generic network rule:
# a refused connection between NCCL's peers is an NCCL failure (the host or its fabric), not a download.
_rule(
    "nccl-error-trail",
    "cuda_fault",
    91,
    (".cc:", "nccl warn connect to", "nccl warn bootstrap"),
    r"NCCL INFO [\w/.+-]+\.cc:\d+ -> [1-9]\d*\b|NCCL WARN (?:Connect to \S+ failed|Bootstrap)",
    confidence=0.9,
)
# NCCL refusing a call it was given (torch's "NCCL error in: <file>:<line>, invalid argument", then
# the result's name): raised on the rank itself, never by a peer that died, so above the config
# rule, whose words ("Invalid config ...") NCCL's own "Last error:" detail may use.
_rule(
    "nccl-invalid-call",
    "cuda_fault",
    91,
    ("nccl error in:", "ncclinvalid"),
    r"NCCL error in: \S+, invalid (?:argument|usage)\b|\bnccl(?:InvalidArgument|InvalidUsage)\b",
    confidence=0.9,
)
_rule(
    "nccl-warn",
    "cuda_fault",
    60,
    "nccl warn",
    r"NCCL WARN .{0,60}(?:error|fail|could not|cannot|unable)",
    soft=True,
    confidence=0.7,
)  # ("Could not find real path of /sys/class/pci_bus/...": its topology probe, at init)
_rule(
    "sigbus-gpu",
    "cuda_fault",
    50,
    (
        "segmentation",
        "segmentation fault",
        "sigsegv",
        "core dumped",
        "0xc0000005",
        "code -1073741819",
        "code 3221225477",
    ),
    r"Segmentation fault|SIGSEGV|Fatal Python error: Segmentation"
    # Windows' segfault, STATUS_ACCESS_VIOLATION, as IDEs and shells report the exit code (signed or not)
    r"|\b0xC0000005\b|\bcode -1073741819\b|\bcode 3221225477\b",
    confidence=0.55,
)

# --- stalled: collective/watchdog/rendezvous timeouts ------------------------------------------
_rule(
    "nccl-watchdog",
    "stalled",
    92,
    ("before timing out", "watchdog", "timed out", "timeout", "heartbeat", "original reason for failure was"),
    r"Watchdog caught collective operation timeout|ran for \d+ milliseconds before timing out"
    r"|watchdog got stuck|Heartbeat monitor timed out|Timeout at NCCL work"
    r"|collective operation timeout"
    r"|dump signal due to a collective timeout"  # ProcessGroupNCCL's flight recorder, when a peer timed out
    r"|NCCL (?:watchdog )?timeout|Timed out waiting \d+ ?ms for send operation"
    # the communicator the watchdog aborted, with its reason (the timeout, or the watchdog itself stuck),
    # which a posted excerpt may cut mid-word: "... Original reason for failure was: [Rank 0] Watchdog caug"
    r"|Original reason for failure was: \[Rank \d+\] Watchdog\b",
)
# Huawei Ascend's HCCL: a collective waited past HCCL_EXEC_TIMEOUT for a peer's notify.
_rule(
    "hccl-timeout",
    "stalled",
    91,
    ("notify record", "hccl_exec_timeout"),
    r"has not received the Notify record from remote rank|HCCL_EXEC_TIMEOUT",
    confidence=0.9,
)
# Only the watchdog's C++ frames survived (the message line was cut off): the timeout path.
# "failed OR timed out": the watchdog's line for both, so a specific NCCL error (ncclRemoteError, an
# IB completion error) printed with it outranks it.
_rule("nccl-failed-or-timed-out", "stalled", 80, ("timed out",), r"Some NCCL operations have failed or timed out")
_rule(
    "nccl-watchdog-frames",
    "stalled",
    78,
    ("checktimeout",),
    r"ProcessGroupNCCL::WorkNCCL::checkTimeout",
    confidence=0.85,
)
_rule(
    "rendezvous",
    "stalled",
    91,
    ("diststoreerror", "rendezvous", "timed out", "timeout", "clients joined", "socket", "monitoredbarrier"),
    r"RendezvousTimeoutError|Rendezvous (?:timed out|timeout)|Timed out after \d+ seconds waiting for clients"
    r"|clients joined|The client socket has timed out|DistStoreError: .{0,60}[Tt]imed? ?out"
    r"|Socket Timeout|wait timeout after \d+ ?ms|timed out waiting for (?:the )?(?:store|barrier|peers|workers)"
    r"|barrier timed out|monitoredBarrier|Timed out initializing process group"
    r"|Timed out waiting \d+ ?ms for (?:send|recv|recv operation)|The server socket has timed out"
    r"|Timeout waiting for key",  # a c10d store's get (FileStore, HashStore): a peer never wrote its key
    confidence=0.95,
)
# JAX/XLA multi-host start-up: registering with the coordination service, or its barrier, timed
# out (the other tasks never came). Not "agent in error status" alone: every task prints that
# when any peer fails, whatever the failure was.
_rule(
    "coordination-deadline",
    "stalled",
    78,
    ("registertask", "barrier timed out"),
    r"DEADLINE_EXCEEDED: Barrier timed out|CoordinationService/RegisterTask",
    confidence=0.85,
)
# Horovod's stall inspector, repeated while ranks wait on one that never submits (soft: training
# that moves on after it was only slow).
_rule(
    "horovod-stall",
    "stalled",
    80,
    ("waiting for remainder of ranks", "stalled ops"),
    r"waiting for remainder of ranks for more than \d+ seconds|^Stalled ops:",
    soft=True,
    confidence=0.85,
)
# torch.distributed's store-based barrier, printed every few seconds while ranks wait for peers
# that never join (soft: a slow start-up moves on and logs progress after it).
_rule(
    "store-barrier-wait",
    "stalled",
    80,
    ("waiting in store based barrier",),
    r"Waiting in store based barrier to initialize process group",
    soft=True,
    confidence=0.85,
)
_rule(
    "rendezvous-fail",
    "stalled",
    75,
    ("rendezvous", "address already in use", "distnetworkerror", "keep-alive heartbeat"),
    r"RendezvousConnectionError|RendezvousClosedError|DistNetworkError|failed to send a keep-alive heartbeat"
    r"|failed to bind to .{0,40}Address already in use",
    confidence=0.85,
)
_rule(
    "hang-detected",
    "stalled",
    80,
    ("hang", "stuck", "no progress"),
    r"\bhang(?:ing)? detected|training (?:appears|seems) (?:to be )?(?:stuck|hung)"
    r"|no progress (?:for|in) \d+|process (?:is )?stuck",
    confidence=0.85,
)

# --- io_error: disk full, write failures, downloads and network ------------------------------
_rule(
    "disk-full",
    "io_error",
    96,
    (
        "disk is full",
        "no space left",
        "errno 28",
        "disk quota",
        "storagefull",
        "enospc",
        "disk full",
        "not enough disk space",
    ),
    r"No space left on device|\[Errno 28\]|Disk quota exceeded|StorageFull|\bENOSPC\b|disk (?:is )?full"
    r"|Not enough disk space\b",
)  # HF datasets, before it downloads or prepares a dataset
_rule(
    "permission",
    "io_error",
    80,
    ("permission denied", "errno 13]"),
    r"PermissionError: \[Errno 13\]|\[Errno 13\] Permission denied",
    confidence=0.85,
)
_rule(
    "write-failed",
    "io_error",
    95,
    (
        "write incomplete",
        "too many open files",
        "errno 24]",
        "pytorchstreamwriter",
        "errno 116]",
        "file write failed",
        "unexpected pos",
        "read-only file system",
        "input/output error",
        "stale file handle",
        "errno 5]",
        "errno 30]",
        "errno 122]",
        "winerror 32]",
        "error while serializing: ioerror",
        "errno 39]",
        "tmp-checkpoint-",
        "errno 17] file exists:",
    ),
    r"file write failed|PytorchStreamWriter failed|unexpected pos \d+ vs \d+|Read-only file system"
    # Errno 39 (ENOTEMPTY): the Trainer's rename of tmp-checkpoint-* onto a checkpoint dir that exists
    r"|Input/output error|\[Errno (?:5|30|122|116|24|39)\]|Stale file handle|Too many open files"
    r"|FileStream\.Write incomplete|\[WinError 32\]"  # WinError 32: the file is held by another process
    r"|Error while serializing: IoError"  # safetensors' save_file, on the OS's write error
    # the Trainer's staging dir vanished under it while saving (only its save makes tmp-checkpoint-N)
    r"|No such file or directory: '[^'\n]*tmp-checkpoint-\d+"
    # a checkpoint's own (staging) directory already there as the save creates it: Orbax's async save
    # (".../30000.orbax-checkpoint-tmp-0"), a save racing a leftover from a killed run
    r"|\[Errno 17\] File exists: '[^'\n]*(?:checkpoint|ckpt)",
)
_rule(
    "ckpt-save-failed",
    "io_error",
    85,
    (
        "to save",
        "to write",
        "checkpoint save",
        "checkpoint write",
        "checkpoint upload",
        "error saving",
        "error writing",
    ),
    r"(?:failed|unable|could not) to (?:save|write) (?:the )?(?:checkpoint|model|state|adapter)"
    r"|Error writing (?:\(tmp\) )?checkpoint"
    r"|checkpoint (?:save|write|upload) failed|Error saving checkpoint",
    confidence=0.9,
)
_rule(
    "network",
    "io_error",
    90,
    (
        "name or service",
        "no route",
        "chunkedencoding",
        "protocolerror",
        "aiohttp",
        "connect",
        "payload",
        "commerror",
        "run initialization",
        "timed out",
        "timeout",
        "name resolution",
        "getaddrinfo",
        "max retries",
        "ssl",
        "unreachable",
        "resolve",
        "reset by peer",
        "incompleteread",
        "broken pipe",
        "read operation timed out",
        "error: timed out",
        "timeout: timed out",
        "urlopen error",
        "winerror 1006",
        "winerror 1005",
        "transport endpoint",
    ),
    r"(?<!Rendezvous)ConnectionError|ConnectTimeout|ConnectTimeoutError|ReadTimeout(?:Error)?|Read timed out"
    r"|Max retries exceeded|Failed to establish a new connection|Connection refused"
    r"|\bConnection error\.[ \t]*$"  # openai-python's APIConnectionError as a client logs it (not Ray's "exits with a connection error code")
    r"|Connection (?:reset|aborted|broken)|reset by peer|IncompleteRead|RemoteDisconnected"
    r"|Temporary failure in name resolution|Name or service not known|getaddrinfo failed"
    r"|Could not resolve host|Network is unreachable|No route to host|SSLError|SSL: CERTIFICATE"
    r"|ChunkedEncodingError|ProtocolError|httpx\.(?:ConnectError|ReadError|RemoteProtocolError)"
    r"|aiohttp\.client_exceptions|EndpointConnectionError|couldn't connect to 'https?://"
    r"|Connection timed out|Response payload is not completed|CommError|Run initialization has timed out"
    r"|The read operation timed out|(?:TimeoutError|socket\.timeout): timed out$"
    # urllib's wrapper of a socket error; Windows' socket errors (10060 timed out, 10054 reset, 10061 refused, ...)
    r"|<urlopen error \[(?:WinError|Errno) \d+\]|\[WinError 100(?:5\d|6[01])\]"
    # ENOTCONN: on a socket, the peer is gone; on a file, its network mount (Colab's Drive, s3fs, gcsfuse)
    r"|\[Errno 107\] Transport endpoint is not connected",
    soft=True,
    confidence=0.95,
)
_rule(
    "http-error",
    "io_error",
    88,
    (
        "gated repo",
        "is restricted",
        "server error",
        "client error",
        "hfhubhttperror",
        "httperror",
        "too many requests",
        "gateway",
        "service unavailable",
        "gatedrepoerror",
        "unauthorized",
        "forbidden",
    ),
    r"\b5\d\d Server Error|\b429 Client Error|Too Many Requests|HfHubHTTPError|\bHTTPError\b"
    r"|Bad Gateway|Gateway Time-?out|Service Unavailable|GatedRepoError|Cannot access gated repo"
    r"|40[13] Client Error|Unauthorized for url|Access to model .{0,60} is restricted",
    soft=True,
    confidence=0.92,
)
_rule(
    "offline-cache",
    "io_error",
    87,
    (
        "localentrynotfounderror",
        "outgoing traffic has been disabled",
        "consistency check failed",
        "download",
        "headertoolarge",
        "metadataincompletebuffer",
        "incomplete",
        "pytorchstreamreader",
        "invalid load key",
        "unexpected eof",
        "while downloading",
        "url fetch failure",
    ),
    r"LocalEntryNotFoundError|outgoing traffic has been disabled|Consistency check failed"
    r"|download(?:ing)? (?:failed|error|interrupted|incomplete)|failed (?:to download|downloading)"
    r"|\berror (?:occurred |happened )?while downloading\b"  # huggingface_hub's hf_transfer path, and others
    r"|\berror downloading\b|\bURL fetch failure on\b"  # Keras' get_file (its message, and its examples' hint)
    r"|HeaderTooLarge|MetadataIncompleteBuffer|incomplete (?:download|file)"
    r"|PytorchStreamReader failed reading zip archive|invalid load key"
    r"|unexpected EOF, expected \d+ more bytes\. The file might be corrupted",
    confidence=0.9,
)  # torch.load, a cut file
# transformers' "Can't load tokenizer for 'openai/clip-vit-large-patch14'" (and the same for the
# configuration, image processor, feature extractor, processor) is raised when none of the files
# could be fetched: connection errors are swallowed first. For a Hub id (org/name) it is the network
# far more often than a wrong name, which fails earlier as "is not a valid model identifier" (the
# threads' fixes: a mirror, a proxy, pre-downloading). For a local path it stays a config error.
_rule(
    "hub-unreachable",
    "io_error",
    95,
    ("can't load",),
    r"Can't load (?:tokenizer|the configuration of|image processor|feature extractor|processor) (?:for )?"
    r"'[a-z0-9][\w.-]*/[\w.-]+'",
    confidence=0.85,
)
_rule(
    "s3",
    "io_error",
    86,
    ("upload failed", "botocore", "s3", "nosuchbucket", "slowdown", "failed to upload"),
    r"botocore\.exceptions\.\w+|S3UploadFailedError|upload failed|NoSuchBucket|SlowDown|Failed to upload \S+ to\b",
    soft=True,
    confidence=0.85,
)
_rule(
    "retry-warn",
    "io_error",
    35,
    ("retrying", "[retry "),
    r"Retrying in [\d.]+ ?s|\[Retry \d+/\d+\]|Retrying \(Retry\(total=|retrying after",
    soft=True,
    confidence=0.55,
)
_rule(
    "wandb-net",
    "io_error",
    30,
    ("wandb: error", "wandb: network error"),
    r"wandb: (?:ERROR|Network error).{0,80}(?:connect|network|timed? ?out|retry)",
    soft=True,
    confidence=0.5,
)

# --- data_error: dataset, tokenizer, template, schema, config ---------------------------------
_rule(
    "device-assert-data",
    "data_error",
    95,
    ("out of bounds for dimension", "assertion", "device-side assert", "index out of range", "indexselect"),
    r"Assertion `(?:srcIndex < srcSelectDimSize|t >= 0 && t < n_classes|input_val >= zero && input_val <= one"
    r"|idx_dim >= 0 && idx_dim < index_size|index out of bounds|cur_target >= 0 && cur_target < n_classes"
    # ATen's IndexKernel.cu: `-sizes[i] <= index && index < sizes[i] && "index out of bounds"`
    r"|-sizes\[i\] <= index && index < sizes\[i\])[^`]*` failed"
    r"|device-side assert triggered|IndexError: index out of range in self"
    r"|index \S+ is out of bounds for dimension",
)
_rule(
    "template",
    "data_error",
    95,
    ("roles must alternate", "template", "jinja"),
    r"chat_template is not set|Cannot use chat template|jinja2\.exceptions\.\w+"
    r"|Conversation roles must alternate|TemplateError|Template \S+ does not exist"
    r"|unknown (?:chat )?template|No chat template|template .{0,30}not found",
)
_rule(
    "tokenizer",
    "data_error",
    94,
    (
        "text input must",
        "untagged enum",
        "size mismatch",
        "token id",
        "tokenizer",
        "pad",
        "truncation",
        "textencodeinput",
        "text input must be",
    ),
    r"Asking to pad but the tokenizer does not have a padding token|Unable to create tensor, you should probably activate truncation"
    r"|Tokenizer class \S+ does not exist|TextEncodeInput must be|text input must (?:be )?of type"
    r"|Can't load tokenizer|tokenizer\.json.{0,40}(?:not found|missing|corrupt)"
    r"|Exception: data did not match any variant of untagged enum|tokenizer .{0,30}has no attribute"
    r"|vocab(?:ulary)? size mismatch|token id \d+ (?:is )?out of (?:range|vocab)",
)
_rule(
    "dataset",
    "data_error",
    94,
    (
        "datasetgeneration",
        "arrowinvalid",
        "arrowtypeerror",
        "casterror",
        "jsondecodeerror",
        "json parse error",
        "unicodedecodeerror",
        "couldn't cast",
        "column",
        "valid samples",
        "undefined dataset",
        "dataset script",
        "unable to find '",
        "empty",
        "num_samples=0",
        "not found",
        "invalid dataset",
        "dataset format",
        "tokenization strategy",
        "failed to load dataset",
        "datasets.exceptions",
        "splits",
        "expected schema",
        "schema mismatch",
        "keyerror: '",
        "no data",
        "no image",
        "no samples",
        "no training",
        "no valid",
        "stopped: no training batches",
    ),
    r"DatasetGenerationError|DatasetGenerationCastError|ArrowInvalid|ArrowTypeError|CastError"
    r"|JSONDecodeError|JSON parse error|UnicodeDecodeError|Couldn't cast|column .{0,40}not (?:found|in)"
    r"|Column \S+ not in the dataset|No columns in the dataset match|Cannot find valid samples"
    r"|Undefined dataset .{0,60}in dataset_info|Couldn't find a dataset script|Unable to find '[^']+'"
    r"|dataset (?:is )?empty|empty dataset|num_samples=0|Dataset .{0,40}not found"
    r"|Invalid dataset|Please check the dataset format|unhandled prompt tokenization strategy"
    r"|Failed to load dataset|datasets\.exceptions\.\w+|ExpectedMoreSplits|SplitsNotFoundError"
    r"|\bno (?:data|images?|samples|training (?:data|samples|images)|valid (?:data|samples|images)) (?:was |were )?found\b"
    r"|`Trainer\.fit` stopped: No training batches"  # Lightning, when the train dataloader is empty
    r"|NonMatchingSplitsSizesError|doesn't match the expected schema|schema mismatch|KeyError: '(?:text|input|output|instruction|messages|conversations|label|labels|prompt|response|chosen|rejected|content|role|from|value|input_ids|attention_mask)'",
)
_rule(
    "batch-shape",
    "data_error",
    90,
    (
        "batch_size",
        "did not return a loss",
        "target size",
        "labels",
        "target",
        "supply an encoding",
        "batch received was empty",
        "same device",
        "cannot be multiplied",
        "expected scalar type",
        "unscale fp16",
        "purely quantized",
        "stack expects",
        "must be broadcastable",
        "incompatible shapes",
        "label must be",
        "labels must be",
        "_obj.cc:",
        "_obj.cu:",
    ),
    r"Expected input batch_size \(\d+\) to match target batch_size|did not return a loss from the inputs"
    r"|Target size \(.{0,40}\) must be the same as input size|labels? .{0,30}out of (?:range|bounds)"
    r"|Target \d+ is out of bounds|You should supply an encoding or a list of encodings"
    r"|The batch received was empty|Expected all tensors to be on the same device"
    r"|shapes cannot be multiplied|expected scalar type \w+ but found|Attempting to unscale FP16 gradients"
    r"|cannot perform fine-tuning on purely quantized models|stack expects each tensor to be equal size"
    r"|logits and labels must be broadcastable|Incompatible shapes: \["
    r"|\blabels? must be (?:in \[|between|less than|non-?negative)"
    r"|_obj\.(?:cc|cu):\d+: Check failed:",
    confidence=0.92,
)  # XGBoost's objectives check labels against predictions
# XGBoost's and CatBoost's own checks on what they were given ("XGBoostError: ... src/data/data.cc:
# Check failed: labels.Size() == num_row", "CatBoostError: .../target/data_providers.cpp: Target
# contains only one unique value"); their memory and device errors match the heavier rules first.
_rule(
    "gbdt-data",
    "data_error",
    75,
    ("xgboosterror", "catboosterror"),
    r"(?:XGBoostError|CatBoostError):[^\n]{0,200}?(?:\blabels?\b|\btarget\b|\bfeatures?\b|\bcolumns?\b|categor"
    r"|/data/|\bnum_row|\bshape\b|\bdtype\b)",
    confidence=0.85,
)
# ultralytics drops each image whose label names a class beyond the dataset's (soft: the rest may train)
_rule(
    "label-class",
    "data_error",
    85,
    ("exceeds dataset class count",),
    r"Label class \d+ exceeds dataset class count \d+",
    soft=True,
    confidence=0.9,
)
_rule(
    "config",
    "data_error",
    90,
    (
        "unknown ",
        "validationerror",
        "yaml.",
        "scannererror",
        "parsererror",
        "unexpected keyword argument",
        "not found in the base model",
        "please specify",
        "not a valid model identifier",
        "unrecognized",
        "size mismatch for",
        "loading state_dict",
        "missing key(s)",
        "configerror",
        "invalidconfig",
        "invalid config",
        "error: argument",
        "hfargumentparser",
        "invalid choice",
        "unknown optimizer",
        "unknown scheduler",
        "unknown model type",
        "unknown quantization",
        "does not appear to have a file named",
        "configuration file",
        "cannot find config",
        "config.json",
        "invalid arguments!",
        "missingconfigexception",
        "configcompositionexception",
        "which is not available",
        "could not find the monitored key",
        "could not override '",
        "could not append to config",
        "error merging override",
        "is not in struct",
        "missing mandatory value",
    ),
    r"ValidationError|yaml\.(?:scanner|parser|constructor)\.\w+Error|ScannerError|ParserError"
    r"|got an unexpected keyword argument|Target modules .{0,80}not found in the base model"
    r"|Please specify `?\w+`? in|is not a valid model identifier|Unrecognized configuration class"
    r"|Unrecognized model in|size mismatch for|Error\(s\) in loading state_dict|Missing key\(s\) in state_dict"
    r"|ConfigError|InvalidConfig|Invalid config|unrecognized arguments:|error: argument"
    r"|Some specified arguments are not used by the HfArgumentParser|invalid choice:"
    r"|Unknown (?:optimizer|scheduler|model type|quantization)|does not appear to have a file named"
    r"|configuration file .{0,40}not found|Cannot find config|config\.json.{0,20}not found"
    r"|^invalid arguments!"  # Lua Torch's argcheck, before the usage it prints
    r"|\bMissingConfigException\b|\bConfigCompositionException\b"  # Hydra: the run's config does not compose
    # Lightning's callbacks monitoring a metric the module never logs, when they raise (EarlyStopping's
    # strict default, ModelCheckpoint once validation ran); otherwise it is a warning and the run goes on
    r"|(?:RuntimeError|MisconfigurationException): (?:Early stopping|ReduceLROnPlateau) conditioned on metric "
    r".{0,120}? which is not available"
    r"|MisconfigurationException: .{0,80}could not find the monitored key in the returned metrics"
    # Hydra refusing a command-line override, OmegaConf a key its schema lacks or a value never set
    r"|^Could not override '|^Could not append to config\.|^Error merging override "
    r"|\bKey '[^'\n]+' is not in struct\b|\bMissing mandatory value: ",
    confidence=0.92,
)
_rule(
    "config-hint",
    "data_error",
    45,
    ("error: ",),
    r"^\S*Error: .{0,120}(?:should be (?:a|an|one of)|must be (?:a multiple|divisible|one of|greater|less|positive|set)|is not supported for)",
    soft=True,
    confidence=0.65,
)
# A dataset found, loaded or cached with no samples at all ("PreprocessedTensorDataset: 0 samples cached",
# "Found 0 images in ...", the HF Trainer's "Num examples = 0"): the run has nothing to train on.
_rule(
    "no-samples",
    "data_error",
    72,
    (
        " 0 samples",
        " 0 examples",
        " 0 images",
        " 0 valid",
        " 0 training",
        " 0 train ",
        " 0 sequences",
        " 0 records",
        "num examples = 0",
    ),
    r"(?:dataset|found|loaded|loading|cached|contains|has|with|got)\W{0,3}0 (?:valid |usable |training |train )?"
    r"(?:samples|examples|images|sequences|records)\b|\bnum examples = 0\b",
    soft=True,
    confidence=0.8,
)
# ultralytics' dataset scan, per image whose label file it cannot read (soft: training goes on with the rest)
_rule(
    "corrupt-labels",
    "data_error",
    72,
    ("ignoring corrupt image",),
    r"ignoring corrupt image/label:",
    soft=True,
    confidence=0.8,
)
_rule(
    "module-missing",
    "data_error",
    70,
    (
        "modulenotfounderror",
        "importerror",
        "no module named",
        "requires the latest version",
        "requires the following packages",
    ),
    r"ModuleNotFoundError|No module named|ImportError|requires the latest version of|requires the following packages",
    soft=True,
    confidence=0.8,
)
_rule(
    "file-missing",
    "data_error",
    70,
    ("isadirectoryerror", "notadirectoryerror", "filenotfounderror", "no such file or directory", "errno 2]"),
    r"FileNotFoundError|No such file or directory|\[Errno 2\]|IsADirectoryError|NotADirectoryError",
    soft=True,
    confidence=0.8,
)
# LLaVA and its forks (LLaVA-NeXT, ShareGPT4V, ...): the conversation template does not fit the
# tokenizer, so every such sample's labels are masked out and the run learns nothing.
_rule(
    "tokenization-mismatch",
    "data_error",
    50,
    ("tokenization mismatch",),
    r"\btokenization mismatch: \d+ vs\. \d+",
    confidence=0.8,
)
# unsloth refusing to train on tokens whose embeddings were never trained (reserved or special tokens
# in the data, with a base model's untrained rows): the data or the choice of model, not the numbers
# (its message says they would cause NaNs). Its benign form ("... Setting them to the mean") stays quiet.
_rule(
    "untrained-tokens",
    "data_error",
    55,
    ("untrained tokens of",),
    r"\bUntrained tokens of \[.*\] found, but embed_tokens & lm_head not trainable",
    confidence=0.85,
)
_rule(
    "python-bug",
    "data_error",
    40,
    ("error:", "exception:", "assertionerror"),
    r"^[ \t]*\S*(?:KeyError|ValueError|TypeError|IndexError|AttributeError|AssertionError|NameError"
    r"|ZeroDivisionError|NotImplementedError|RecursionError|UnboundLocalError|LookupError)\b:?",
    confidence=0.8,
)

_rule(
    _TRACEBACK_RULE,
    "data_error",
    30,
    ("traceback (most recent call last)", "error: ", "exception: "),
    r"^Traceback \(most recent call last\)|^[\w.]*(?:Error|Exception): ",
    confidence=0.45,
)
_rule(
    "error-words",
    "data_error",
    25,
    ("fatal", "error", "abort", "failed", "crash", "exception"),
    # not on warnings: lines saying "warn", or in glog's/TensorFlow's format a W-level line
    # ("W0821 01:57:42.623 ..." or "2020-06-08 05:30:15.889706: W tensorflow/...")
    # and not on the severity column of an exported Cloud Logging line ("ERROR   2022-01-26 14:19:34 +1100
    # workerpool0-0  ..."): Vertex AI tags everything a job writes to stderr (progress bars too) ERROR
    r"^(?![^\n]*warn)(?!w\d{4} |[\d-]+ [\d:.]+: w )"
    r"(?:error\s+\d{4}-\d\d-\d\d[ t]\d\d:\d\d:\d\d[.,\d]*(?:\s*(?:[+-]\d{4}|z|utc))?\s)?+"
    # (not a metric named so: HiFi-GAN's "Mel-Spec. Error : 0.407")
    r"[^\n]*?\b(?:fatal|error(?![ \t]*:[ \t]*[-+]?\d+\.\d)|aborting|aborted|failed|crashed|exception)\b",
    soft=True,
    confidence=0.4,
)
_rule(
    "abort",
    "cuda_fault",
    35,
    ("aborted (core dumped)", "sigabrt", "terminate called"),
    r"Aborted \(core dumped\)|SIGABRT|terminate called after throwing",
    confidence=0.45,
)

# --- error semantics: a failure word plus what failed ------------------------------------------
# Home-grown scripts and wrappers print failures in their own words ("GPU memory exhausted",
# "weights contain NaN", "waiting for rank 3 ... gave up"). These rules read a line as
# (failure word) + (object) + (what happened to it) instead of an exact phrase. They only fire on
# a line that says something failed (and not on warnings), rank above the generic fallbacks and
# below every specific rule, and are still terminal (weight >= _FATAL_FLOOR).
_FAIL_WORDS = (
    "fatal",
    "error",
    "critical",
    "fail",
    "abort",
    "gave up",
    "giving up",
    "stopping",
    "halting",
    "cannot",
    "can't",
    "could",
    "unable",
    "crash",
    "terminated",
    "exiting",
    "killed",
)
_FAILING_LINE = re.compile(
    r"\bfatal\b|\berror\b|\bcritical\b|\bfail(?:ed|ure|s)?\b|\babort|\bgave up\b|\bgiving up\b|\bstopping\b"
    r"|\bhalting\b|\bcannot\b|\bcan't\b|\bcould ?n[o']t\b|\bunable\b|\bcrash|\bterminated\b|\bexiting\b|\bkilled\b"
)
# (and not a progress bar: llama-recipes' bar reads "Training Epoch: 2/3, step 49/50 completed ...: 100%|")
# (and not one epoch's or step's end: "training done for epoch 3", "epoch 3 training finished")
_UPBEAT_SPOILERS = re.compile(
    r"\berror|\bfail|\bfatal|\babort|\bwarn|\bexception|\bno\b|\bnot\b|\bnever\b|\bwithout\b|n't\b|%\|"
    r"|\b(?:for|of) (?:the )?(?:epoch|step|iteration|batch|fold|round|episode)\b|\bepoch (?:\d+ )?training\b"
)


def _match_line(m: re.Match[str]) -> str:
    text = m.string
    start = text.rfind("\n", 0, m.start()) + 1
    end = text.find("\n", m.end())
    return text[start : end if end >= 0 else len(text)]


def _on_failing_line(m: re.Match[str]) -> bool:
    """The match's line says something failed, and is not a warning."""
    line = _match_line(m)
    return "warn" not in line and _FAILING_LINE.search(line) is not None


def _on_upbeat_line(m: re.Match[str]) -> bool:
    """The match's line has no failure word and no negation ("no step completed"), and is no bar."""
    return _UPBEAT_SPOILERS.search(_match_line(m)) is None


def _failing_line_text(line: str) -> bool:
    return "warn" not in line and _FAILING_LINE.search(line) is not None


def _upbeat_line_text(line: str) -> bool:
    return _UPBEAT_SPOILERS.search(line) is None


def _off_step_dict_text(line: str) -> bool:
    return "'loss':" not in line and '"loss":' not in line


def _off_step_dict(m: re.Match[str]) -> bool:
    """The match's line logs no step's own 'loss' (a closing summary logs 'train_loss')."""
    return _off_step_dict_text(_match_line(m))


# Match checks that depend only on the match's line, as line predicates: a line that fails one
# is skipped before the rule's regex runs (the checks stay the definition).
_LINE_CHECKS: dict[Callable[[re.Match[str]], bool], Callable[[str], bool]] = {
    _on_failing_line: _failing_line_text,
    _on_upbeat_line: _upbeat_line_text,
    _off_step_dict: _off_step_dict_text,
}


def _semantic(name: str, state: str, weight: int, body: str, *, confidence: float = 0.85) -> None:
    _rule(name, state, weight, _FAIL_WORDS, body, confidence=confidence, soft=True, check=_on_failing_line, lazy=True)


_MEM = r"(?:memory|vram|\bram\b|\bhbm\b)"
_semantic(
    "sem-oom",
    "oom",
    58,
    r"\b(?:ran|run|running|is|are|went) out of (?:\w+ ){0,2}"
    + _MEM
    + r"|(?:not enough|insufficient|no (?:more|free)|exhausted|out of) (?:\w+ ){0,2}"
    + _MEM
    + r"|"
    + _MEM
    + r"[^\n]{0,40}?\b(?:exhausted|is full|was full|exceeded|limit (?:reached|hit)|insufficient)"
    + r"|\balloc(?:at(?:e|ion|ing))?\b[^\n]{0,60}?\b(?:failed|fails)\b"
    + r"|(?:failed|unable|could ?n[o']t|cannot) (?:to )?allocate"
    + r"|out-of-memory|\boom[- ]?kill",
)
_semantic(
    "sem-diverged",
    "diverged",
    58,
    r"\b(?:loss(?:es)?|train_loss|gradients?|grads?|grad(?:ient)?[ _]norm|weights?|parameters?|activations?|logits"
    r"|outputs?|update)\b[^\n]{0,40}?(?:\bnan\b|\binf\b|infinit|non-finite|not finite|non-numeric|\bexplod|blew up"
    r"|blown up|\bdiverg|jumped (?:from|to)|spiked?)"
    r"|(?:\bnan\b|\binf\b|non-finite|non-numeric|infinite) (?:values? )?(?:in|detected in|found in) "
    r"(?:the )?(?:loss|gradients?|grads?|weights|parameters|activations|logits)"
    r"|\b(?:nan|inf|non-finite|non-numeric|infinite|invalid) (?:\w+ )?(?:loss|gradients?|grads?|weights|activations)\b",
)
_semantic(
    "sem-cuda",
    "cuda_fault",
    57,
    r"\b(?:gpu|gpus|cuda(?::\d+)?|device|nvidia|driver|accelerator)\b[^\n]{0,40}?\b(?:stopped responding|not responding"
    r"|no longer (?:visible|available|responding|present|accessible)|(?:is |was |got )?lost\b|fell off|fallen off"
    r"|hardware (?:fault|error|failure)|unrecoverable|uncorrectable|crashed|disappeared|went away"
    r"|not (?:found|detected|visible|available)|unavailable|hung\b|reset)"
    r"|\b(?:hardware|device|driver|ecc|xid) (?:fault|failure|error)\b|kernel launch failed",
)
_semantic(
    "sem-io",
    "io_error",
    57,
    r"\b(?:checkpoint|ckpt|volume|disk|filesystem|file system|storage|bucket|upload\w*|download\w*|fetch\w*|sav(?:e|ed|ing)"
    r"|writ(?:e|ing)|sync\w*|network|connection|endpoint|http|hub|s3|mount|nfs|shard)\b[^\n]{0,60}?"
    r"(?:\b(?:is |was )?full\b|no (?:free )?space|out of (?:disk|space)|timed? ?out|unreachable|refused|\breset\b"
    r"|i/o error|io error|\bhttp \d{3}\b|\b(?:50[0-9]|429|403|401)\b|\bretries\b|\btries\b|\battempts\b|read-only|quota"
    r"|failed|could ?n[o']t|cannot|unable)",
)
_semantic(
    "sem-stalled",
    "stalled",
    57,
    r"\b(?:all-?reduce|all-?gather|reduce-?scatter|broadcast|barrier|collective|rendezvous|rank \d+|ranks|peers?"
    r"|workers?|heartbeat|watchdog|nccl|process group|synchroni[sz]\w*)\b[^\n]{0,60}?(?:timed? ?out|did not (?:complete|finish"
    r"|answer|respond|arrive|join)|has not (?:answered|responded|joined|arrived)|no (?:response|answer|reply)"
    r"|not responding|gave up|giving up|stuck|\bhung\b|\bhang|frozen|deadlock)"
    r"|\bno (?:training )?(?:steps?|batch(?:es)?|progress|iterations?|updates?)\b[^\n]{0,30}?\b(?:in|for|within)"
    r" (?:the )?(?:last )?\d+"
    r"|(?:appears|looks|seems|is) (?:to be )?(?:hung|stuck|frozen|deadlocked)",
    confidence=0.85,
)
_rule(
    "sem-hung",
    "stalled",
    57,
    (
        "hung",
        "stuck",
        "frozen",
        "deadlocked",
        "no training",
        "no step",
        "no progress",
        "no batch",
        "no iteration",
        "no update",
    ),
    r"\bno (?:training )?(?:steps?|batch(?:es)?|progress|iterations?|updates?)\b[^\n]{0,30}?\b(?:in|for|within)"
    r" (?:the )?(?:last )?\d+|(?:appears|looks|seems) (?:to be )?(?:hung|stuck|frozen|deadlocked)"
    r"|\b(?:training|run|job|process|step) (?:is |has )?(?:hung|stuck|frozen|deadlocked)\b",
    soft=True,
    confidence=0.85,
    lazy=True,
)
_semantic(
    "sem-data",
    "data_error",
    56,
    r"\b(?:samples?|records?|examples?|rows?|line \d+|fields?|keys?|columns?|templates?|prompts?|dataset|data ?file"
    r"|training file|jsonl?|csv|parquet|schema|tokeni[sz]er|vocab\w*|labels?|config\w*|yaml|arguments?|hyperparam\w*"
    r"|learning_rate|lr|batch_size|values?|variable|sequence)\b[^\n]{0,60}?"
    r"(?:\bmissing\b|malformed|\binvalid\b|\bbad\b|corrupt|unexpected|undefined|\bunknown\b|pars(?:e|ing)|\bempty\b"
    r"|\bexpected\b|must be|not (?:a valid|allowed|supported|defined)|has no\b|mismatch|out of range|decode)"
    r"|\b(?:missing|malformed|invalid|bad|corrupt(?:ed)?|empty|undefined|unknown) (?:\w+ ){0,2}(?:samples?|records?"
    r"|examples?|rows?|fields?|keys?|columns?|templates?|dataset|data|json|schema|tokens?|labels?|config\w*|arguments?"
    r"|variables?|values?)\b",
    confidence=0.8,
)

# --- completed ------------------------------------------------------------------------------------
_rule(
    "completed",
    "completed",
    50,
    (
        "training is",
        "run is",
        "run complete",
        "completed in",
        "optimizer stripped",
        "exits successfully",
        "early stop",
        "run done",
        "final adapter saved",
        "training completed",
        "train metrics",
        "training complete",
        "stopped:",
        "after training is done",
        "finished training",
        "training finished",
        "training done",
        "run finished",
        "saving final",
        "final model saved",
        "status: completed",
        "done training",
        "finished step=",
        "steps reached",
        "epochs reached",
        "iterations reached",
        "finish train",
        "shrink model to",
        "bestiteration =",
        "best iteration",
        "average val",
        "average test",
        "final val",
        "final test",
        "end time of running main",
        "saved final",
        "training was",
        "run was",
        "saving the final",
        "max epochs num!",
        "max frames num!",
        "*** best metric:",
        "saved pipeline to output directory",
        "train completed, best_metric",
        "key: avg_",
        "optimization done",
        "testing using ",
        "- f1-score (micro)",
        "optimization finished!",
        "loss for final step:",
        "eval metrics",
        "test metrics",
        "predict metrics",
        "eval results",
        "last_model_checkpoint: ",
        "reporting training success",
        "training job completed",
        "billable seconds: ",
        "fl finished in ",
        "epoch loaded: ",
    ),
    r"Training completed\. Do not forget|Training Completed!|\*{3,} train metrics \*{3,}"
    r"|`Trainer\.fit` stopped: `max_(?:epochs|steps)=\d+` reached|\[after training is done\]"
    # (ESPnet: "was"; not one epoch's or step's end, as hand-written loops print it: "Training completed
    # for epoch 3", "Training done for epoch 3", "One epoch training finished")
    r"|(?<!epoch )(?<!epochs )\b(?:training|run) (?:is |was )?(?:finished|complete(?:d)?|done)\b(?! *[:=] *(?:false|0))"
    r"(?! *,? *(?:for|of|in) (?:the )?(?:epoch|step|iteration|iter|batch|fold|round|episode)s?\b)"
    # (DLRM prints "Finished training it 1000/2000 of epoch 0" every interval: only the counter at its total ends)
    r"|finished training(?! it (?P<fin_it>\d+)/(?!(?P=fin_it)\b)\d+)|done training|saving (?:the )?final (?:model|adapter|checkpoint)"  # DeepSpeed-Chat: "the"
    r"|\bSaving final epoch checkpoint\."  # torchtune's checkpointers, for the last epoch only
    # SpeechBrain's recipes: the test stage's stats, logged by evaluate() after fit() returned
    r"|\bEpoch loaded: \d+ - test "
    r"|final (?:model|adapter) saved|status: completed|z finished step=\d+"
    r"|^\d+ (?:epochs?|iterations|steps) completed in [\d.]+ ?(?:hours|minutes|seconds|[hms])\b"
    r"|^Optimizer stripped from \S+"  # ultralytics, once the last epoch is done
    r"|\bProcess \d+ exits successfully"  # the DeepSpeed launcher, per process at the end
    r"|\bEarly stop(?:ping)? at epoch \d+|\bEarly stopping triggered|^Epoch \d+: early stopping\b"
    r"|\bmax(?:imum)? (?:training )?(?:steps|epochs|iterations) reached\b|\bFinish train\b"  # llama-recipes, LightGBM
    r"|^Shrink model to first \d+ iterations|^bestIteration = \d+"  # CatBoost, at the end of fit
    # XGBoost's early stop, LightGBM's end of fit ("Early stopping, best iteration is:", "Did not meet
    # early stopping. Best iteration is:", and its R/CLI logger's "Best iteration: N")
    r"|\bStopping\. Best iteration:|\bBest iteration is:|^(?:\[[\d:]+\] )?Best iteration: \d+[ \t]*$"
    r"|^(?:Average|Final) (?:val\w*|test)\b[^\n]{0,40}\u00b1"  # the mean +- spread over repeated runs (OGB, DGL)
    r"|End time of running main:"  # ms-swift, once main() returned
    r"|\[INFO:swift\] last_model_checkpoint: "  # ms-swift, the trainer state it logs after train()
    r"|\bSaved final (?:weights|model|adapters?|checkpoint)s? to\b"  # mlx-lm and many scripts, after the loop
    r"|\bFinal validation metrics:"  # verl's trainer, on its last step before it returns
    r"|^MAX (?:EPOCHS|FRAMES) NUM!"  # rl_games (Isaac Gym, IsaacGymEnvs), as it leaves the loop
    r"|\*\*\* Best metric: \S+ \(epoch \d+\)"  # timm's train.py, after the last epoch
    r"|Saved pipeline to output directory"  # spaCy's `train`, only when the loop ended without an error
    r"|\bTesting using (?:best|final|last state of(?: the)?) model\b"  # flair's ModelTrainer, after the last epoch
    r"|^- F1-score \(micro\) [\d.]+[ \t]*$"  # flair's final test report
    r"|^Optimization Finished!"  # pygcn, GAT and the graph repos built on them, after the epoch loop
    r"|\bLoss for final step: "  # TF Estimator's train(), as it returns
    # HF example scripts' `trainer.log_metrics(...)` banner for evaluate()/predict() after train()
    # (the Trainer's own evaluations during training log a dict, never this banner)
    r"|\*{3,} (?:eval|test|predict) metrics \*{3,}|\*{3,} Eval results \*{3,}"  # (and the older scripts' banner)
    r"|\btrain completed, best_metric:"  # MONAI's training loops, after the last epoch
    # SageMaker: the training toolkit in the container once the entry point exited 0, and the SDK's
    # job log stream (its status line, then the billed time, printed for a completed job only)
    r"|\bReporting training SUCCESS\b|\bCompleted - Training job completed\b|\bBillable seconds: \d+"
    r"|(?:^|\] )Optimization Done\.?[ \t]*$"  # Caffe's solver (glog line, or bare under DIGITS), after max_iter
    # Flower's server once fit() ran every round (its workflows too; start_server since 1.5 logs "Run finished
    # N round(s)", which this rule reads as "run finished")
    r"|\bFL finished in \d"
    r"|^Key: avg_(?:train_prep|train_loss|eval_prep|eval_loss|epoch_time|checkpoint_time), Value: ",  # llama-recipes,
    # printing what train() returned
    confidence=0.95,
)
# The Trainer's closing summary ({'train_runtime': ..., 'train_loss': ...}). unsloth's per-step dicts
# carry train_runtime too, beside the step's own 'loss' (the summary's is 'train_loss').
_rule(
    "trainer-summary", "completed", 50, ("train_runtime",), r"\btrain_runtime\b", confidence=0.95, check=_off_step_dict
)
# A run's closing summary (detectron2's hooks, DSSTNE). detectron2 prints it in a `finally`, after
# an exception too, so it is completion only with no terminal failure before it (`_decide`).
# The whole run's bar (not an epoch's) at N/N: gaussian-splatting's "Training progress", ...
_rule(
    "run-bar-full",
    "completed",
    50,
    ("training progress:", "training:"),
    r"^Training(?: progress)?:\s*100%\|[^|\n]*\|\s*(\d+)/\1\b",
    confidence=0.85,
)
# The shell's `time` report ("real\t0m46.551s"), IPython's `%%time` ("Wall time: 55.2 s"), or Ray
# Tune's as its tuning loop returns ("Total run time: 41.77 seconds (41.75 seconds for the tuning
# loop)."): the process, the notebook cell or the sweep has ended. It is completion only with no
# failure at all before it (`_decide`), since a crash gets the same report (Tune logs "Trials did not
# complete" just before it, when it does not raise).
_rule(
    _EXIT_SUMMARY_RULE,
    "completed",
    50,
    ("real ", "real\t", "wall time: ", "for the tuning loop"),
    r"^real[ \t]+\d+m\d+(?:[.,]\d+)?s[ \t]*$|^Wall time: \d+(?:\.\d+)?(?:min \d+)? ?(?:s|ms|µs|us|ns|min)[ \t]*$"
    r"|\bTotal run time: [\d.]+ seconds \([\d.]+ seconds for the tuning loop\)",
    confidence=0.75,
)
_rule(
    _SUMMARY_RULE,
    "completed",
    50,
    (
        "total training time",
        "training time ",
        "training time: ",
        "best validation loss",
        "best model at step",
        "overall test ",
        " best validation ",
        "best valid :",
        "best valid:",
        "final:",
        "training spent: ",
        "_finish",
    ),
    r"(?<!estimated )(?<!remaining )\bTotal training time\b"
    # DETR's main() and the repos built on it (DeiT, MAE, DINO, ...), after the loop: str(timedelta), with
    # its days past 24 hours ("Training time 1 day, 8:12:40"); litgpt's (and its forks') as train() returns
    r"|^Training time (?:\d+ days?, )?\d+:\d\d:\d\d\b|^Training time: \d+(?:\.\d+)?s[ \t]*$"
    r"|^Best Validation Loss \S+ on Epoch \d+"  # DiffDock's train.py (and its forks), after the epoch loop
    # DeepXDE's Model.train() as it returns, also after a run whose losses went NaN
    r"|^Best model at step \d+:"
    # chemprop's run_training / cross_validate, after the epoch loop and over the folds
    r"|^Model \d+ best validation \S+ = \S+ on epoch \d+|^Overall test \S+ = [-\d.e]+ \+/- [-\d.e]+"
    # RecBole's run_recbole, once fit() and evaluate() returned ("best valid : OrderedDict([...])")
    r"|\bbest valid ?: ?(?:OrderedDict\(|\{)"
    # a script's closing scores, numbers only (spaCy's train_ud.py: "Final:\t84.881\t81.538\t96.845")
    r"|^Final:(?:[ \t]+\d+(?:\.\d+)?%?)+[ \t]*$"
    # modelscope's KAN-TTS recipes, as each model's training returns ("SAMBERT training spent: 0.19 hours")
    r"|\btraining spent: \d+(?:\.\d+)? (?:hours|minutes|seconds)\b"
    # ChainerRL's and pfrl's train_agent* once the loop ends, saving under "<step>_finish" (on an
    # exception it saves "<step>_except" and raises)
    r"|\bSaved the agent to \S*\d_finish\b",
    confidence=0.85,
)
_rule(
    "sem-completed",
    "completed",
    50,
    ("done", "finish", "complete", "succeed", "success", "reached max", "exported", "stored", "written", "exit code 0"),
    r"(?:\b(?:training|fine-?tun(?:e|ing)|run|job|experiment|all (?:\d+ )?(?:steps|epochs|iterations))\b[^\n]{0,30}?"
    r"\b(?:done|finished|complete|completed|succeeded|successful(?:ly)?)\b"
    # (not a step before or beside training: XLA's "successfully finished dry run", "... loading")
    r"|\bsuccess(?:fully)?\b[^\n]{0,30}?\b(?:finished|completed|trained|done)\b"
    r"(?! (?:a |the )?(?:dry[ -]?run|warm-?up|compil|load|initiali[sz]|download|prepar|build|setup|tracing|profil))"
    r"|reached max_?(?:steps|epochs|iters?)\b[^\n]{0,60}?\b(?:final|saving|writing|saved|ok|done)"
    r"|\b(?:final|best) (?:model|weights|adapter|checkpoint)s?\b[^\n]{0,30}?\b(?:saved|written|stored|exported)"
    r"|(?:adapter|weights|model) (?:written|exported|stored|saved) to\b[^\n]{0,80}?\b(?:final|done)"
    r"|\bexit(?:ed)? (?:with )?code 0\b)",
    confidence=0.85,
    check=_on_upbeat_line,
    lazy=True,
)

_ALL_NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(n for r in _RULES for n in r.needles))
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


@dataclass(frozen=True, slots=True)
class _Hit:
    rule: _Rule
    pos: int
    line: str
    line_start: int  # where the hit's line starts, in the index space of `pos`


def _trie_pattern(words: tuple[str, ...]) -> str:
    """One regex alternation of literal words, factored as a trie (one branch per next character).

    The regex engine then tries at most one branch per character at each position instead of
    every word in turn, and its first-character set skips positions no word can start at.
    """
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for c in w:
            node = node.setdefault(c, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(c) + emit(sub) for c, sub in sorted(node.items()) if c]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


# One pass over the tail finds every needle occurrence. The trie is greedy, so a match is the
# LONGEST needle starting at its position; every shorter needle that is a prefix of it is implied.
# The scan resumes after the match, so needles that START INSIDE it come from a static table
# (`_INSIDE`: needles wholly inside it are implied; at offsets where one could run past its end,
# an anchored scan checks the text). Exact, and faster than a zero-width lookahead everywhere.
# Needles that begin with a letter go through the trie scan (its first-character test then skips
# digits, spaces and punctuation, most of a progress log); the few others are found with str.find.
_TRIE_NEEDLES = tuple(n for n in _ALL_NEEDLES if n[0].isalpha())
_FIND_NEEDLES = tuple(n for n in _ALL_NEEDLES if not n[0].isalpha())
_NEEDLE_SCAN = re.compile(_trie_pattern(_TRIE_NEEDLES))
# The tables below are built at import from prefixes looked up in sets and dicts: O(total needle
# length squared), not O(needles squared) (comparing every needle with every other took most of a
# second of every start-up, `tuneharness triage FILE` included).
_NEEDLE_ORDER: dict[str, int] = {n: i for i, n in enumerate(_ALL_NEEDLES)}
_RULES_WITH_NEEDLE: dict[str, tuple[int, ...]] = {}  # needle -> the rules it belongs to, in rule order
for _i, _r in enumerate(_RULES):
    for _n in dict.fromkeys(_r.needles):
        _RULES_WITH_NEEDLE[_n] = (*_RULES_WITH_NEEDLE.get(_n, ()), _i)
# A proper prefix of some needle -> the needles it begins, in needle order.
_LONGER_WITH_PREFIX: dict[str, list[str]] = {}
for _n in _ALL_NEEDLES:
    for _j in range(1, len(_n)):
        _LONGER_WITH_PREFIX.setdefault(_n[:_j], []).append(_n)
del _i, _r, _n, _j


def _needles_starting(text: str) -> list[str]:
    """The needles `text` begins with (itself included), in needle order."""
    return sorted(
        (text[:j] for j in range(1, len(text) + 1) if text[:j] in _NEEDLE_ORDER), key=_NEEDLE_ORDER.__getitem__
    )


_RULES_FOR_MATCH: dict[str, tuple[int, ...]] = {
    longest: tuple(sorted({i for n in _needles_starting(longest) for i in _RULES_WITH_NEEDLE[n]}))
    for longest in _ALL_NEEDLES
}


def _inside(needle: str) -> tuple[tuple[str, ...], tuple[tuple[int, str], ...]]:
    """Needles that begin inside `needle`: those wholly inside it (always present with it), and
    (offset, needle) pairs that start inside it but run past its end (checked in the text)."""
    within: list[str] = []
    straddling: list[tuple[int, str]] = []
    for k in range(1, len(needle)):
        rest = needle[k:]
        within += _needles_starting(rest)
        straddling += [(k, other) for other in _LONGER_WITH_PREFIX.get(rest, ())]
    return tuple(dict.fromkeys(within)), tuple(straddling)


def _rules_for(needles: list[str]) -> tuple[int, ...]:
    return tuple(sorted({i for n in needles for i in _RULES_FOR_MATCH[n]}))


_INSIDE = {n: _inside(n) for n in _ALL_NEEDLES}
# Rules implied by a match (its prefixes and the needles wholly inside it), and the straddlers.
_IMPLIED: dict[str, tuple[int, ...]] = {n: _rules_for([n, *_INSIDE[n][0]]) for n in _ALL_NEEDLES}
# Offsets inside a needle where a straddling needle may begin: one anchored scan at each tells
# which (the longest there; its prefixes are implied).
_STRADDLE_OFFSETS: dict[str, tuple[int, ...]] = {n: tuple(sorted({k for k, _ in _INSIDE[n][1]})) for n in _ALL_NEEDLES}


def _candidate_lines(low: str) -> dict[int, list[tuple[int, int]]]:
    """Per rule index, the (start, end) spans of the lines holding one of its needles, in order."""
    lines: dict[int, list[tuple[int, int]]] = {}
    line_of: dict[int, tuple[int, int]] = {}
    for m in _NEEDLE_SCAN.finditer(low):
        pos = m.start()
        start = low.rfind("\n", 0, pos) + 1
        span = line_of.get(start)
        if span is None:
            end = low.find("\n", pos)
            span = line_of[start] = (start, end if end >= 0 else len(low))
        found = m.group(0)
        idxs: tuple[int, ...] = _IMPLIED[found]
        extra = []
        for k in _STRADDLE_OFFSETS[found]:
            inner = _NEEDLE_SCAN.match(low, pos + k)
            if inner is not None:
                extra.append(inner.group(0))
        if extra:
            idxs = _rules_for([found, *_INSIDE[found][0], *extra])
        for idx in idxs:
            spans = lines.setdefault(idx, [])
            if not spans or spans[-1] != span:
                spans.append(span)
    for needle in _FIND_NEEDLES:
        pos = low.find(needle)
        while pos >= 0:
            start = low.rfind("\n", 0, pos) + 1
            end = low.find("\n", pos)
            span = (start, end if end >= 0 else len(low))
            for idx in _RULES_FOR_MATCH[needle]:
                spans = lines.setdefault(idx, [])
                if span not in spans:
                    spans.append(span)
                    spans.sort()
            pos = low.find(needle, span[1])
    return lines


def _first_match(rule: _Rule, low: str, spans: list[tuple[int, int]]) -> re.Match[str] | None:
    """The first match of a rule, searching only the lines that hold one of its needles.

    Every match of a rule's pattern lies on one line containing one of its needles (a unit test
    checks this on the corpus), so the other lines cannot match.
    """
    line_ok = _LINE_CHECKS.get(rule.check) if rule.check is not None else None
    for start, end in spans:
        if line_ok is not None and not line_ok(low[start:end]):
            continue  # the check would refuse any match on this line: skip the regex
        for m in rule.pattern.finditer(low, start, end):
            if rule.check is None or rule.check(m):
                return m
    return None


def _search(rule: _Rule, low: str) -> re.Match[str] | None:
    """The first match of one rule in a lowercased tail (for tests and tools)."""
    idx = _RULES.index(rule)
    return _first_match(rule, low, _candidate_lines(low).get(idx, []))


def _line_at(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    if end < 0:
        end = len(text)
    line = text[start:end].strip()
    if len(line) > _EVIDENCE_CHARS:
        line = line[:_EVIDENCE_CHARS] + "…"
    return line


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
