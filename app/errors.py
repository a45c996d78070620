"""One error hierarchy for the whole project.

`UserError` and its children are mistakes a person can fix (bad settings, bad input, a
service that is not running): the CLI prints their message on one line and exits 2, never a
traceback. Each message says what is wrong and what to do next.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "LedgerAppendOnly",
    "LedgerCorrupt",
    "ServiceUnavailable",
    "SettingsError",
    "TuneharnessError",
    "UserError",
]


class TuneharnessError(Exception):
    """Root of every error the project raises on purpose."""


class UserError(TuneharnessError):
    """Something the operator can fix; reported as one line, exit code 2."""

    exit_code = 2


class SettingsError(UserError):
    """An environment variable holds a value that cannot work."""

    def __init__(self, variable: str, problem: str, fix: str) -> None:
        self.variable = variable
        self.problem = problem
        self.fix = fix
        super().__init__(f"{variable}: {problem}. Fix: {fix}")


class ConfigError(UserError):
    """A configuration that would break an invariant (e.g. visibility timeout too short)."""


class ServiceUnavailable(UserError):
    """The broker or the database cannot be reached."""


class BudgetExceeded(TuneharnessError):
    """A reservation would take a budget past its cap; nothing was reserved."""

    def __init__(self, budget: str, cap_usd: float, committed_usd: float, asked_usd: float) -> None:
        self.budget = budget
        self.cap_usd = cap_usd
        self.committed_usd = committed_usd
        self.asked_usd = asked_usd
        super().__init__(
            f"budget {budget!r} refuses ${asked_usd:.4f}: ${committed_usd:.4f} of its "
            f"${cap_usd:.4f} cap is already reserved or spent. Raising the cap is an explicit "
            f"edit: tuneharness budget set {budget} --cap-usd N"
        )


class LedgerAppendOnly(TuneharnessError):
    """The database refused to change or remove a ledger row."""


class LedgerCorrupt(TuneharnessError):
    """The hash chain does not match the rows: something edited the ledger behind the triggers."""

    def __init__(self, seq: int, problem: str) -> None:
        self.seq = seq
        self.problem = problem
        super().__init__(f"ledger corrupt at seq {seq}: {problem}")
