"""The strength gate: the suite must kill every known-bad implementation and pass every correct one.

    python -m conformance.gate [--jobs N] [--only SUBSTRING] [--device DEV] [--json PATH]

For each entry of ``known_bad.CATALOGUE`` (expected: killed) and each module of
``known_bad.CORRECT`` (expected: passes) it runs, in a subprocess of its own (a known-bad
module patches canary for its whole process)::

    python -m pytest conformance -q -x -p no:cacheprovider --canary-impl MODULE

with ``CI=true`` so that the derandomized ``ci`` Hypothesis profile is used. A run
*passes* (exit 0), is *killed* (exit 1 with failed tests), or is an *error* (anything else:
a usage error, no tests, a crash, a signal, a timeout); an error is never a kill, since a
crash says nothing about whether the suite would have caught the bug.

It prints one row per module (module, area, expected, outcome, seconds, first failing test)
and a summary line with the kill rate, and exits 0 iff every outcome is the expected one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

PASSES, KILLED, ERROR = "passes", "killed", "error"
CORRECT_AREA = "correct"
DEFAULT_JOBS = 2
DEFAULT_TIMEOUT_S = 900.0
_ERROR_TAIL_LINES = 15
_FAILED_COUNT = re.compile(r"^[= ]*(?:.*, )?[1-9]\d* failed\b.* in [\d.]+s\b", re.MULTILINE)


@dataclass(frozen=True)
class Target:
    """One module to run the suite on, and what the suite must do with it."""

    module: str
    area: str
    expected: str
    bug: str = ""


@dataclass(frozen=True)
class Result:
    target: Target
    outcome: str
    seconds: float
    returncode: int | None  # None: killed by the gate's timeout
    first_failure: str | None  # node id of the first failed test, if any
    tail: str = ""  # the end of the run's output, kept for errors
    failure_line: str = ""  # the first FAILED line of the summary: node id and message

    @property
    def as_expected(self) -> bool:
        return self.outcome == self.target.expected


def load_targets() -> tuple[list[Target], list[Target]]:
    """The known-bad catalogue and the correct implementations, as targets."""
    if str(REPO_ROOT) not in sys.path:
        # known_bad is test data beside the installed packages, not one of them
        sys.path.insert(0, str(REPO_ROOT))
    import known_bad

    mutants = [Target(e.module, e.area, e.expected, e.bug) for e in known_bad.CATALOGUE]
    correct = [Target(m, CORRECT_AREA, PASSES) for m in known_bad.CORRECT]
    return mutants, correct


# The suite's modules, quickest first: with -x a mutant stops at its first failure, so
# cheap checks first make most kills take seconds. Any module not listed runs last.
FAST_FIRST = (
    "test_spec_vectors.py",
    "test_source_validation.py",
    "test_launch_validation.py",
    "test_golden.py",
    "test_fingerprint.py",
    "test_write_verify.py",
)


# Modules of stored vectors (golden and SPEC §2): --properties-only leaves them out, to
# measure what the properties alone catch.
VECTOR_MODULES = ("test_golden.py", "test_spec_vectors.py")


def suite_paths(*, properties_only: bool = False) -> list[str]:
    here = REPO_ROOT / "conformance"
    found = sorted(p.name for p in here.glob("test_*.py"))
    if properties_only:
        found = [name for name in found if name not in VECTOR_MODULES]
    ordered = [name for name in FAST_FIRST if name in found]
    ordered += [name for name in found if name not in ordered]
    return [f"conformance/{name}" for name in ordered]


def pytest_command(
    module: str, device: str | None = None, *, properties_only: bool = False
) -> list[str]:
    command = [sys.executable, "-m", "pytest", *suite_paths(properties_only=properties_only)]
    command += ["-q", "-x", "-p", "no:cacheprovider"]
    # -rfE puts one "FAILED <node id> - <message>" line per failure in the summary
    command += ["-rfE", "--canary-impl", module]
    if device:
        command += ["--canary-device", device]
    return command


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["CI"] = "true"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    )
    return env


def _failed_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("FAILED ")]


def failed_tests(output: str) -> list[str]:
    """Node ids of the ``FAILED`` lines of a pytest run's short summary, in order."""
    return [line[len("FAILED ") :].split(" - ", 1)[0].strip() for line in _failed_lines(output)]


def _summary_counts_failures(output: str) -> bool:
    # pytest's closing line, e.g. "1 failed, 12 passed in 3.10s" (framed by "=" without -q)
    return _FAILED_COUNT.search(output) is not None


def classify(returncode: int | None, output: str) -> tuple[str, str | None]:
    """(outcome, first failed test) of a suite run from its exit status and output."""
    failures = failed_tests(output)
    first = failures[0] if failures else None
    if returncode == 0:
        return PASSES, None
    if returncode == 1 and (failures or _summary_counts_failures(output)):
        return KILLED, first
    return ERROR, first


def _tail(output: str, lines: int = _ERROR_TAIL_LINES) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])


