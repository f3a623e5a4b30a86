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
  xfail); a failure not listed fails the run as always. Entries that match no collected test
  are printed at the end of the run (a narrowed run, with ``-k``, leaves some unmatched).
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
                item.add_marker(
                    pytest.mark.xfail(reason=entry.reason, strict=True, raises=entry.raises)
                )
                break


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    path, entries = getattr(config, "_canary_expectations", (None, []))
    if not path:
        return
    unmatched = [entry for entry in entries if not entry.matched]
    # a core run leaves the contract's additions out: entries for those are not stale
    left_out = getattr(config, "_canary_level_left_out", [])
    of_other_level = [e for e in unmatched if any(e.regex.match(n) for n in left_out)]
    unmatched = [e for e in unmatched if e not in of_other_level]
    if of_other_level:
        terminalreporter.line(
            f"canary expectations: {len(of_other_level)} entries of {path} name tests of the "
            "full level only, which this run leaves out"
        )
    if unmatched:
        terminalreporter.section("canary expectations matching no collected test")
        for entry in unmatched:
            terminalreporter.line(f"{path}:{entry.line}: {entry.pattern}")
