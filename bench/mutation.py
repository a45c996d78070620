"""Mutation testing of the policy that decides money: do its tests fail when its code is wrong?

    .venv/bin/python bench/mutation.py                  # mutmut run from scratch, then the tables
    .venv/bin/python bench/mutation.py --no-run         # the tables from the last run's mutants/

mutmut 3 (configured in pyproject.toml's `[tool.mutmut]`) copies `app/` into `mutants/`, rewrites
each function of the money modules (budget levels, idle watchdog, kill-time, reconciler,
reservations and budget stops, preflight judgement and the speeds it judges against, ranking and
the all-in price, price increases) into many variants that each carry one change (`<` for `<=`,
`0.95` for `0.8`, a dropped argument, ...), and runs the fast unit tests that call the function
against each variant. A variant whose tests all pass *survived*: the tests do not pin that line.

Every survivor either gets a test that kills it (tests/unit/policy/test_mutants_*.py) or is
explained in `EQUIVALENT` below: a change no input can tell from the original (a comparison at a
point where both branches give the same value, a branch no caller can reach, `float("INF")` for
`float("inf")`). The names are mutmut's, stable while the module's source is; after an edit to a
mutated module the names shift, the run lists its survivors as unexplained, and each gets a test
or a reason again (`mutmut show <name>` prints the change).

Exits 1 when the kill rate is below `--min-kill-rate` (0.90) or a survivor is unexplained. Writes
`bench/results/mutation.json`: the kill rate per module and overall, and every survivor with its
function, line, change and the reason it survives. The run takes a few minutes on two workers
(`--max-children`, default 2); the wall time of the mutmut run is in the results' `raw` (None
with `--no-run`, which only re-reads mutants/).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import _results

REPO = Path(__file__).resolve().parents[1]
MUTANTS = REPO / "mutants"

# What counts as caught (mutmut's names for its exit codes): a test failed, the tests ran past the
# CPU limit mutmut derives from their clean duration (an endless loop is caught), a test crashed
# the interpreter.
CAUGHT = frozenset({"killed", "timeout", "segfault", "caught by type check"})

# mutant name -> why no test can tell it from the original (one line). Only equivalent mutants
# belong here; a mutant a test could kill gets the test instead.
_BOOL_DEFAULT = "bool() of the missing key's default: None (or no default, None) is as false as False"
EQUIVALENT: dict[str, str] = {
    "app.policy.guardrails.x_believable_checkpoint_step__mutmut_6": (
        "at checkpoint == previous both branches return the same number"
    ),
    "app.policy.guardrails.x_believable_step__mutmut_6": "at step == previous both branches return the same number",
    "app.policy.guardrails.x_reconcile__mutmut_50": (
        "the label parsed as ours, so it is a non-empty string and `or` never reaches the default"
    ),
    "app.policy.fleet.x_hold_terms__mutmut_15": (
        "at hold_until == kill_at the replace sets hold_until to the value it already has"
    ),
    "app.policy.fleet.x_pool_target__mutmut_1": (
        "configured == 0 reaches standby_pool_size, which returns max(0, configured) = 0 for it"
    ),
    "app.policy.fleet.x_refill_chains__mutmut_1": (
        "missing == 0 gives max(0, 0 * width - pending) = 0: pending counts chains, never < 0"
    ),
    "app.policy.preflight.x__judge_speed__mutmut_8": (
        "a healthy figure of 0.0 is falsy, so `and` decides before `> 0` vs `>= 0` is read"
    ),
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_42": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_44": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_56": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_58": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_84": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_86": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_98": _BOOL_DEFAULT,
    "app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_100": _BOOL_DEFAULT,
    "app.policy.speeds.x_per_machine__mutmut_10": 'float() reads "INF" as infinity, the same value as "inf"',
    "app.policy.ranking.x__rank__mutmut_67": 'float() reads "INF" as infinity, the same value as "inf"',
    "app.policy.ranking.x_offer_rejection__mutmut_14": (
        "is_quarantined(None) is False, so a quarantined offer always has a (truthy) record"
    ),
    "app.policy.ranking.x_offer_rejection__mutmut_15": (
        "the `''` branch is unreachable: is_quarantined(None) is False"
    ),
    "app.policy.ranking.x_pull_seconds__mutmut_5": (
        "a speed of 0 is falsy, so `and` decides before `> 0` vs `>= 0` is read"
    ),
    "app.policy.ranking.x_rank_offers__mutmut_1": (
        'only "prior" is tested for; any other default string ranks as "fallback" does'
    ),
    "app.policy.ranking.x_rank_offers__mutmut_2": (
        'only "prior" is tested for; any other default string ranks as "fallback" does'
    ),
    "app.policy.ranking.x_rank_offers__mutmut_31": (
        "with a floor of 0 the second pass re-ranks with an equal Requirements: the same empty list"
    ),
}


@dataclass(frozen=True)
class Survivor:
    name: str
    module: str
    function: str
    line: int | None
    change: str
    status: str


def _mutatable_files() -> list[Path]:
    """The files `[tool.mutmut] only_mutate` names, relative to the repository."""
    import tomllib

    cfg = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    return [Path(p) for p in cfg["only_mutate"]]


def _exit_codes(path: Path) -> dict[str, int | None]:
    meta = MUTANTS / f"{path}.meta"
    if not meta.exists():
        raise SystemExit(f"{meta.relative_to(REPO)} is missing: run without --no-run first")
    codes: dict[str, int | None] = json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
    return codes


def _split_name(name: str) -> tuple[str, str | None, str]:
    """`app.policy.preflight.xǁPreflightReportǁfrom_mapping__mutmut_12` -> (module, class, function)."""
    module, _, generated = name.rpartition(".")
    generated = re.sub(r"__mutmut_\d+$", "", generated)
    if generated.startswith("xǁ"):
        _, cls, func = generated.split("ǁ")
        return module, cls, func
    return module, None, generated.removeprefix("x_")


def _span(source: str, cls: str | None, func: str) -> tuple[int, int] | None:
    """The first and last line of `func` (in class `cls`, if given) in the module's original
    source; the first is its first decorator's, else its `def`'s."""
    tree = ast.parse(source)
    scope: list[ast.stmt] = tree.body
    if cls is not None:
        owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        if owner is None:
            return None
        scope = owner.body
    for node in scope:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == func:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            return first, node.end_lineno or node.lineno
    return None


def _short(old: str, new: str) -> str:
    """One line that shows what changed: the differing middle of the two lines, with context."""
    old, new = old.strip(), new.strip()
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    end = 0
    while end < min(len(old), len(new)) - start and old[len(old) - 1 - end] == new[len(new) - 1 - end]:
        end += 1
    # Widen to whole tokens: `False` -> `None`, not `Fals` -> `Non`; `<` -> `<=`, not `` -> `=`.
    stops = " ([{,:)]}"
    while start > 0 and old[start - 1] not in stops:
        start -= 1
    while end > 0 and old[len(old) - end] not in stops:
        end -= 1
    old_mid, new_mid = old[start : len(old) - end], new[start : len(new) - end]
    context = old if len(old) <= 90 else old[max(0, start - 40) : start + len(old_mid) + 40]
    if not new_mid:
        return f"`{old_mid}` removed in `{context}`"
    if not old_mid:
        return f"`{new_mid}` inserted in `{context}`"
    return f"`{old_mid}` → `{new_mid}` in `{context}`"


def _describe(diff: str, source_lines: list[str], span: tuple[int, int] | None) -> tuple[int | None, str]:
    """The source line of the first changed line and the change in one line, from mutmut's diff of
    the function. The diff numbers lines from the function's text as mutmut copied it (comments
    above the `def` included), so the line is found by its text within the function, the nearest
    to that estimate when the text repeats."""
    lines = diff.splitlines()
    hunk = next((i for i, ln in enumerate(lines) if ln.startswith("@@")), None)
    if hunk is None:
        return None, "(no diff)"
    m = re.match(r"@@ -(\d+)", lines[hunk])
    body = lines[hunk + 1 :]
    old = [ln[1:] for ln in body if ln.startswith("-")]
    new = [ln[1:] for ln in body if ln.startswith("+")]
    line = None
    if m and span is not None:
        context_before = next((i for i, ln in enumerate(body) if ln.startswith(("-", "+"))), 0)
        estimate = span[0] + int(m.group(1)) - 1 + context_before
        same = [n for n in range(span[0], span[1] + 1) if old and source_lines[n - 1].strip() == old[0].strip()]
        line = min(same, key=lambda n: abs(n - estimate)) if same else estimate
    if len(old) == 1 and len(new) == 1:
        return line, _short(old[0], new[0])
    removed = " / ".join(s.strip() for s in old) or "(nothing)"
    added = " / ".join(s.strip() for s in new) or "(nothing)"
    return line, f"`{removed}` → `{added}`"


def survivors(files: list[Path]) -> tuple[dict[str, dict[str, int]], list[Survivor]]:
    """Per module: mutants, killed, survived; and every mutant that was not caught."""
    os.chdir(REPO)  # mutmut reads its configuration and mutants/ from the working directory
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code

    counts: dict[str, dict[str, int]] = {}
    out: list[Survivor] = []
    for path in files:
        source = (REPO / path).read_text(encoding="utf-8")
        module = ".".join(path.with_suffix("").parts)
        codes = _exit_codes(path)
        status = {name: status_by_exit_code[code] for name, code in codes.items()}
        killed = sum(1 for st in status.values() if st in CAUGHT)
        counts[module] = {"mutants": len(codes), "killed": killed, "survived": len(codes) - killed}
        for name in sorted(codes, key=_natural):
            if status[name] in CAUGHT:
                continue
            _, cls, func = _split_name(name)
            line, change = _describe(
                get_diff_for_mutant(name, path=path), source.splitlines(), _span(source, cls, func)
            )
            function = f"{cls}.{func}" if cls else func
            out.append(Survivor(name, module, function, line, change, status[name]))
    return counts, out


def _natural(name: str) -> tuple[str, int]:
    stem, _, n = name.rpartition("__mutmut_")
    return stem, int(n) if n.isdigit() else 0


def run_mutmut(max_children: int) -> float:
    """A clean `mutmut run` (the cache of an earlier run is removed first); its wall time in s."""
    shutil.rmtree(MUTANTS, ignore_errors=True)
    mutmut = Path(sys.executable).with_name("mutmut")
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(mutmut), "run", "--max-children", str(max_children)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    wall_s = time.monotonic() - t0
    tail = proc.stdout.replace("\r", "\n").strip().splitlines()[-3:]
    print("\n".join(tail))
    if proc.returncode != 0:
        raise SystemExit(f"mutmut run exited {proc.returncode}")
    return wall_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-children", type=int, default=2, help="mutmut's parallel test processes (default 2)")
    ap.add_argument("--no-run", action="store_true", help="report the last run's mutants/ without running")
    ap.add_argument("--min-kill-rate", type=float, default=0.90)
    ap.add_argument("--no-write", action="store_true", help="print only; leave bench/results/ as it is")
    args = ap.parse_args(argv)

    started = _results.start()
    wall_s = None if args.no_run else run_mutmut(args.max_children)
    files = _mutatable_files()
    counts, found = survivors(files)

    total = sum(c["mutants"] for c in counts.values())
    killed = sum(c["killed"] for c in counts.values())
    rate = killed / total if total else 0.0
    unexplained = [s for s in found if s.name not in EQUIVALENT]
    stale = sorted(set(EQUIVALENT) - {s.name for s in found})

    explained = {m: sum(1 for s in found if s.module == m and s.name in EQUIVALENT) for m in counts}
    rate_rows: list[list[object]] = [
        [m, c["mutants"], c["killed"], c["survived"], explained[m], round(c["killed"] / c["mutants"], 4)]
        for m, c in counts.items()
    ]
    rate_rows.append(["overall", total, killed, total - killed, sum(explained.values()), round(rate, 4)])
    survivor_rows: list[list[object]] = [
        [s.module, s.function, s.line, s.change, EQUIVALENT.get(s.name, f"UNEXPLAINED ({s.status})"), s.name]
        for s in found
    ]
    tables = [
        _results.table(
            "mutation kill rate per module",
            ["module", "mutants", "killed", "survived", "survived, explained", "kill rate"],
            rate_rows,
            note="mutmut 3 on the money policy with tests/unit/policy (make mutation); a timeout counts as killed",
        ),
        _results.table(
            "surviving mutants",
            ["module", "function", "line", "mutation", "why it survives", "mutant"],
            survivor_rows,
            note="each is equivalent: no decision can tell it from the original (bench/mutation.py EQUIVALENT)",
        ),
    ]
    for row in rate_rows:
        print(f"{row[0]:<28} {row[1]:>5} mutants {row[2]:>5} killed {row[3]:>4} survived  kill rate {row[5]:.1%}")
    if wall_s is not None:
        print(f"mutmut run: {wall_s:.0f} s wall, --max-children {args.max_children}")
    for s in unexplained:
        print(f"UNEXPLAINED {s.name} ({s.status}) {s.module}:{s.line} {s.function}: {s.change}")
    for name in stale:
        print(f"note: EQUIVALENT names {name}, which is not a survivor of this run")
    if not args.no_write:
        raw = {"wall_s": None if wall_s is None else round(wall_s, 1), "max_children": args.max_children}
        _results.write("mutation", tables, started=started, raw=raw)

    ok = True
    if rate < args.min_kill_rate:
        print(f"FAIL: kill rate {rate:.1%} is below {args.min_kill_rate:.0%}")
        ok = False
    if unexplained:
        print(f"FAIL: {len(unexplained)} surviving mutants are neither killed by a test nor explained in EQUIVALENT")
        ok = False
    print(f"kill rate {rate:.1%} ({killed}/{total}), {len(found)} survivors, {len(unexplained)} unexplained")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
