"""The rules stage's fast path (skeleton pre-filter, memories) gives exactly the plain whole-text verdicts."""

from __future__ import annotations

import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.triage import compiler, matcher, rules
from app.triage.corpus import DATA_DIR, REAL_SPLITS, real_rows

ROWS = [
    json.loads(line)
    for split in ("train", "eval", "ood", "handwritten")
    for line in (DATA_DIR / "corpus" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
    if line.strip()
]
HEALTHY = [r["log"] for r in ROWS if r["state"] == "progressing"]
LINES = sorted({ln for r in ROWS for ln in r["log"].splitlines()})

# Things that real tails carry and that the fast path treats specially.
_SPICE = [
    "\x1b[31m",
    "\x1b[0m",
    "\x1b]0;title\x07",
    "\r",
    "\r\n",
    "[rank0]: ",
    "[rank12]:",
    "[default3]: ",
    "[RANK1]: ",
    "[rank\u0663]: ",
    "\x00",
    "\x07",
    "\t",
    "\u212a",
    "\u0130",
    "\u017f",
    "\u03a3",
    "█",
    "Errno 28",
    "ERRNO 5]",
    "exit code 137",
    "OOM",
    "loss: nan",
    "grad_norm: inf",
    "Training completed.",
    "Killed",
    "  ",
    "\n",
    "é",
    "\ud800",
    # needles with digits (their skeletons hold "0" instead, so the line itself is checked), and near misses
    "Error 802:",
    "Error 809:",
    "bf16",
    "bf61",
    "[Errno 13]",
    "[Errno 31]",
    "[Errno 116]",
    "[Errno 2]",
    "[Errno 22]",
    "S3",
    "s4",
    "num_samples=0",
    "num_samples=7",
    "unscale FP16",
    "exit code 0",
    "exit code 9",
    "errno 24]",
]


def _shake(rng: random.Random, text: str) -> str:
    """A tail as a long log might end: healthy progress before it, some lines moved or repeated, and
    ANSI colours, carriage returns, rank prefixes, control bytes and odd characters sprinkled in."""
    lines = text.split("\n")
    for _ in range(rng.randrange(4)):
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    for _ in range(rng.randrange(4)):
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(LINES))
    for _ in range(rng.randrange(6)):
        i = rng.randrange(len(lines))
        k = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:k] + rng.choice(_SPICE) + lines[i][k:]
    pad = ""
    target = rng.choice([0, 0, 2_000, 8_192, 32_768, 40_000])
    while len(pad) < target:
        pad += rng.choice(HEALTHY)
    return (pad + "\n".join(lines))[-max(target, 1) :] if target else "\n".join(lines)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_fast_classify_equals_the_reference_on_padded_shuffled_spiced_tails(seed: int, forget: bool) -> None:
    """Property: for corpus tails padded, shuffled and spiced at random, the fast path's verdict equals the reference's."""
    rng = random.Random(seed)
    row = rng.choice(ROWS)
    tail = _shake(rng, row["log"])
    idle = rng.choice([None, row["idle_seconds"], 5.0, 5000.0, float("nan")])
    if forget:
        rules._forget()
    assert rules.classify(tail, idle_seconds=idle) == rules._classify_reference(tail, idle_seconds=idle)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=400), st.sampled_from(LINES), st.integers(0, 3))
def test_fast_classify_equals_the_reference_on_arbitrary_text(noise: str, line: str, copies: int) -> None:
    """Property: arbitrary text (surrogates, controls, any script) around a real log line gets the reference verdict."""
    tail = "\n".join([noise, *[line] * copies, noise[::-1]])
    assert rules.classify(tail, idle_seconds=30) == rules._classify_reference(tail, idle_seconds=30)


@pytest.mark.long
def test_every_corpus_row_and_its_long_variants_get_the_reference_verdict() -> None:
    """Given every committed row, as generated and padded to 32 KB of healthy progress, both paths agree."""
    rng = random.Random(1)
    for row in ROWS:
        pad = "".join(rng.sample(HEALTHY, 30))
        for tail in (row["log"], (pad + row["log"])[-32_768:]):
            fast = rules.classify(tail, idle_seconds=row["idle_seconds"])
            assert fast == rules._classify_reference(tail, idle_seconds=row["idle_seconds"]), row["id"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LINES), st.text(alphabet="0123456789 :=-_[]'\"ABCabc|%", max_size=12), st.integers(0, 200))
