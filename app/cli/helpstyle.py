"""How `--help` shows option types: flags show none, values a short conventional word.

typer prints every parameter's Python type in angle brackets (`--json <bool>`, `--job <str>`),
which reads as noise in a help page. This shows nothing for a flag and TEXT, INT, NUMBER or PATH
(click's own convention) for a value; a parameter's explicit `metavar` still wins.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "type_word"]

_WORDS = {"str": "TEXT", "int": "INT", "float": "NUMBER", "Path": "PATH", "file": "PATH", "dir": "PATH"}


def type_word(param: Any, ctx: Any) -> str | None:
    """What the help column shows for `param`: None for a flag."""
    if param.metavar is not None:
        return str(param.metavar)
    if getattr(param, "is_flag", False) and not getattr(param, "count", False):
        return None
    label = str(param.display_type(ctx)).strip("<>")
    word = _WORDS.get(label, label.upper())
    return word + ("..." if param.nargs != 1 else "")


def install() -> None:
    """Use `type_word` for every typer option and argument (the CLI calls this once at import)."""
    from typer.core import TyperArgument, TyperOption

    TyperOption.display_type_rich = type_word  # type: ignore[method-assign, assignment]
    TyperArgument.display_type_rich = type_word  # type: ignore[method-assign, assignment]