def run_target(
    target: Target, *, device: str | None, timeout_s: float, properties_only: bool = False
) -> Result:
    """Run the suite on ``target.module`` in a subprocess and classify the run."""
    start = time.perf_counter()
    try:
        completed = subprocess.run(
            pytest_command(target.module, device, properties_only=properties_only),
            cwd=REPO_ROOT,
            env=child_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as expired:
        output = expired.output or ""
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        seconds = time.perf_counter() - start
        return Result(
            target, ERROR, seconds, None, None, f"timed out after {timeout_s:g} s\n" + _tail(output)
        )
    seconds = time.perf_counter() - start
    outcome, first = classify(completed.returncode, completed.stdout)
    tail = _tail(completed.stdout) if outcome == ERROR else ""
    failed = _failed_lines(completed.stdout)
    return Result(
        target, outcome, seconds, completed.returncode, first, tail, failed[0] if failed else ""
    )


Runner = Callable[[Target], Result]


def run_all(targets: Sequence[Target], runner: Runner, *, jobs: int, progress=None) -> list[Result]:
    """``runner`` on every target, ``jobs`` at a time; results in the order of ``targets``."""
    results: dict[int, Result] = {}
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(runner, target): i for i, target in enumerate(targets)}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if progress is not None:
                progress(result)
    return [results[i] for i in range(len(targets))]


def table(results: Iterable[Result]) -> str:
    header = ("", "module", "area", "expected", "outcome", "seconds", "first failing test")
    rows = [
        (
            "ok" if r.as_expected else "FAIL",
            r.target.module,
            r.target.area,
            r.target.expected,
            r.outcome,
            f"{r.seconds:.1f}",
            r.first_failure or "-",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]

    def line(row) -> str:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        return "  ".join([*cells, row[-1]]).rstrip()

    return "\n".join([line(header), *(line(row) for row in rows)])


def summary(results: Sequence[Result]) -> dict:
    mutants = [r for r in results if r.target.area != CORRECT_AREA]
    correct = [r for r in results if r.target.area == CORRECT_AREA]
    killed = sum(r.outcome == KILLED for r in mutants)
    return {
        "mutants": len(mutants),
        "killed": killed,
        "survived": sum(r.outcome == PASSES for r in mutants),
        "errors": sum(r.outcome == ERROR for r in results),
        "kill_rate": killed / len(mutants) if mutants else None,
        "mean_seconds_per_mutant": (
            sum(r.seconds for r in mutants) / len(mutants) if mutants else None
        ),
        "correct": len(correct),
        "correct_passing": sum(r.outcome == PASSES for r in correct),
        "mismatches": [r.target.module for r in results if not r.as_expected],
        "ok": all(r.as_expected for r in results),
    }


def summary_line(facts: dict) -> str:
    if facts["mutants"]:
        kills = (
            f"kill rate {facts['killed']}/{facts['mutants']} ({100 * facts['kill_rate']:.1f}%), "
            f"{facts['survived']} survived; mean {facts['mean_seconds_per_mutant']:.1f} s per mutant"
        )
    else:
        kills = "no mutants run"
    verdict = "gate OK" if facts["ok"] else f"gate FAILED: {', '.join(facts['mismatches'])}"
    return (
        f"{kills}; correct implementations passing {facts['correct_passing']}/{facts['correct']}; "
        f"{facts['errors']} errors; {verdict}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.gate",
        description="Run the conformance suite on every known-bad and every correct "
        "implementation; exit 0 iff each is killed / passes as expected.",
    )
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="suite runs at a time (default %(default)s)"
    )
    parser.add_argument(
        "--only", metavar="SUBSTRING", help="only modules whose name contains SUBSTRING"
    )
    parser.add_argument("--device", metavar="DEV", help="passed to the suite as --canary-device")
    parser.add_argument(
        "--json", metavar="PATH", type=Path, help="also write the results as JSON to PATH"
    )
    parser.add_argument(
        "--properties-only",
        action="store_true",
        help="leave out the stored vectors (golden, SPEC §2): what do the properties alone kill?",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="a run taking longer is stopped and counts as an error (default %(default)s)",
    )
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    targets: Sequence[Target] | None = None,
    runner: Runner | None = None,
) -> int:
    """Run the gate; ``targets`` and ``runner`` replace the catalogue and the subprocess runs."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    if targets is None:
        mutants, correct = load_targets()
        targets = [*mutants, *correct]
    if args.only:
        targets = [t for t in targets if args.only in t.module]
    if not targets:
        parser.error(f"no module matches --only {args.only!r}")
    if runner is None:

        def runner(target: Target) -> Result:
            return run_target(
                target,
                device=args.device,
                timeout_s=args.timeout,
                properties_only=args.properties_only,
            )

    def progress(result: Result) -> None:
        print(
            f"[gate] {result.target.module}: {result.outcome} in {result.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    started = time.perf_counter()
    results = run_all(targets, runner, jobs=args.jobs, progress=progress)
    facts = summary(results)
    facts["wall_seconds"] = time.perf_counter() - started

    print(table(results))
    for result in results:
        if result.outcome == ERROR and result.tail:
            print(f"\n--- {result.target.module}: exit {result.returncode}\n{result.tail}")
    print()
    print(summary_line(facts))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "device": args.device,
                    "summary": facts,
                    "results": [{**asdict(r), "as_expected": r.as_expected} for r in results],
                },
                indent=2,
            )
        )
    return 0 if facts["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