def test_a_line_is_a_candidate_for_exactly_the_rules_it_holds_a_needle_of(line: str, extra: str, at: int) -> None:
    """Property: the skeleton profile (plus the digit needles checked in the line) names exactly the rules with a needle in the line."""
    line = line[:at] + extra + line[at:]
    raw = line.encode("utf-8", errors="replace")
    low = raw.lower()
    profiles: dict[bytes, rules._Profile] = {}
    skeleton = raw.translate(rules._SKELETON)
    rules._learn([skeleton], profiles)
    prof = profiles[skeleton]
    found: set[int] = set()
    if prof:
        exact, digits, _ = prof  # type: ignore[misc]
        found = set(exact) | {r for needle, rs in digits if needle in low for r in rs}
    text_low = rules._lower_same_length(raw.decode("utf-8"))
    expected = {i for i, rule in enumerate(rules._RULES) if any(n in text_low for n in rule.needles)}
    assert found == expected


# What the end-of-log checks read (loss series, epoch counters, bars, NaN rows, grad norms), and
# letters outside ASCII that case mapping changes, one that lowercases to two characters, digits
# of other scripts, and characters of two to four bytes.
_END_PARTS = [
    "loss",
    "Loss: ",
    "'loss': ",
    "loss=",
    "1.5",
    "2e3",
    "4000.0",
    "0.0",
    "nan",
    "inf",
    "-inf",
    "Epoch 3/3",
    "epoch: 2/2",
    "100%|",
    "██████████|",
    " 10/10 [==========]",
    "[=====>....]",
    "grad_norm: ",
    "\n",
    "\n",
    "12 ",
    "\t",
    " ",
    "Σ",
    "É",
    "Д",
    "İ",
    "ǅ",
    "Ⅰ",
    "٣",
    "é",
    "€",
    "😀",
    "ß",
    "ΣLOSS",
    "ÉPOCH",
    "{'loss': 0.4821, 'grad_norm': 1.25, 'learning_rate': 1.9e-05, 'epoch': 0.51}\n" * 8,
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(_END_PARTS), max_size=200), st.integers(0, 6000), st.booleans())
def test_the_end_of_a_tail_outside_ascii_reads_as_the_reference_reads_it(parts: list[str], pad: int, bar: bool) -> None:
    """Property: the end-of-log checks give the reference verdict on tails that are not ASCII (the
    fast path lowercases that window as bytes, which leaves non-ASCII letters as they are)."""
    filler = ("Σ step ██ ok\n" if bar else "step ok\n") * (pad // 12)
    tail = filler + "".join(parts)
    for log in (tail, tail.encode("utf-8")):
        assert rules.classify(log, idle_seconds=30) == rules._classify_reference(tail, idle_seconds=30)


_PLAIN_LOSS_VALUE = re.compile(r"""(?:['"]loss['"]\s*:\s*|\bloss\s*[=:]?\s*)([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)""")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["loss", "'loss'", '"loss"', ": ", "=", " ", "1.5", "-2e-3", "x", "_", "\n", "é", "0"]),
        max_size=30,
    )
)
def test_the_literal_first_loss_pattern_reads_the_same_values_on_the_same_lines(parts: list[str]) -> None:
    """Property: the literal-first loss-value regex finds the same numbers, each on the same line, as the plain pattern."""
    text = "".join(parts)

    def read(pattern: re.Pattern[str]) -> list[tuple[str, int]]:
        return [(m.group(1), text.count("\n", 0, m.start())) for m in pattern.finditer(text)]

    assert read(rules._LOSS_VALUE) == read(_PLAIN_LOSS_VALUE)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(LINES), st.text(alphabet="Ssſ\u212aKkIıİ%|: =0123456789", max_size=10), st.integers(0, 100))
def test_the_progress_check_by_parts_equals_the_whole_regex(line: str, extra: str, at: int) -> None:
    """Property: `_is_progress` answers exactly as a search with the whole progress regex (case folding included)."""
    line = line[:at] + extra + line[at:]
    assert rules._is_progress(line) == (rules._PROGRESS.search(line) is not None)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.integers(0, 60))
