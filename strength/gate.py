"""The strength gate: the suite must kill every known-bad implementation, for the right reason,
and pass every correct one.

    python -m strength.gate [--jobs N] [--shards N] [--only SUBSTRING] [--device DEV] [--json PATH]

For each entry of ``strength.known_bad.CATALOGUE`` (expected: killed) and each module of
``strength.known_bad.CORRECT`` (expected: passes) it runs the suite in a subprocess of its own (a
known-bad module patches canary for its whole process): the whole suite on canary and
canary_torch; on a mutant the tour (``TOUR``: a few tests that call every entry point) and the
tests its entry lists, and on a correct variant the tour and the tests where its difference
can show (``known_bad.CORRECT_RUNS_IN``); ``--whole-suite``: every module on every module::

    python -m pytest conformance -q -p no:cacheprovider --hypothesis-profile mutation \
        -p strength.gate_record --gate-record RECORD.json --canary-impl MODULE

with ``CI=true``, each in a fork of one server process that has the third-party libraries
imported (``strength/forkserver.py``; ``--no-fork-server`` starts every run as a fresh Python
instead). The project's own modules are imported afresh in every run, so each run is what a
fresh process would be. The ``mutation`` profile is the derandomized ``ci`` profile without
shrinking: the same examples, and a failure reported as first found. There is no ``-x``:
every test runs, and ``strength.gate_record`` records every failing test with the kind of
its failure (``assertion``, ``crash``, ``health-check``, ``flaky``). With ``--stop-at-kill``
(``scripts/tests.sh``) a mutant's run ends at the first failed property of a test its entry
lists, the kill being settled then: what ran before it is recorded and judged as always (a
crash before the kill is still an error), the rest of its tests do not run. The nightly gate
runs every test. A run:

- *passes*: exit 0, nothing failed;
- is *killed*: every failure is a failed property, i.e. an assertion (``AssertionError``,
  ``pytest.fail``) or a refusal (the implementation raised one of the contract's own
  ``kv-canary: `` errors where the call must succeed), and at least one failing test is one
  that the entry lists in ``dies_in`` (where its bug must be caught);
- is *misplaced*: every failure is a failed property, but none in a listed test: the suite
  caught something, not the bug the entry describes;
- is an *error*: any other failure (a crash such as Python's own ``TypeError`` or
  ``NameError`` from a broken module, a Hypothesis health check, ``Flaky``), a collection or
  usage error, a run without its record, a signal or a timeout. A crash says nothing about
  whether the suite would have caught the bug, so an error is never a kill, and any error
  fails the gate.

It prints one row per module (module, area, expected, outcome, seconds, the listed test that
killed it or what went wrong) and a summary line, and exits 0 iff every outcome is the expected
one.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from strength import shards

REPO_ROOT = Path(__file__).resolve().parent.parent
FORKSERVER = REPO_ROOT / "strength" / "forkserver.py"
SUITE_DIR = REPO_ROOT / "conformance"

PASSES, KILLED, MISPLACED, ERROR = "passes", "killed", "misplaced", "error"
CORRECT_AREA = "correct"
DEFAULT_JOBS = 2
DEFAULT_TIMEOUT_S = 900.0
PROFILE = "mutation"
# The failure kinds (strength.gate_record) that are failed properties, in the docstring's sense.
KILL_KINDS = ("assertion", "refusal")
_ERROR_TAIL_LINES = 15


@dataclass(frozen=True)
class Target:
    """One module to run the suite on, and what the suite must do with it."""

    module: str
    area: str
    expected: str
    bug: str = ""
    dies_in: tuple[str, ...] = ()  # patterns of the tests that must kill it (see listed())
    runs_in: tuple[str, ...] = ()  # a correct variant's tests outside --whole-suite (ditto)
    shard: tuple[int, int] = (1, 1)  # (i, n): the i-th of n shards of its whole-suite run

    @property
    def name(self) -> str:
        """The module, and the shard where its run is one of several."""
        i, n = self.shard
        return self.module if n == 1 else f"{self.module} (shard {i} of {n})"


@dataclass(frozen=True)
class Result:
    target: Target
    outcome: str
    seconds: float
    returncode: int | None  # None: killed by the gate's timeout
    first_failure: str | None  # node id of the killing test, else of the first failure
    tail: str = ""  # the end of the run's output, kept for errors
    detail: str = ""  # why the outcome: the kill's message, or what the error was
    failures: tuple[dict, ...] = ()  # every failing test: nodeid, when, kind, types, message
    tests: dict | None = None  # tests per outcome, as pytest counts them ({"passed": 457, ...})

    @property
    def as_expected(self) -> bool:
        return self.outcome == self.target.expected


def load_targets() -> tuple[list[Target], list[Target]]:
    """The known-bad catalogue and the correct implementations, as targets."""
    from strength import known_bad

    mutants = [
        Target(e.module, e.area, e.expected, e.bug, tuple(e.dies_in)) for e in known_bad.CATALOGUE
    ]
    correct = [
        Target(m, CORRECT_AREA, PASSES, runs_in=known_bad.CORRECT_RUNS_IN.get(m, ()))
        for m in known_bad.CORRECT
    ]
    return mutants, correct


# The suite's modules, quickest first, so that a run's first failures come early in its log.
# Any module not listed runs last: test_golden_scale.py (vectors at engine scale, exact but the
# slowest module under the interpreter: a 4096-token write is one serial chain) is not listed.
FAST_FIRST = (
    "test_spec_vectors.py",
    "test_source_validation.py",
    "test_launch_refusals.py",
    "test_argument_kinds.py",
    "test_buffers.py",
    "test_golden.py",
    "test_fingerprint.py",
    "test_write_verify.py",
)


# Modules of stored vectors (golden and CONTRACT §2): --properties-only leaves them out, to
# measure what the properties alone catch.
VECTOR_MODULES = (
    "test_golden.py",
    "test_golden_plan.py",
    "test_golden_scale.py",
    "test_spec_vectors.py",
)

# Tests every mutant's run includes, the tour: together they call every entry point, in under
# a second (RealKvSource accepting and refusing, fingerprint in every mode, both plans'
# allocate, write and verify at the contract's edges, arguments of the wrong kind), so a
# mutant that crashes anywhere is seen crashing. Besides them a mutant runs the tests its entry
# lists, from any module. (Until the tour, every run took six modules whole, 10 s of tests a
# mutant, which kept .ci/run over its budget; --whole-suite, run nightly, still sweeps them all.)
TOUR = (
    "test_spec_vectors.py::test_spec_fingerprint_vectors",
    "test_spec_vectors.py::test_enums_are_the_contracts",
    "test_source_validation.py::test_spec_examples",
    "test_source_validation.py::test_valid_examples_are_accepted",
    "test_launch_refusals.py::test_launches_at_the_edges_run",
    "test_argument_kinds.py::test_wrong_kinds_of_arguments_are_refused",
    "test_argument_kinds.py::test_fingerprint_refuses_wrong_kinds_of_arguments",
    "test_buffers.py::test_allocated_plans_have_the_contract_shapes",
    # one case each: the plan (its SWA-table variant) and the scatter
    "test_golden_plan.py::test_plan_vector[plan-swa-evicted]",
    "test_golden_plan.py::test_scatter_vector[scatter-rows]",
)


def suite_paths(*, properties_only: bool = False) -> list[str]:
    """The suite's modules, quickest first."""
    found = sorted(p.name for p in SUITE_DIR.glob("test_*.py"))
    if properties_only:
        found = [name for name in found if name not in VECTOR_MODULES]
    ordered = [name for name in FAST_FIRST if name in found]
    ordered += [name for name in found if name not in ordered]
    return [f"conformance/{name}" for name in ordered]


