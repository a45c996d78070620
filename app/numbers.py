"""Numbers a person or a host gives: finite, in range, or one line naming the field and the fix.

Every comparison with NaN is false, so a NaN cap never refuses and a NaN price ranks anywhere;
infinity (also what `1e309` parses to) passes every `>= 0` check. Money and counts are therefore
checked where they are parsed, by `finite`, which names the field, the problem and the fix:

    finite(value, "budget_usd", minimum=0, maximum=MAX_USD)

The database refuses non-finite money as well (`app.db.MONEY_COLUMNS`), so a path that skips the
parser still cannot store NaN.
"""

from __future__ import annotations

import math

from app.errors import UserError

__all__ = [
    "MAX_COUNT",
    "MAX_HOURS",
    "MAX_USD",
    "MAX_USD_PER_HOUR",
    "BadNumber",
    "finite",
    "is_finite_number",
    "parse_finite",
    "range_problem",
]

# Upper bounds that no real job reaches, but that keep sums, products and casts exact and finite.
MAX_USD = 1_000_000.0  # a budget or cap, dollars (or GPU minutes)
MAX_USD_PER_HOUR = 1_000.0  # an hourly price
MAX_HOURS = 24.0 * 366  # a duration in hours
MAX_COUNT = 10**9  # steps, seeds, batch sizes and other counts


class BadNumber(UserError):
    """A number that is not a finite value in its range; the message names the field and the fix."""

    def __init__(self, field: str, problem: str, fix: str) -> None:
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}. Fix: {fix}")


def is_finite_number(value: object) -> bool:
    """True for an int or float (not a bool) that is neither NaN nor infinite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)


def _fmt(x: float) -> str:
    return f"{x:g}"


def range_problem(
    value: object, *, minimum: float | None = None, maximum: float | None = None, integer: bool = False
) -> tuple[str, str] | None:
    """(problem, fix) when `value` is not a finite number in [minimum, maximum]; None when it is."""
    want = "a whole number" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        return f"must be {want}, got {type(value).__name__} {value!r}", f"write {want}"
    if isinstance(value, float) and math.isnan(value):
        return "is NaN (not a number)", f"write {want}" + _span(minimum, maximum)
    if isinstance(value, float) and math.isinf(value):
        return "is infinite (or too large to be a number)", f"write a finite {want[2:]}" + _span(minimum, maximum)
    if minimum is not None and value < minimum:
        return f"must be at least {_fmt(minimum)}, got {value}", f"use a value >= {_fmt(minimum)}"
    if maximum is not None and value > maximum:
        return f"must be at most {_fmt(maximum)}, got {value}", f"use a value <= {_fmt(maximum)}"
    return None


def _span(minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f" from {_fmt(minimum)} to {_fmt(maximum)}"
    if minimum is not None:
        return f" >= {_fmt(minimum)}"
    if maximum is not None:
        return f" <= {_fmt(maximum)}"
    return ""


def finite(
    value: object,
    field: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    integer: bool = False,
) -> float:
    """`value` as a float when it is a finite number in [minimum, maximum]; else raise BadNumber."""
    problem = range_problem(value, minimum=minimum, maximum=maximum, integer=integer)
    if problem is not None:
        raise BadNumber(field, *problem)
    assert isinstance(value, int | float)
    return float(value)


def parse_finite(text: str, field: str, *, minimum: float | None = None, maximum: float | None = None) -> float:
    """A number typed by a person (`"12.5"`, not `"nan"`, `"inf"` or `"1e309"`), checked like `finite`."""
    try:
        value = float(text)
    except ValueError:
        raise BadNumber(field, f"{text!r} is not a number", "write a number such as 25 or 12.5") from None
    return finite(value, field, minimum=minimum, maximum=maximum)