def test_the_last_progress_line_over_skeletons_is_the_one_the_whole_text_search_finds(
    seed: int, forget: bool, noisy: int
) -> None:
    """Property: walking back over the lines' skeletons finds the same last progress line (at the same
    place) as the marker search over the whole text, past up to 40 lines that hold a marker but are
    no progress, and with the marker memory emptied (another thread) as well."""
    rng = random.Random(seed)
    tail = _shake(rng, rng.choice(ROWS)["log"]).replace("\r", "\n").replace("\x1b", "")
    lines = tail.split("\n")
    for _ in range(noisy):  # marker words on lines that are no progress
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(["loss of precision |", "epoch", "see images", "|"]))
    # (lone surrogates and the Kelvin sign take the reference path, never this one)
    text = rules.normalise("\n".join(lines)).replace("\ud800", "").replace("\u212a", "K")
    raw = text.encode("utf-8")
    rules._forget()
    prepared = rules._prepare(raw, ranks_done=True)
    assert prepared is not None
    raw, skeletons, _ = prepared
    if forget:
        rules._MARKED.clear()
    pos, line = rules._last_progress_lines(raw, skeletons)
    want_pos, want_line = rules._last_progress(text, rules._lower_same_length(text))
    assert line == want_line
    assert (pos < 0) == (want_pos < 0)
    if pos >= 0:
        assert len(raw[:pos].decode("utf-8")) == want_pos


@pytest.mark.parametrize("after", [38, 39, 40, 41])
def test_the_search_for_the_last_progress_line_gives_up_after_40_lines_with_a_marker(after: int) -> None:
    """Past 39 lines that hold a progress marker but are no progress, the progress line before them
    is still found; past 40 it is not, in both searches."""
    text = "{'loss': 0.5, 'learning_rate': 1e-05, 'epoch': 1.0}\n" + "see the images |\nplain\n" * after
    rules._forget()
    prepared = rules._prepare(text.encode(), ranks_done=True)
    assert prepared is not None
    raw, skeletons, _ = prepared
    found = rules._last_progress_lines(raw, skeletons)
    assert found == rules._last_progress(text, text.lower())
    assert (found[0] == 0) == (after < 40)


def _whole_first(rule: rules._Rule, line_low: str) -> int:
    """A rule's first match in one lowercased line with its whole pattern (what `_first_in_line` shortens)."""
    for m in rule.pattern.finditer(line_low):
        if rule.check is None or rule.check(m):
            return m.start()
    return -1


REAL_LINES = sorted({ln for split in REAL_SPLITS for r in real_rows(split) for ln in r["log"].splitlines()})


@pytest.mark.long
def test_every_rule_finds_its_first_match_by_alternatives_where_the_whole_pattern_does() -> None:
    """On every distinct line of the corpus and of the real excerpts, each rule's first match found
    alternative by alternative (only those whose literals the line holds) starts where the whole pattern's does."""
    split = [r for r in rules._RULES if r.parts is not None]
    assert len(split) >= 70  # the cut covers most rules; a regression to whole-pattern search shows here
    for line in LINES + REAL_LINES:
        low = rules._lower_same_length(line)
        for rule in split:
            assert rules._first_in_line(rule, low) == _whole_first(rule, low), (rule.name, line)


@settings(max_examples=400, deadline=None)
@given(
    st.sampled_from(LINES),
    st.sampled_from(sorted({lit for r in rules._RULES for lits, _ in r.parts or () for lit in lits or ()})),
    st.integers(0, 200),
    st.text(alphabet="nafe:= 0.1()\t-_", max_size=8),
)
def test_a_line_given_a_rule_literal_gets_the_same_first_match_by_alternatives(
    line: str, literal: str, at: int, extra: str
) -> None:
    """Property: with one of the rules' literals (and noise) put into a line, every rule still finds
    the same first match alternative by alternative as with its whole pattern."""
    low = rules._lower_same_length(line[:at] + literal + extra + line[at:])
    for rule in rules._RULES:
        if rule.parts is not None:
            assert rules._first_in_line(rule, low) == _whole_first(rule, low), rule.name


