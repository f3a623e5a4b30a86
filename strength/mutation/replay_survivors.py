"""Replay the surviving mutants of a cosmic-ray session against today's tests, or check the
session against its triage data.

A session's database keeps each mutant's diff. After tests are added or sharpened, this
applies every surviving mutant's diff to the working tree in turn, runs the session's test
command (from its config) and restores the file, so that the triage can say which survivors
the new tests kill. Run it from the repository root, in a clone no one is editing:

    python strength/mutation/replay_survivors.py strength/mutation/canary_real_kv_hash.sqlite \
        strength/mutation/canary_real_kv_hash.toml

``--also TESTS`` adds tests to the session's selection for the replay, so that a session run
with a quick selection can have its survivors replayed against the slow properties too.

One line per survivor: ``killed`` (the tests fail), ``killed (timeout)`` (they run past
``--timeout`` seconds), ``SURVIVED``, or ``skipped`` (matched by ``--exclude``), with the
line, the operator and the change.

``--check`` runs nothing: it reads the session's triage (``strength/mutation/survivors/
<session>.json``, or ``--triage PATH``) and checks it against the database. Every surviving
mutant must have exactly one triage entry, and every entry must name a mutant of the session
(its cosmic-ray operator and occurrence, which the session's module decides); each mismatch is
one line, and any mismatch exits 1:

    python strength/mutation/replay_survivors.py --check strength/mutation/canary_source.sqlite

A triage file holds, for one session, ``survivors``: one entry per surviving mutant, with its
``operator`` (``core/NumberReplacer``), ``occurrence`` (cosmic-ray's index among that
operator's mutants of the module), ``verdict`` (one of ``VERDICTS``) and a one-line
``reason``; ``unmapped``: survivors the triage counts but cannot name (``count``,
``verdict``, ``reason`` and ``why``), which the check cannot match and reports as a note; and
``module_sha256``: the SHA-256 of the module whose session the triage was checked against, or
null where that is not known. A module's mutants depend on its text alone, so while the module
hashes to it the triage is *current*. ``--check --stamp`` writes the module's hash into the
triage file when the check passes (run it against a fresh session of the module as it is).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

#: What became of a surviving mutant (a triage entry's ``verdict``).
VERDICTS = {
    "killed-by-new-test": "a test added or sharpened since the session kills it",
    "killed-outside-selection": "tests the session's selection lacked kill it",
    "killed-on-rerun": "recorded alive by an accident of the session; killed when run again",
    "equivalent": "no input can tell it from the module (an annotation, an identity, ...)",
    "outside-contract": "it changes only what CONTRACT leaves open",
    "dead-code": "it changes code that nothing reads",
    "dead-code-removed": "it changed code that nothing read, since removed",
    "gpu-only": "it changes only the compiled code, which a GPU or a compile check sees",
}
TRIAGE = Path(__file__).resolve().parent / "survivors"
ROOT = Path(__file__).resolve().parents[2]
_ENTRY = {"operator": str, "occurrence": int, "verdict": str, "reason": str}
_UNMAPPED = {"count": int, "verdict": str, "reason": str, "why": str}


def survivors(session: str) -> list[tuple[str, str]]:
    """(operator line, unified diff) of each surviving mutant of ``session``."""
    report = subprocess.run(
        ["cr-report", "--show-diff", "--surviving-only", session],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = []
    for block in report.split("[job-id] ")[1:]:
        head = block.splitlines()[1]
        diff = block.split("--- mutation diff ---\n", 1)[1].split("============", 1)[0]
        found.append((head, diff))
    return found


def change_of(diff: str) -> str:
    """``line N: old -> new`` of a one-line mutation diff."""
    line = re.search(r"@@ -(\d+)", diff).group(1)
    old = [t[1:].strip() for t in diff.splitlines() if t.startswith("-") and t[:3] != "---"]
    new = [t[1:].strip() for t in diff.splitlines() if t.startswith("+") and t[:3] != "+++"]
    return f"line {line}: {' '.join(old)} -> {' '.join(new)}"


def replay(diff: str, command: str, timeout: float) -> str:
    applied = subprocess.run(
        ["patch", "-p1", "--quiet", "--no-backup-if-mismatch"],
        input=diff,
        text=True,
        capture_output=True,
    )
    if applied.returncode:
        subprocess.run(["git", "checkout", "-q", "--", "."], check=True)
        return "not applied (the module changed since the session)"
    run = subprocess.Popen(
        command,
        shell=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        verdict = "killed" if run.wait(timeout=timeout) else "SURVIVED"
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
        verdict = "killed (timeout)"
    finally:
        subprocess.run(["git", "checkout", "-q", "--", "."], check=True)
    return verdict


def with_tests(command: str, tests: list[str]) -> str:
    """``command`` (``python -m pytest ...``) with ``tests`` added to what it collects."""
    if not tests:
        return command
    prefix = "python -m pytest "
    if not command.startswith(prefix):
        raise ValueError(f"not a pytest command: {command!r}")
    return prefix + " ".join(tests) + " " + command.removeprefix(prefix)


def load_triage(path: str | Path) -> dict:
    """The triage file at ``path``, checked for its shape; ``ValueError`` says what is wrong."""
    data = json.loads(Path(path).read_text())
    keys = {"session", "module", "module_sha256", "survivors", "unmapped"}
    if not isinstance(data, dict) or set(data) != keys:
        raise ValueError(
            f"{path}: keys must be session, module, module_sha256, survivors, unmapped"
        )
    digest = data["module_sha256"]
    if digest is not None and not (
        isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)
    ):
        raise ValueError(f"{path}: module_sha256 must be null or 64 lower-case hex digits")
    for kind, fields in (("survivors", _ENTRY), ("unmapped", _UNMAPPED)):
        for index, entry in enumerate(data[kind]):
            where = f"{path}: {kind}[{index}]"
            if not isinstance(entry, dict) or set(entry) != set(fields):
                raise ValueError(f"{where}: fields must be {', '.join(fields)}")
            for name, kind_of in fields.items():
                value = entry[name]
                if not isinstance(value, kind_of) or isinstance(value, bool):
                    raise ValueError(f"{where}: {name} must be a {kind_of.__name__}")
            if entry["verdict"] not in VERDICTS:
                raise ValueError(f"{where}: unknown verdict {entry['verdict']!r}")
            if not entry["reason"].strip() or "\n" in entry["reason"]:
                raise ValueError(f"{where}: the reason must be one line")
    for index, entry in enumerate(data["survivors"]):
        if not entry["operator"].startswith("core/") or entry["occurrence"] < 0:
            raise ValueError(f"{path}: survivors[{index}] names no cosmic-ray mutant")
    for index, entry in enumerate(data["unmapped"]):
        if entry["count"] < 1:
            raise ValueError(f"{path}: unmapped[{index}]: count must be at least 1")
    return data


def module_sha256(module: str | Path, root: Path | None = None) -> str:
    """The SHA-256 of the module file ``module`` (relative to ``root``, by default the
    repository's root), as a triage records it."""
    return hashlib.sha256(((root or ROOT) / module).read_bytes()).hexdigest()


def is_current(triage: dict, root: Path | None = None) -> bool:
    """Whether ``triage`` (a loaded triage file) was checked against the module as it is now
    (False when the module is gone)."""
    if not ((root or ROOT) / triage["module"]).is_file():
        return False
    return bool(triage["module_sha256"] == module_sha256(triage["module"], root))


def stamp(triage_path: str | Path, root: Path | None = None) -> str:
    """Record the module's hash in the triage file at ``triage_path``; returns the hash."""
    path = Path(triage_path)
    digest = module_sha256(load_triage(path)["module"], root)
    # in place, so that the file keeps its layout
    text, found = re.subn(
        r'("module_sha256":\s*)(null|"[0-9a-f]{64}")', rf'\1"{digest}"', path.read_text(), count=1
    )
    if found != 1:
        raise ValueError(f"{path}: no module_sha256 to stamp")
    path.write_text(text)
    return digest


def session_mutants(session: str) -> dict[tuple[str, int], dict]:
    """Every mutant of the session database: (operator, occurrence) -> its module, first line
    and outcome (``survived``, ``killed``, ``incompetent``, or None while pending).

    cosmic-ray stores an outcome by its enum's name (``SURVIVED``); it is read in lower case."""
    if not Path(session).is_file():
        raise FileNotFoundError(session)
    with contextlib.closing(sqlite3.connect(f"file:{session}?mode=ro", uri=True)) as db:
        rows = db.execute(
            "SELECT m.operator_name, m.occurrence, m.module_path, m.start_pos_row,"
            " r.test_outcome FROM mutation_specs AS m"
            " LEFT JOIN work_results AS r ON r.job_id = m.job_id"
        ).fetchall()
    return {
        (operator, occurrence): {
            "module": Path(module).as_posix(),
            "line": line,
            "outcome": outcome.lower() if outcome is not None else None,
        }
        for operator, occurrence, module, line, outcome in rows
    }


def check(session: str, triage_path: str | Path) -> list[str]:
    """The mismatches between a session database and its triage, one line each."""
    triage = load_triage(triage_path)
    mutants = session_mutants(session)
    problems = []
    modules = {m["module"] for m in mutants.values()}
    if modules and modules != {triage["module"]}:
        problems.append(
            f"module: the session mutates {sorted(modules)}, the triage is of {triage['module']}"
        )
    entries: dict[tuple[str, int], int] = {}
    for entry in triage["survivors"]:
        key = (entry["operator"], entry["occurrence"])
        entries[key] = entries.get(key, 0) + 1
    for key, mutant in sorted(mutants.items()):
        if mutant["outcome"] == "survived" and key not in entries:
            problems.append(
                f"missing: {key[0]} {key[1]} (line {mutant['line']}) survived and "
                "has no triage entry"
            )
    for key, count in sorted(entries.items()):
        if key not in mutants:
            problems.append(
                f"stale: {key[0]} {key[1]} has a triage entry but is no mutant of the session"
            )
        elif count > 1:
            problems.append(f"duplicate: {key[0]} {key[1]} has {count} triage entries")
    return problems


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def run_check(session: str, triage_path: str | Path | None, stamp_it: bool = False) -> int:
    """``--check``: print the mismatches and a summary line; 1 on any mismatch. With
    ``stamp_it``, a passing check records the module's hash in the triage file."""
    name = Path(session).stem
    triage_path = Path(triage_path or TRIAGE / f"{name}.json")
    for path, what in ((Path(session), "session database"), (triage_path, "triage file")):
        if not path.is_file():
            print(f"{name}: no {what} {path}")
            return 1
    problems = check(session, triage_path)
    mutants = session_mutants(session)
    triage = load_triage(triage_path)
    survived = sum(m["outcome"] == "survived" for m in mutants.values())
    pending = sum(m["outcome"] is None for m in mutants.values())
    unmapped = sum(entry["count"] for entry in triage["unmapped"])
    for line in problems:
        print(line)
    note = f"; {unmapped} more counted by the triage but unmapped" if unmapped else ""
    print(
        f"{name}: {_count(len(mutants), 'mutant', 'mutants')} ({pending} pending), "
        f"{survived} survived; "
        f"{_count(len(triage['survivors']), 'triage entry', 'triage entries')}{note}: "
        + (_count(len(problems), "mismatch", "mismatches") if problems else "the triage matches")
    )
    if problems:
        return 1
    if stamp_it:
        print(f"{name}: stamped {triage_path} with {triage['module']} {stamp(triage_path)}")
    elif not is_current(triage):
        print(f"{name}: note: the triage is not stamped with {triage['module']} as it is")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("session", help="the session database (strength/mutation/<name>.sqlite)")
    parser.add_argument(
        "config", nargs="?", help="the session's config (strength/mutation/<name>.toml)"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="run nothing: check the session's triage data against its database",
    )
    parser.add_argument(
        "--stamp",
        action="store_true",
        help="with --check: when the triage matches, record the module's hash in it (the "
        "session must be of the module as it is)",
    )
    parser.add_argument(
        "--triage",
        metavar="PATH",
        help="the triage file for --check (default: strength/mutation/survivors/<name>.json)",
    )
    parser.add_argument("--timeout", type=float, default=150.0, help="seconds per mutant")
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="REGEX",
        help="skip the survivors whose change (`line N: old -> new`) matches; repeatable "
        "(e.g. annotations, whose verdict does not depend on the tests)",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="TESTS",
        help="tests to add to the config's pytest command; repeatable (e.g. the properties "
        "that a session's quick selection leaves out)",
    )
    args = parser.parse_args(argv)
    if args.stamp and not args.check:
        parser.error("--stamp goes with --check")
    if args.check:
        return run_check(args.session, args.triage, args.stamp)
    if args.config is None:
        parser.error("the session's config is needed, except with --check")
    if subprocess.run(["git", "diff", "--quiet"]).returncode:
        parser.error("the working tree has changes; replay in a clean clone")
    with open(args.config) as config:  # the configs keep the command on one line
        command = with_tests(
            re.search(r'^test-command = "(.*)"$', config.read(), re.M).group(1), args.also
        )
    for head, diff in survivors(args.session):
        change = change_of(diff)
        if any(re.search(pattern, change) for pattern in args.exclude):
            print(f"skipped  {head}  {change}", flush=True)
            continue
        print(f"{replay(diff, command, args.timeout)}  {head}  {change}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
