"""Re-key a session's triage after its module was refactored, running no test.

A triage entry names its mutant by cosmic-ray operator and occurrence, and the occurrence is
the mutant's index among that operator's mutants of the module: code moved inside the module
(a function split into steps, a block moved) renumbers them, and the triage no longer names
the mutants it judged. This lists the mutants of the module at an earlier revision and as it
is now (``cosmic-ray init`` on a copy of each, with a test command that never runs) and matches
them by what they change: the operator, the code under the mutated span and the whole line it
sits on, the k-th such mutant of the old module being the k-th of the new. Each entry whose
mutant is found gets the new occurrence; the others are listed, and the tool exits 1.

    python strength/mutation/rekey_triage.py canary_plan --old-rev HEAD

The triage file is rewritten in place (``--dry-run`` only reports). Its ``module_sha256`` is
left as it was: a re-keyed triage is a guess until a fresh session of the module and
``replay_survivors.py --check --stamp`` confirm it (docs/STRENGTH.md).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

_CONFIG = """[cosmic-ray]
module-path = "{module}"
timeout = 10.0
excluded-modules = []
test-command = "false"

[cosmic-ray.distributor]
name = "local"
"""


def mutants(module: str, text: str) -> list[tuple[str, int, tuple]]:
    """``(operator, occurrence, key)`` of every mutant of ``module`` with source ``text``; the
    key is what the mutant changes (operator, arguments, mutated span, its line)."""
    lines = text.splitlines()
    with tempfile.TemporaryDirectory() as work:
        path = Path(work, module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        Path(work, "c.toml").write_text(_CONFIG.format(module=module))
        cosmic = Path(sys.executable).with_name("cosmic-ray")
        subprocess.run(
            [str(cosmic), "init", "c.toml", "s.sqlite"], cwd=work, check=True, capture_output=True
        )
        with sqlite3.connect(Path(work, "s.sqlite")) as db:
            rows = db.execute(
                "select operator_name, operator_args, occurrence, start_pos_row, start_pos_col,"
                " end_pos_row, end_pos_col from mutation_specs"
            ).fetchall()
    found = []
    for operator, args, occurrence, row0, col0, row1, col1 in rows:
        span_lines = lines[row0 - 1 : row1]
        if row0 == row1:
            span = span_lines[0][col0:col1]
        else:
            span = "\n".join([span_lines[0][col0:], *span_lines[1:-1], span_lines[-1][:col1]])
        key = (operator, args, span, lines[row0 - 1].strip())
        found.append((operator, occurrence, key, (row0, col0)))
    found.sort(key=lambda m: (m[0], m[1]))
    return [(op, occ, key) for op, occ, key, _ in found]


def mapping(old: list, new: list) -> dict[tuple[str, int], int]:
    """Old ``(operator, occurrence)`` to the new occurrence of the mutant with the same key,
    the k-th old mutant of a key going to the k-th new one."""
    by_key: dict[tuple, list[int]] = defaultdict(list)
    for _, occurrence, key in new:
        by_key[key].append(occurrence)
    seen: dict[tuple, int] = defaultdict(int)
    result = {}
    for operator, occurrence, key in old:
        k = seen[key]
        seen[key] += 1
        if k < len(by_key[key]):
            result[(operator, occurrence)] = by_key[key][k]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("session", help="a session name: strength/mutation/<session>.toml")
    parser.add_argument("--old-rev", required=True, help="the git revision the triage names")
    parser.add_argument("--dry-run", action="store_true", help="report, rewrite nothing")
    args = parser.parse_args(argv)
    config = tomllib.loads((HERE / f"{args.session}.toml").read_text())["cosmic-ray"]
    module = config["module-path"]
    old_text = subprocess.run(
        ["git", "show", f"{args.old_rev}:{module}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    moved = mapping(mutants(module, old_text), mutants(module, (ROOT / module).read_text()))
    triage_path = HERE / "survivors" / f"{args.session}.json"
    triage = json.loads(triage_path.read_text())
    lost = []
    changed = 0
    for entry in triage["survivors"]:
        new = moved.get((entry["operator"], entry["occurrence"]))
        if new is None:
            lost.append(entry)
            continue
        changed += new != entry["occurrence"]
        entry["occurrence"] = new
    print(
        f"{args.session}: {len(triage['survivors'])} entries, {changed} re-keyed, {len(lost)} lost"
    )
    for entry in lost:
        print(f"  lost: {entry['operator']} #{entry['occurrence']}: {entry['reason']}")
    if not args.dry_run:
        triage_path.write_text(json.dumps(triage, indent=2, ensure_ascii=False) + "\n")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