def suite_tests(module: str) -> list[str]:
    """The test functions of suite module ``module`` (``test_x.py``), in file order."""
    tree = ast.parse((SUITE_DIR / module).read_text())
    return [
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


def target_selection(
    target: Target, *, whole_suite: bool = False, properties_only: bool = False
) -> list[str]:
    """What pytest runs for ``target``: suite modules or single tests, quickest module first.

    A correct implementation runs the whole suite (the modules of its shard, where its run is
    split, :mod:`strength.shards`), but for a ``correct_*`` variant, which runs
    the :data:`TOUR` and the tests ``known_bad.CORRECT_RUNS_IN`` lists for it. A mutant runs
    the tour and the tests its entry lists (every parametrization of each). ``whole_suite``
    runs every module for every target.
    """
    if whole_runs(target, whole_suite=whole_suite):
        i, n = target.shard
        return shards.split(suite_paths(properties_only=properties_only), n)[i - 1]
    listing = target.runs_in if target.expected == PASSES else target.dies_in
    selection = []
    for path in suite_paths(properties_only=properties_only):
        module = path.removeprefix("conformance/")
        for name in suite_tests(module):
            test = f"{module}::{name}"
            if test in TOUR or listed(f"{path}::{name}", listing):
                selection.append(f"{path}::{name}")
            else:  # a tour stop may be one case of a test (``test[case]``)
                selection += [f"conformance/{stop}" for stop in TOUR if stop.startswith(test + "[")]
    return selection


def pytest_command(
    module: str,
    device: str | None = None,
    *,
    record: str | os.PathLike | None = None,
    selection: Sequence[str] | None = None,
    stop_at: Sequence[str] = (),
) -> list[str]:
    """The suite run on ``module`` (``selection``, by default every module; no ``-x``), failures
    recorded in ``record``; ``stop_at``: the listed tests whose first failed property ends it."""
    paths = suite_paths() if selection is None else list(selection)
    command = [sys.executable, "-m", "pytest", *paths]
    command += ["-q", "-p", "no:cacheprovider", "--hypothesis-profile", PROFILE]
    command += ["-p", "strength.gate_record"]
    if record is not None:
        command += ["--gate-record", str(record)]
        for pattern in stop_at:
            command += ["--gate-stop-at-kill", pattern]
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


def test_name(nodeid: str) -> str:
    """``module.py::test_function`` of a node id: without ``conformance/`` and parameters."""
    name = nodeid.split("[", 1)[0]
    return name.removeprefix("conformance/")


def listed(nodeid: str, patterns: Sequence[str]) -> bool:
    """Whether a test is one of ``patterns`` (``fnmatch`` patterns of :func:`test_name`, e.g.
    ``test_fingerprint.py::test_launch_checks_*``); every parametrization of a listed test is."""
    name = test_name(nodeid)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def _show(failure: dict) -> str:
    types = failure.get("types") or ["?"]
    return f"{failure['nodeid']} ({failure['kind']}: {types[-1]}: {failure.get('message', '')})"


def classify(
    returncode: int | None, record: dict | None, target: Target
) -> tuple[str, str | None, str]:
    """(outcome, the killing or first failing test, why) of one suite run on ``target``.

    ``record`` is what ``strength.gate_record`` wrote (None: it wrote nothing).
    """
    if returncode is None:
        return ERROR, None, "the run timed out"
    if record is None:
        return ERROR, None, f"exit {returncode} without a record of its failures"
    failures = record.get("failures", [])
    first = failures[0]["nodeid"] if failures else None
    if record.get("collection_errors"):
        where = ", ".join(e["nodeid"] or "?" for e in record["collection_errors"])
        return ERROR, first, f"collection errors in {where}"
    errors = [f for f in failures if f["kind"] not in KILL_KINDS]
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return ERROR, errors[0]["nodeid"], _show(errors[0]) + more
    if returncode == 0 and not failures:
        return PASSES, None, ""
    if returncode != 1 or not failures:
        return ERROR, first, f"exit {returncode} with {len(failures)} recorded failures"
    if target.expected == PASSES:
        return KILLED, first, _show(failures[0])
    kills = [f for f in failures if listed(f["nodeid"], target.dies_in)]
    if not kills:
        names = sorted({test_name(f["nodeid"]) for f in failures})
        return MISPLACED, first, "only unlisted tests failed: " + ", ".join(names)
    return KILLED, kills[0]["nodeid"], _show(kills[0])


def _tail(output: str, lines: int = _ERROR_TAIL_LINES) -> str:
    return "\n".join(output.rstrip().splitlines()[-lines:])


def _read_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def fork_server(folder: str | os.PathLike):
    """A running ``strength/forkserver.py`` server; yields its socket's path."""
    socket = Path(folder) / "forkserver.sock"
    log = Path(folder) / "forkserver.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, str(FORKSERVER), "serve", "--socket", str(socket)],
            cwd=REPO_ROOT,
            env=child_environment(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while not socket.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield str(socket)
    finally:
        server.terminate()
        server.wait(timeout=30)


def via_fork_server(command: Sequence[str], socket: str, timeout_s: float) -> list[str]:
    """``command`` (``python -m pytest ARGS``) as a run of ARGS in a fork of the server."""
    assert list(command[1:3]) == ["-m", "pytest"], command
    client = [sys.executable, str(FORKSERVER), "run", "--socket", socket]
    return [*client, "--limit", f"{timeout_s:g}", "--", *command[3:]]


def run_target(
    target: Target,
    *,
    device: str | None,
    timeout_s: float,
    properties_only: bool = False,
    whole_suite: bool = False,
    socket: str | None = None,
    stop_at_kill: bool = False,
) -> Result:
    """Run the suite on ``target.module`` in a subprocess (a fork of the server at ``socket``,
    if given) and classify the run; ``stop_at_kill``: a mutant's run ends at its kill."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kv-canary-gate-") as folder:
        record_path = Path(folder) / "record.json"
        command = pytest_command(
            target.module,
            device,
            record=record_path,
            selection=target_selection(
                target, whole_suite=whole_suite, properties_only=properties_only
            ),
            stop_at=target.dies_in if stop_at_kill and target.expected != PASSES else (),
        )
        if socket is not None:
            command = via_fork_server(command, socket, timeout_s)
        # the run's temporary files (a mutant's rewritten kernels) in this folder, removed
        # with it whatever way the run ends
        environment = child_environment() | {"TMPDIR": folder}
        try:
            completed = subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=environment,
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
                target,
                ERROR,
                seconds,
                None,
                None,
                f"timed out after {timeout_s:g} s\n" + _tail(output),
                "the run timed out",
            )
        record = _read_record(record_path)
    seconds = time.perf_counter() - start
    outcome, first, detail = classify(completed.returncode, record, target)
    tail = _tail(completed.stdout) if outcome == ERROR else ""
    failures = tuple(record.get("failures", [])) if record else ()
    tests = record.get("tests") if record else None
    return Result(
        target, outcome, seconds, completed.returncode, first, tail, detail, failures, tests
    )


Runner = Callable[[Target], Result]


def run_all(targets: Sequence[Target], runner: Runner, *, jobs: int, progress=None) -> list[Result]:
    """``runner`` on every target, ``jobs`` at a time; results in the order of ``targets``.

    The correct implementations start first: canary's and canary_torch's are the whole suite,
    the longest runs of all, and started last they would leave the other jobs' cores idle at
    the end.
    """
    results: dict[int, Result] = {}
    order = sorted(range(len(targets)), key=lambda i: targets[i].expected != PASSES)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(runner, targets[i]): i for i in order}
        for future in as_completed(futures):
            result = future.result()
            results[futures[future]] = result
            if progress is not None:
                progress(result)
    return [results[i] for i in range(len(targets))]


def whole_runs(target: Target, *, whole_suite: bool = False) -> bool:
    """Whether ``target``'s run is the whole suite (a correct implementation without a listing
    of its own, or every target under ``--whole-suite``)."""
    listing = target.runs_in if target.expected == PASSES else target.dies_in
    return whole_suite or not listing


def shard_targets(targets: Sequence[Target], n: int, *, whole_suite: bool = False) -> list[Target]:
    """``targets`` with each correct implementation's whole-suite run split into ``n`` shards
    (a mutant's run ends at its kill, and stays one)."""
    out: list[Target] = []
    for target in targets:
        if n > 1 and target.expected == PASSES and whole_runs(target, whole_suite=whole_suite):
            out += [replace(target, shard=(i, n)) for i in range(1, n + 1)]
        else:
            out.append(target)
    return out


def merge_shards(results: Sequence[Result]) -> list[Result]:
    """One result per module, in order: a sharded run's outcome is its first shard's that is not
    ``passes`` (else ``passes``); its seconds, tests and failures add up."""
    merged: dict[str, list[Result]] = {}
    for result in results:
        merged.setdefault(result.target.module, []).append(result)
    out = []
    for parts in merged.values():
        if len(parts) == 1:
            out.append(parts[0])
            continue
        first = next((r for r in parts if r.outcome != PASSES), parts[0])
        tests: dict[str, int] = {}
        for r in parts:
            for outcome, count in (r.tests or {}).items():
                tests[outcome] = tests.get(outcome, 0) + count
        codes = [r.returncode for r in parts]
        out.append(
            replace(
                first,
                target=replace(first.target, shard=(1, 1)),
                seconds=sum(r.seconds for r in parts),
                returncode=None if None in codes else max(codes),  # type: ignore[type-var]
                tail="\n".join(r.tail for r in parts if r.tail),
                failures=tuple(f for r in parts for f in r.failures),
                tests=tests if any(r.tests is not None for r in parts) else None,
            )
        )
    return out


def table(results: Iterable[Result]) -> str:
    header = ("", "module", "area", "expected", "outcome", "seconds", "killed by / why")
    rows = [
        (
            "ok" if r.as_expected else "FAIL",
            r.target.module,
            r.target.area,
            r.target.expected,
            r.outcome,
            f"{r.seconds:.1f}",
            (r.first_failure or "-") if r.outcome == KILLED else (r.detail or "-"),
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
        "misplaced": sum(r.outcome == MISPLACED for r in mutants),
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
            f"{facts['survived']} survived, {facts['misplaced']} killed only by unlisted tests; mean {facts['mean_seconds_per_mutant']:.1f} s per mutant"
        )
    else:
        kills = "no mutants run"
    verdict = "gate OK" if facts["ok"] else f"gate FAILED: {', '.join(facts['mismatches'])}"
    wall = f"; {facts['wall_seconds']:.0f} s wall" if "wall_seconds" in facts else ""
    return (
        f"{kills}; correct implementations passing {facts['correct_passing']}/{facts['correct']}; "
        f"{facts['errors']} errors{wall}; {verdict}"
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m strength.gate",
        description="Run the conformance suite on every known-bad and every correct "
        "implementation; exit 0 iff each is killed / passes as expected.",
    )
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="suite runs at a time (default %(default)s)"
    )
    parser.add_argument(
        "--only", metavar="SUBSTRING", help="only modules whose name contains SUBSTRING"
    )
    parser.add_argument(
        "--leave-out",
        action="append",
        default=[],
        metavar="MODULE",
        help="a module not to run here, named exactly, because another job runs it "
        "(scripts/tests.sh: canary_torch, the variant and three mutants, whose runs the "
        "nightly gate makes; see there); repeatable",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=1,
        metavar="N",
        help="split each correct implementation's whole-suite run into N runs by module, so "
        "that the jobs end together (strength/shards.py; default %(default)s)",
    )
    parser.add_argument("--device", metavar="DEV", help="passed to the suite as --canary-device")
    parser.add_argument(
        "--json", metavar="PATH", type=Path, help="also write the results as JSON to PATH"
    )
    parser.add_argument(
        "--properties-only",
        action="store_true",
        help="leave out the stored vectors (golden, CONTRACT §2): what do the properties alone kill?",
    )
    parser.add_argument(
        "--whole-suite",
        action="store_true",
        help="run the whole suite on every mutant and correct variant, not only the tour and "
        "its listed tests",
    )
    parser.add_argument(
        "--stop-at-kill",
        action="store_true",
        help="end a mutant's run at the first failed property of a test its entry lists (its "
        "kill), not after every test",
    )
    parser.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start every suite run as a fresh Python, not as a fork of one preloaded server",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help="a run taking longer is stopped and counts as an error (default %(default)s)",
    )
    return parser


#: The known-bad area whose mutants read outside their buffers (``strength.known_bad.AREAS``): the
#: CPU's watch (``conformance.bounds``) reports and masks those reads; a GPU would make them.
CPU_ONLY_AREA = "bounds"


def runs_on_cpu(device: str | None) -> bool:
    """Whether the suite, given ``--canary-device device`` (None: its default), runs on the CPU."""
    from conformance.plugin import device_name

    return device_name(device).split(":")[0] == "cpu"


def main(
    argv: Sequence[str] | None = None,
    *,
    targets: Sequence[Target] | None = None,
    runner: Runner | None = None,
) -> int:
    """Run the gate; ``targets`` and ``runner`` replace the catalogue and the subprocess runs."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.shards < 1:
        parser.error("--jobs and --shards must be at least 1")
    targets = shard_targets(
        _selected_targets(parser, args, targets), args.shards, whole_suite=args.whole_suite
    )
    servers = contextlib.ExitStack()
    socket = None
    if runner is None:
        if not args.no_fork_server:
            folder = servers.enter_context(tempfile.TemporaryDirectory(prefix="kv-canary-gate-"))
            socket = servers.enter_context(fork_server(folder))

        def runner(target: Target) -> Result:
            return run_target(
                target,
                device=args.device,
                timeout_s=args.timeout,
                properties_only=args.properties_only,
                whole_suite=args.whole_suite,
                socket=socket,
                stop_at_kill=args.stop_at_kill,
            )

    def progress(result: Result) -> None:
        print(
            f"[gate] {result.target.name}: {result.outcome} in {result.seconds:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    started = time.perf_counter()
    with servers:
        results = merge_shards(run_all(targets, runner, jobs=args.jobs, progress=progress))
    facts = summary(results)
    facts["wall_seconds"] = time.perf_counter() - started
    _report(results, facts, args)
    return 0 if facts["ok"] else 1


def _selected_targets(
    parser: argparse.ArgumentParser, args: argparse.Namespace, targets: Sequence[Target] | None
) -> list[Target]:
    """The targets a run of the gate runs: ``targets`` (None: the catalogue's mutants and
    correct implementations) less those ``--leave-out`` names and those this device leaves
    out, kept to ``--only``'s; a usage error where an option selects nothing."""
    if targets is None:
        mutants, correct = load_targets()
        targets = [*mutants, *correct]
    unknown = sorted(set(args.leave_out) - {t.module for t in targets})
    if unknown:
        parser.error(f"--leave-out names no module of the gate: {', '.join(unknown)}")
    targets = [t for t in targets if t.module not in args.leave_out]
    if not runs_on_cpu(args.device):
        cpu_only = [t for t in targets if t.area == CPU_ONLY_AREA]
        targets = [t for t in targets if t.area != CPU_ONLY_AREA]
        if cpu_only:
            print(
                f"[gate] left out on this device: the {len(cpu_only)} {CPU_ONLY_AREA} mutant(s), "
                "which read outside their buffers (only the CPU's watch sees them, and masks "
                "those reads off)",
                file=sys.stderr,
            )
    if args.only:
        targets = [t for t in targets if args.only in t.module]
    if not targets:
        parser.error(f"no module matches --only {args.only!r}")
    return targets


def _report(results: Sequence[Result], facts: dict, args: argparse.Namespace) -> None:
    """Print the gate's table, each error and misplaced kill, and its summary line; write the
    JSON report where ``--json`` asks for one."""
    print(table(results))
    for result in results:
        if result.outcome == ERROR:
            print(f"\n--- {result.target.module}: exit {result.returncode}: {result.detail}")
            errors = [f for f in result.failures if f["kind"] not in KILL_KINDS]
            for failure in errors:
                print(f"  {_show(failure)}")
            if result.tail and not errors:
                print(result.tail)
        elif result.outcome == MISPLACED:
            print(f"\n--- {result.target.module}: {result.detail}")
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


if __name__ == "__main__":
    sys.exit(main())
