"""Expected failures of one implementation (``--canary-expect FILE``), and its capabilities.

A pytest plugin module, registered by ``conformance.plugin``. Two things about the module
under test that the suite must know before it collects:

- **Expectations.** ``--canary-expect FILE`` (or ``CANARY_EXPECT``) names a file of tests
  expected to fail for this implementation, one per line, each with a one-line reason::

      # comment lines and blank lines are ignored
      conformance/test_golden.py::test_fingerprint_vector[fp-nd-rows-*]  # [1] N-D source refused

  The test id is the suite's node id (``conformance/test_x.py::...``, whatever folder pytest
  runs the suite from, an installed copy included); ``*`` matches any run of characters
  and every other character is literal (``[`` included). The reason follows the first
  ``" # "`` and must not be empty. ``ID -> ValueError  # reason`` narrows the entry to one
  exception type (a builtin one): the test then fails the run if it fails any other way. An entry names tests inside a module: its pattern holds
  ``::`` followed by a literal character, so no entry hides a whole module. A listed test that
  fails is reported as xfail with its reason; a listed test that passes fails the run (strict
  xfail), and names the entry to remove, by file and line; a failure not listed fails the run
  as always. An entry that matches no test of the modules the run collected (an entry of a
  test that ``-k``, ``-m`` or the level left out, or of a module the selection does not
  collect, is not judged) is stale: it would hide the test that takes its name later. It is
  named at the end of the run, and a strict run fails on it (exit 1): one with the ``ci``
  profile (:data:`STRICT_PROFILES`; the default where ``CI`` is set, and what the SGLang legs
  run). Any other run, the default ``dev`` one included, names it as a warning.
  An expectations file records the failures of a fixed set of examples, so a run with one is
  derandomized: a random profile (``dev``, ``nightly``) is loaded as ``<profile>-derandomized``.

- **Capabilities.** The module under test may declare ``CANARY_CAPABILITIES``, a dict; the
  suite knows ``source_ndim_max`` (an int >= 2: the highest rank of a source tensor it takes).
  It becomes :data:`conformance.profiles.SOURCE_NDIM_MAX`, which the suite passes to the
  strategies (``max_ndim``), so that generated layouts, the suite's fixed layouts and its
  launch-check world stay within it, and the suite's dedicated N-D tests alone show the limit.
"""

from __future__ import annotations

import builtins
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import settings

from conformance import profiles
from conformance.plugin import named, setting
from conformance.report import suite_id

KNOWN_CAPABILITIES = ("source_ndim_max",)
_SEPARATOR = " # "


@dataclass
class Entry:
    """One line of an expectations file."""

    pattern: str
    reason: str
    line: int
    regex: re.Pattern = field(repr=False)
    raises: type[BaseException] | None = None
    matched: int = 0

    @property
    def module(self) -> str:
        """The module the entry's tests are in, as the suite's ids name it."""
        return self.pattern.partition("::")[0]


class ExpectationsError(ValueError):
    """A malformed expectations file."""


def _compile(pattern: str) -> re.Pattern:
    return re.compile("".join(".*" if c == "*" else re.escape(c) for c in pattern) + r"\Z")


def parse(text: str, *, source: str = "<expectations>") -> list[Entry]:
    """The entries of an expectations file; :class:`ExpectationsError` names a bad line."""
    entries: list[Entry] = []
    if text.startswith("\ufeff"):
        raise ExpectationsError(
            f"{source}:1: the file starts with a UTF-8 byte-order mark, which would hide its "
            "first entry; save it as UTF-8 without one"
        )
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        pattern, separator, reason = line.partition(_SEPARATOR)
        pattern, reason = pattern.strip(), reason.strip()
        if not separator or not reason:
            raise ExpectationsError(
                f"{where}: every entry needs a reason after ' # ', got {line!r}"
            )
        raises = None
        pattern, arrow, exception = pattern.partition(" -> ")
        pattern = pattern.strip()
        if arrow:
            raises = getattr(builtins, exception.strip(), None)
            if not (isinstance(raises, type) and issubclass(raises, BaseException)):
                raise ExpectationsError(
                    f"{where}: {exception.strip()!r} is not a builtin exception type"
                )
        module, sep, rest = pattern.partition("::")
        if not sep or not rest or rest[0] == "*" or "*" in module:
            raise ExpectationsError(
                f"{where}: {pattern!r} would hide a whole module; name tests inside one "
                "(a literal module path, '::', then a literal start of the test name)"
            )
        earlier = next((entry for entry in entries if entry.pattern == pattern), None)
        if earlier is not None:  # the first would take its tests: it would match nothing
            raise ExpectationsError(
                f"{where}: {pattern!r} is listed twice, also on line {earlier.line}; keep one"
            )
        entries.append(Entry(pattern, reason, number, _compile(pattern), raises))
    return entries


