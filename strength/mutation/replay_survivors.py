"""Replay the surviving mutants of a cosmic-ray session against today's tests.

A session's database keeps each mutant's diff. After tests are added or sharpened, this
applies every surviving mutant's diff to the working tree in turn, runs the session's test
command (from its config) and restores the file, so that STRENGTH.md can say which survivors
the new tests kill. Run it from the repository root, in a clone no one is editing:

    python strength/mutation/replay_survivors.py strength/mutation/canary_real_kv_hash.sqlite \
        strength/mutation/canary_real_kv_hash.toml

``--also TESTS`` adds tests to the session's selection for the replay, so that a session run
with a quick selection can have its survivors replayed against the slow properties too.

One line per survivor: ``killed`` (the tests fail), ``killed (timeout)`` (they run past
``--timeout`` seconds), ``SURVIVED``, or ``skipped`` (matched by ``--exclude``), with the
line, the operator and the change.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("session", help="the session database (strength/mutation/<name>.sqlite)")
    parser.add_argument("config", help="the session's config (strength/mutation/<name>.toml)")
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
