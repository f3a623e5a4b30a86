"""pytest plugin of the known-bad gate: records every failing test and the kind of its failure.

    pytest conformance -p strength.gate_record --gate-record PATH ...

writes PATH as JSON: ``{"exit_status", "tests": {"passed": N, ...}, "failures": [{"nodeid",
"when", "kind", "types", "message"}, ...], "collection_errors": [...]}``. ``kind`` is one of
(what counts as a kill: see ``strength/gate.py``):

- ``assertion``: the test failed a check: ``AssertionError`` or ``pytest.fail`` (``Failed``),
  or a group of such failures (Hypothesis reports several distinct bugs as a group);
- ``refusal``: the implementation refused the call with one of the contract's own errors (a
  ``TypeError``, ``ValueError`` or ``IndexError`` whose message starts with ``kv-canary: ``,
  as the contract (§11) says every refusal does) where the test expected it to succeed, e.g. a
  valid source refused while a test builds its inputs;
- ``health-check``: Hypothesis refused to run the test (``FailedHealthCheck``, ``Unsatisfiable``);
- ``flaky``: Hypothesis saw the test fail and then pass on the same example (``Flaky``);
- ``crash``: any other exception (Python's own ``TypeError`` or ``NameError`` of a broken
  module, an ``IndexError`` of a bad subscript...), and any failure outside the test's call
  (setup, teardown).
"""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Sequence

import pytest

from conformance.report import outcome_counts

if sys.version_info < (3, 11):  # pragma: no cover - the builtin arrived in 3.11
    from exceptiongroup import BaseExceptionGroup

ASSERTION, REFUSAL = "assertion", "refusal"
HEALTH_CHECK, FLAKY, CRASH = "health-check", "flaky", "crash"
KINDS = (ASSERTION, REFUSAL, HEALTH_CHECK, FLAKY, CRASH)
#: the kinds of failure that are failed properties (what counts as a kill: see strength/gate.py)
PROPERTY_FAILURES = (ASSERTION, REFUSAL)

_CONTRACT_ERRORS = (TypeError, ValueError, IndexError)
_CONTRACT_PREFIX = "kv-canary: "

_MESSAGE_CHARS = 300


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions an exception group holds (recursively), or the exception itself."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


def failure_kind(error: BaseException) -> str:
    """The kind (see the module docstring) of a test's failure with ``error``."""
    from hypothesis import errors

    flaky = tuple(
        getattr(errors, name)
        for name in ("Flaky", "FlakyFailure", "FlakyStrategyDefinition", "FlakyReplay")
        if hasattr(errors, name)
    )
    refused = (errors.FailedHealthCheck, errors.Unsatisfiable)
    # Flaky first: FlakyFailure is itself an exception group of the failures it saw.
    if isinstance(error, flaky):
        return FLAKY
    found = leaves(error)
    if any(isinstance(leaf, flaky) for leaf in found):
        return FLAKY
    if any(isinstance(leaf, refused) for leaf in found):
        return HEALTH_CHECK
    assertions = [isinstance(leaf, (AssertionError, pytest.fail.Exception)) for leaf in found]
    refusals = [
        type(leaf) in _CONTRACT_ERRORS and str(leaf).startswith(_CONTRACT_PREFIX) for leaf in found
    ]
    if all(assertions):
        return ASSERTION
    if all(a or r for a, r in zip(assertions, refusals)):
        return REFUSAL
    return CRASH


def describe(error: BaseException) -> dict:
    """Kind, type names (the group's and its leaves') and first message line of ``error``."""
    names = [_name(type(error))]
    if isinstance(error, BaseExceptionGroup):
        names += [_name(type(leaf)) for leaf in leaves(error)]
    lines = str(error).strip().splitlines()
    return {
        "kind": failure_kind(error),
        "types": names,
        "message": (lines[0] if lines else "")[:_MESSAGE_CHARS],
    }


def test_name(nodeid: str) -> str:
    """``module.py::test_function`` of a node id: without its folder and parameters."""
    return nodeid.split("[", 1)[0].rsplit("/", 1)[-1]


class GateRecorder:
    def __init__(self, path: str, config: pytest.Config, stop_at: Sequence[str] = ()) -> None:
        self.path = path
        self.config = config
        self.failures: list[dict] = []
        self.collection_errors: list[dict] = []
        # --gate-stop-at-kill: the listed tests (fnmatch patterns of test_name) whose first
        # failed property ends the run, the mutant killed (strength/gate.py --stop-at-kill)
        self.stop_at = tuple(stop_at)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        report = outcome.get_result()
        if not report.failed:
            return
        if call.excinfo is None:  # e.g. an xfail(strict) that passed
            facts = {"kind": CRASH, "types": [], "message": str(report.longrepr)[:_MESSAGE_CHARS]}
        else:
            facts = describe(call.excinfo.value)
        if call.when != "call":
            facts["kind"] = CRASH
        self.failures.append({"nodeid": report.nodeid, "when": call.when, **facts})
        if facts["kind"] in PROPERTY_FAILURES and any(
            fnmatch.fnmatchcase(test_name(report.nodeid), pattern) for pattern in self.stop_at
        ):
            # as -x does: the run ends as failed (exit 1), not as interrupted
            item.session.shouldfail = f"killed by a listed test, {report.nodeid}"

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.collection_errors.append(
                {"nodeid": report.nodeid, "message": str(report.longrepr)[-_MESSAGE_CHARS:]}
            )

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(
                {
                    "exit_status": int(exitstatus),
                    # tests per outcome, as pytest's last line counts them
                    "tests": outcome_counts(self.config),
                    "failures": self.failures,
                    "collection_errors": self.collection_errors,
                },
                handle,
                indent=1,
            )


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("canary")
    group.addoption(
        "--gate-record",
        default=None,
        metavar="PATH",
        help="write every failing test and the kind of its failure to PATH (JSON)",
    )
    group.addoption(
        "--gate-stop-at-kill",
        action="append",
        default=[],
        metavar="PATTERN",
        help="end the run once a test matching PATTERN (module.py::test_name, fnmatch) fails a "
        "property: the mutant is killed, and the tests after it do not run",
    )


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("--gate-record")
    if path:
        stop_at = config.getoption("--gate-stop-at-kill")
        config.pluginmanager.register(GateRecorder(path, config, stop_at), "canary-gate-record")