def load(path: str, where: str | None = None) -> list[Entry]:
    """The entries of the expectations file at ``path``; a file that cannot be read, is not
    UTF-8 or is malformed is a usage error naming ``where`` it came from (the flag by default)."""
    where = where or f"--canary-expect {path!r}"
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as error:
        raise pytest.UsageError(f"{where}: {error}") from error
    except UnicodeDecodeError as error:
        raise pytest.UsageError(
            f"{where}: not UTF-8 (byte {error.start}: {error.reason}); save it as UTF-8"
        ) from error
    try:
        return parse(text, source=path)
    except ExpectationsError as error:
        raise pytest.UsageError(f"{where}: {error}") from error


def capabilities(module) -> dict:
    """The module's declared ``CANARY_CAPABILITIES``, checked; {} when it declares none."""
    declared = getattr(module, "CANARY_CAPABILITIES", None)
    if declared is None:
        return {}
    name = getattr(module, "__name__", "?")
    if not isinstance(declared, dict):
        raise pytest.UsageError(f"{name}.CANARY_CAPABILITIES must be a dict, got {declared!r}")
    unknown = sorted(set(declared) - set(KNOWN_CAPABILITIES))
    if unknown:
        raise pytest.UsageError(
            f"{name}.CANARY_CAPABILITIES: unknown {', '.join(unknown)}; the suite knows "
            f"{', '.join(KNOWN_CAPABILITIES)}"
        )
    ndim = declared.get("source_ndim_max")
    if ndim is not None and (isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 2):
        raise pytest.UsageError(
            f"{name}.CANARY_CAPABILITIES['source_ndim_max'] must be an int >= 2, got {ndim!r}"
        )
    return dict(declared)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("canary").addoption(
        "--canary-expect",
        default=None,
        metavar="FILE",
        help="tests expected to fail for this implementation, each with a reason "
        "(default: $CANARY_EXPECT); see conformance/expectations.py",
    )


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    path, source = setting(config, "--canary-expect", "CANARY_EXPECT")
    config._canary_expectations = (path, load(path, named(source, path))) if path else (None, [])
    selection = getattr(config, "_canary_selection", None)
    if selection is not None:
        selection.expect_arg = path  # the rerun line names the file: it shaped the examples
    if path and selection is not None and not settings.default.derandomize:
        # a random draw could miss a listed failure, and a strict xfail would then fail the run
        fixed = f"{selection.profile}-derandomized"
        settings.register_profile(
            fixed, parent=settings.get_profile(selection.profile), derandomize=True, database=None
        )
        settings.load_profile(fixed)
        selection.profile = fixed
    declared = capabilities(selection.module) if selection is not None else {}
    config._canary_capabilities = declared
    profiles.SOURCE_NDIM_MAX = declared.get("source_ndim_max")


def pytest_unconfigure(config: pytest.Config) -> None:
    if hasattr(config, "_canary_capabilities"):
        profiles.SOURCE_NDIM_MAX = None


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = []
    path, entries = getattr(config, "_canary_expectations", (None, []))
    if path:
        lines.append(f"canary expectations: {path} ({len(entries)} expected failures)")
    declared = getattr(config, "_canary_capabilities", {})
    if declared:
        lines.append(
            "canary capabilities: " + ", ".join(f"{k}={v!r}" for k, v in sorted(declared.items()))
        )
    return lines


#: The entry that lists a test, on the test's item.
ENTRY = pytest.StashKey[Entry]()
#: The profiles of a strict run: in one, an entry that matches no test fails the run (CI and
#: the SGLang legs run ci; elsewhere the default is dev, and such an entry is a warning).
STRICT_PROFILES = ("ci",)


def strict(config: pytest.Config) -> bool:
    """Whether this run refuses an entry that matches no test."""
    selection = getattr(config, "_canary_selection", None)
    return selection is not None and selection.profile_arg in STRICT_PROFILES


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _, entries = getattr(config, "_canary_expectations", (None, []))
    if not entries:
        return
    for item in items:
        # the suite's own id (conformance/test_x.py::...), also when pytest runs an installed
        # copy and names the test by another path
        nodeid = suite_id(item)
        for entry in entries:
            if entry.regex.match(nodeid):
                entry.matched += 1
                item.stash[ENTRY] = entry
                item.add_marker(
                    pytest.mark.xfail(reason=entry.reason, strict=True, raises=entry.raises)
                )
                break
    config._canary_expect_collected = [suite_id(item) for item in items]


