"""The needle tables over the whole catalogue, and the search that runs a rule's regex only on the
lines that hold one of its needles (`app.triage.rules` decides on the hits). Standard library
only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.triage.catalogue import _LINE_CHECKS  # importing the catalogue registers every rule
from app.triage.compiler import _RULES, _Rule

_EVIDENCE_CHARS = 240

_ALL_NEEDLES: tuple[str, ...] = tuple(dict.fromkeys(n for r in _RULES for n in r.needles))


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