@pytest.mark.parametrize(
    ("alternative", "literals"),
    [
        ("loss (?:is|became) nan", ("loss ",)),
        (r"\bgave (?:a )?nan loss\b", ("gave ",)),
        (r"(?<!rendezvous)connectionerror", ("connectionerror",)),
        (r"\b(?:ran|run|went) out of", ("ran", "run", "went")),
        (r"(?:memory|vram|\bram\b)[^\n]{0,40}?full", ("memory", "vram", "ram")),
        (r"grad(?:ient)?[ _]norm", ("grad",)),
        (r"cross_?entropy", ("cross",)),  # the "_" is optional: the literal stops before it
        (r"sslerror|ssl: certificate", ("sslerror", "ssl: certificate")),  # (taken as a group)
        (r"sslerror|x", None),  # a one-character literal is not worth a test
        (r"\[errno 2\]", ("[errno 2]",)),
        (r"a+bc", None),  # one character, then a quantifier
        (r"(?:ab|cd)?ef", None),  # an optional group holds no required literal
        (r"\d+ steps", None),
        (r"^(?:\S*: line \d+: +\d+ )?killed\b", None),
    ],
)
def test_the_leading_literals_of_an_alternative_are_held_by_every_match(
    alternative: str, literals: tuple[str, ...] | None
) -> None:
    """What `_leading_literals` takes as the literals of which every match holds one."""
    if "|" in alternative and not alternative.startswith("(?:"):
        alternative = f"(?:{alternative})"
    assert compiler._leading_literals(alternative) == literals


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(["[rank0]:", "[rank12]: ", "[default1]:", "[rank\u0663]:", "\n", "x", " ", "[rank"]),
        max_size=20,
    )
)
def test_rank_prefixes_are_stripped_as_the_multiline_regex_strips_them(parts: list[str]) -> None:
    """Property: the literal-first rank-prefix substitution equals `_RANK_PREFIX.sub` (line starts only, Unicode digits)."""
    text = "".join(parts)
    assert rules._strip_rank_prefixes(text) == rules._RANK_PREFIX.sub("", text)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["\x1b[31m", "\x1b[0m", "\x1b]0;t\x07", "\x1b]8;;x\x1b\\", "\x1b", "\x1b[", "é", "█", "a", "\x07", "\n"]
        ),
        max_size=20,
    )
)
def test_ansi_escapes_are_removed_from_the_encoded_tail_as_from_the_text(parts: list[str]) -> None:
    """Property: the bytes version of the ANSI regex removes exactly the encoded characters the text version removes."""
    text = "".join(parts)
    assert rules._ANSI_BYTES.sub(b"", text.encode("utf-8")) == rules._ANSI.sub("", text).encode("utf-8")


def test_the_memories_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Given small limits, triaging many distinct lines never lets a memory grow past its limit (plus one tail)."""
    monkeypatch.setattr(rules, "_PROFILES_MAX", 50)
    monkeypatch.setattr(rules, "_LINE_MATCHES_MAX", 50)
    rules._forget()
    for i in range(300):
        rules.classify(f"step {i} error: field_{'x' * (i % 40)}_{chr(97 + i % 26)} is invalid\nline {i}\n")
        assert len(rules._PROFILES) <= 50 + 3
        assert len(rules._SPECIFIC_MATCHES) + len(rules._LAZY_MATCHES) <= 50 + 4
    monkeypatch.setattr(rules, "_PROFILES_MAX_BYTES", 100_000)
    for i in range(30):
        rules.classify(f"{chr(97 + i % 26) * 30_000} error {i}\n")
        assert sum(map(len, rules._PROFILES)) <= 100_000 + 30_100
    rules._forget()


def test_a_memory_emptied_by_another_thread_meanwhile_falls_back_to_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Given the skeleton memory emptied right after new shapes were learned, the verdict is still the reference's."""
    learn = rules._learn

    def learn_then_lose(skeletons: list[bytes], profiles: dict[bytes, rules._Profile]) -> None:
        learn(skeletons, profiles)
        profiles.clear()

    monkeypatch.setattr(rules, "_learn", learn_then_lose)
    rules._forget()
    tail = ROWS[0]["log"] + "torch.OutOfMemoryError: CUDA out of memory.\n"
    assert rules.classify(tail) == rules._classify_reference(tail)
    assert rules.classify(tail).state == "oom"


_PLAIN_GRAD_NORM_VALUE = re.compile(
    r"""\bgrad[ _]norm['"]?\s*[:=]?\s*['"]?([-+]?(?:nan|inf(?:inity)?|[\d.]+(?:e[-+]?\d+)?))"""
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            ["grad_norm", "grad norm", "xgrad_norm", "'", ": ", "=", " ", "1.5", "inf", "-nan", "é", "\n", "_", "grad"]
        ),
        max_size=30,
    )
)
def test_the_literal_first_grad_norm_pattern_reads_the_same_values(parts: list[str]) -> None:
    """Property: the literal-first grad-norm regex finds the same values as the plain pattern."""
    text = "".join(parts)
    assert rules._GRAD_NORM_VALUE.findall(text) == _PLAIN_GRAD_NORM_VALUE.findall(text)


def test_tails_whose_every_line_carries_a_torchrun_rank_prefix_get_the_reference_verdict() -> None:
    """Given corpus tails with "[rankN]: " before every line (torchrun >= 2.2 workers), both paths agree."""
    rng = random.Random(3)
    for row in rng.sample(ROWS, 200):
        prefix = rng.choice(["[rank0]: ", "[rank3]:", "[default1]: ", "[rank\u0663]: "])
        tail = "".join(prefix + ln for ln in row["log"].splitlines(keepends=True))
        assert rules.classify(tail, idle_seconds=row["idle_seconds"]) == rules._classify_reference(
            tail, idle_seconds=row["idle_seconds"]
        ), row["id"]