def pytest_deselected(items: list[pytest.Item]) -> None:
    """The tests this run leaves out (``-k``, ``-m``, the level): their entries are not stale."""
    if items:
        left_out = items[0].config.__dict__.setdefault("_canary_expect_deselected", [])
        left_out += [suite_id(item) for item in items]


def narrowed_modules(args: list[str]) -> set[str]:
    """The modules (file names) a selection narrows to some of their tests (``m.py::test_x``):
    an entry of another test of theirs is not stale, only not selected."""
    modules = set()
    for arg in args:
        base, sep, _ = arg.partition("::")
        if sep:
            modules.add(Path(base).name if base.endswith(".py") else base.rsplit(".")[-1] + ".py")
    return modules


def judge(config: pytest.Config) -> None:
    """Which entries match no test of the modules this run collected (stale: an error in a
    strict run), and which name only tests the run left out, from what it collected."""
    path, entries = getattr(config, "_canary_expectations", (None, []))
    collected = getattr(config, "_canary_expect_collected", [])
    left_out = getattr(config, "_canary_expect_deselected", [])
    modules = {test_id.split("::", 1)[0] for test_id in [*collected, *left_out]}
    narrowed = narrowed_modules(list(config.args))
    unmatched = [entry for entry in entries if not entry.matched]
    config._canary_expect_left_out = [
        entry.line for entry in unmatched if any(entry.regex.match(n) for n in left_out)
    ]
    config._canary_expect_stale = [
        entry.line
        for entry in unmatched
        if entry.line not in config._canary_expect_left_out
        and entry.module in modules
        and Path(entry.module).name not in narrowed
    ]
    verdict(config, path)


def verdict(config: pytest.Config, path: str | None) -> None:
    """The reason a strict run with stale entries fails (``Recorder.verdict`` reads it)."""
    count = len(config._canary_expect_stale)
    if count and strict(config):
        config._canary_expect_verdict = (
            f"{count} {'entry' if count == 1 else 'entries'} of {path} "
            f"{'matches' if count == 1 else 'match'} no test (a ci run refuses a stale entry, "
            "which would hide the test that takes its name)"
        )


def _xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.get_plugin("dsession") is not None


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    path, _ = getattr(config, "_canary_expectations", (None, []))
    if path and not _xdist_controller(config):
        judge(config)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On a pytest-xdist worker: what it judged, for the controller, which collects nothing."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None and hasattr(session.config, "_canary_expect_stale"):
        output["canary_expect_stale"] = session.config._canary_expect_stale
        output["canary_expect_left_out"] = session.config._canary_expect_left_out


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """On the pytest-xdist controller: the entries its workers judged (each collects all)."""
    config = node.config
    output = getattr(node, "workeroutput", None) or {}
    if "canary_expect_stale" in output and not hasattr(config, "_canary_expect_stale"):
        config._canary_expect_stale = output["canary_expect_stale"]
        config._canary_expect_left_out = output["canary_expect_left_out"]
        verdict(config, config._canary_expectations[0])


def xpass_message(path: str, entry: Entry) -> str:
    """What to do about a listed test that passed: remove (or narrow) its entry, by file and line."""
    lines = [
        f"expected to fail, but passed: remove its entry from {path}",
        f"  {path}:{entry.line}: {entry.pattern}",
    ]
    if entry.matched > 1:
        lines.append(f"  (it lists {entry.matched} tests: narrow it if the others still fail)")
    return "\n".join(lines)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    """A listed test that passed (pytest's strict XPASS) names its entry and file first."""
    outcome = yield
    report = outcome.get_result()
    entry = item.stash.get(ENTRY, None)
    path, _ = getattr(item.config, "_canary_expectations", (None, []))
    if (
        entry is not None
        and report.when == "call"
        and report.failed
        and isinstance(report.longrepr, str)
        and report.longrepr.startswith("[XPASS(strict)]")
    ):
        report.longrepr = f"{xpass_message(path, entry)}\n{report.longrepr}"


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    path, entries = getattr(config, "_canary_expectations", (None, []))
    if not path:
        return
    by_line = {entry.line: entry for entry in entries}
    left_out = [by_line[line] for line in getattr(config, "_canary_expect_left_out", [])]
    stale = [by_line[line] for line in getattr(config, "_canary_expect_stale", [])]
    if left_out:
        terminalreporter.line(
            f"canary expectations: {len(left_out)} entries of {path} name tests this run "
            "leaves out (-k, -m, the level)"
        )
    if stale:
        them = "it" if len(stale) == 1 else "them"
        terminalreporter.section(
            f"canary expectations matching no test: remove {them} ("
            + (
                "an error in a ci run"
                if strict(config)
                else f"a warning here; a ci run fails on {them}"
            )
            + ")"
        )
        for entry in stale:
            terminalreporter.line(f"{path}:{entry.line}: {entry.pattern}")
