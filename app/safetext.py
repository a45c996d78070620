"""Text from a file or a host, made safe to print: no control characters reach a terminal.

A log or a job file may hold escape sequences (ESC, the C1 CSI U+009B, backspace, carriage
return) that a terminal would obey: clear the screen, retitle the window, overwrite a line.
`printable` escapes each one the way Python writes it (`\\x1b`, `\\x9b`), so what is shown is
what the file says.
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """`text` with every non-printable character (newlines too) escaped: one safe line."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
