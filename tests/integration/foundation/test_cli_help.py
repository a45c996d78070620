"""`--help` reads cleanly: no Python type tags, the everyday verbs before stop and destroy,
`--version`, shell completion, and `triage --help` naming its FILE."""

from __future__ import annotations

import re


def test_help_has_no_type_tags_and_lists_everyday_verbs_first(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("--help")
    assert out.returncode == 0
    assert not re.search(r"<(bool|str|int|float)>", out.stdout), out.stdout
    assert "--install-completion" in out.stdout
    names = re.findall(r"^│ (\w[\w-]*)\s", out.stdout, flags=re.M)
    everyday = ("up", "doctor", "submit", "status", "logs", "cancel", "resume", "receipt")
    assert max(names.index(v) for v in everyday) < min(names.index("stop"), names.index("destroy"))


def test_a_flag_shows_no_type_and_a_value_a_word(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("ledger", "show", "--help").stdout
    assert re.search(r"--json\s+One JSON", out) and re.search(r"--limit\s+INT\s", out)


def test_triage_help_names_its_file_argument(cli) -> None:  # type: ignore[no-untyped-def]
    out = cli("triage", "--help").stdout
    assert "FILE | COMMAND" in out and "tuneharness triage FILE" in out
