"""The matcher compiler of train.log triage's rules: what a rule is, how one is registered, and
how a rule's regular expression is taken apart (its alternatives, each one's leading literals, a
case-folded form) so that it runs only on the lines that can match it. Standard library only.

The catalogue (`app.triage.catalogue`) registers the rules with `_rule`; `app.triage.matcher` builds
the needle tables over all of them; `app.triage.rules` decides.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise


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