def test_threads_sharing_the_skeleton_memory_get_the_reference_verdicts() -> None:
    """Given several threads classifying different tails at once (each noting its own lookup misses
    in the shared skeleton memory, one of them emptying it now and then), every verdict is the reference's."""
    import threading

    rng = random.Random(5)
    rows = rng.sample(ROWS, 120)
    expected = [rules._classify_reference(r["log"], idle_seconds=r["idle_seconds"]) for r in rows]
    wrong: list[str] = []

    def work(k: int) -> None:
        for n, (row, want) in enumerate(zip(rows[k::4], expected[k::4], strict=True)):
            if k == 0 and n % 5 == 0:
                rules._forget()
            if rules.classify(row["log"], idle_seconds=row["idle_seconds"]) != want:
                wrong.append(row["id"])

    rules._forget()
    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rules._forget()
    assert wrong == []


_BAD_BYTES = [
    b"\xff",
    b"\xc3",
    b"\xe2\x84",
    b"\x80\x80",
    b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80",
    b"\xe2\x84\xaa",
    b"\xc3\xa9",
]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 4), st.integers(0, 40))
def test_bytes_as_read_get_the_verdict_of_their_lenient_decoding(seed: int, bad: int, cut: int) -> None:
    """Property: a tail given as bytes (invalid UTF-8 sprinkled in, or cut inside a character)
    gets the verdict of its last DEFAULT_MAX_CHARS bytes decoded with errors="replace"."""
    rng = random.Random(seed)
    row = rng.choice(ROWS)
    raw = _shake(rng, row["log"]).encode("utf-8", errors="surrogatepass")
    for _ in range(bad):
        k = rng.randrange(len(raw) + 1)
        raw = raw[:k] + rng.choice(_BAD_BYTES) + raw[k:]
    raw = raw[cut:]
    idle = rng.choice([None, row["idle_seconds"], 5000.0])
    text = raw[-rules.DEFAULT_MAX_CHARS :].decode("utf-8", errors="replace")  # bytes are bounded in bytes
    assert rules.classify(raw, idle_seconds=idle) == rules.classify(text, idle_seconds=idle)
    assert rules.classify(raw, idle_seconds=idle) == rules._classify_reference(text, idle_seconds=idle)


def test_a_file_read_as_bytes_gets_the_verdict_of_the_file_read_as_text(tmp_path) -> None:
    """Given logs with invalid UTF-8 in the deciding line, in a line no rule reads, and a tail longer
    than the read, `read_tail_bytes` + classify answers what `read_tail` + classify answers."""
    oom = b"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB \xff\xfe\n"
    healthy = "".join(HEALTHY[:40]).encode("utf-8")
    for i, data in enumerate(
        [oom, healthy + b"noise \xc3\x28 here\n" + oom, b"\xe2\x82" + healthy[-50_000:], healthy * 3 + b"\xff" * 10]
    ):
        path = tmp_path / f"train{i}.log"
        path.write_bytes(data)
        assert rules.classify(rules.read_tail_bytes(path)) == rules.classify(rules.read_tail(path)), i
    assert rules.classify(rules.read_tail_bytes(tmp_path / "train0.log")).state == "oom"


def test_the_needle_tables_are_what_their_definitions_say() -> None:
    """The needle tables are built from prefixes looked up in sets (fast at import); they must hold
    exactly what comparing every needle with every other gives (checked on a tenth of them)."""
    needles = rules._ALL_NEEDLES
    for needle in needles[::10]:
        within, straddling = [], []
        for k in range(1, len(needle)):
            rest = needle[k:]
            for other in needles:
                if rest.startswith(other):
                    within.append(other)
                elif other.startswith(rest):
                    straddling.append((k, other))
        assert matcher._INSIDE[needle] == (tuple(dict.fromkeys(within)), tuple(straddling)), needle
        assert matcher._RULES_FOR_MATCH[needle] == tuple(
            i for i, r in enumerate(rules._RULES) if any(needle.startswith(n) for n in r.needles)
        ), needle
    for f in rules._SK_TRIE[::10]:
        assert rules._SK_WITHIN[f] == frozenset(n for n in rules._SK_NEEDLES if n in f), f
        assert rules._SK_PREFIXES[f] == frozenset(n for n in rules._SK_NEEDLES if f.startswith(n)), f
        assert rules._SK_STRADDLE[f] == tuple(
            k for k in range(1, len(f)) if any(n.startswith(f[k:]) and len(n) > len(f) - k for n in rules._SK_TRIE)
        ), f
