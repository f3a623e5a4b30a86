"""The suite's own command: ``kv-canary-conformance`` (also ``python -m conformance``).

It runs the installed suite with its plugin loaded, wherever it is started: the ``--canary-*``
options and any other pytest arguments pass through, and the report header, the summary table
and the exit status are those of ``pytest conformance``. Without a test selection it runs the
whole suite (``--pyargs conformance``); a selection is given as pytest takes it under
``--pyargs``, e.g. ``conformance.test_buffers`` or ``-k numpy``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from conformance.report import EXIT_STATUSES

#: (option, its environment variable, what it does): what --help lists.
OPTIONS = (
    ("--canary-impl MODULE", "CANARY_IMPL", "the implementation: a dotted module, a .py file or a package folder (default canary)"),
    ("--canary-device DEV", "CANARY_DEVICE", "the device of the tensors (default cuda if available, else cpu)"),
    ("--canary-level core|full", "CANARY_LEVEL", "core: what SGLang's kv_canary promises; full (default): the whole contract"),
    ("--canary-expect FILE", "CANARY_EXPECT", "the tests expected to fail, each with its reason (strict; a ci run also refuses an entry that matches no test)"),
    ("--canary-allow-missing GROUP", "CANARY_ALLOW_MISSING", "a group the implementation may lack (write_verify, plan); without it a run that skips one exits 7"),
    ("--canary-report PATH", "", "also write the report as JSON to PATH"),
    ("--canary-no-shrink", "", "report each failing property's first example, unshrunk"),
    ("--hypothesis-profile P", "HYPOTHESIS_PROFILE", "dev, ci (default when CI is set), nightly"),
)  # fmt: skip


def usage() -> str:
    width = max(len(option) for option, _, _ in OPTIONS)
    lines = [
        "usage: kv-canary-conformance [OPTIONS] [PYTEST ARGUMENTS]",
        "",
        "Runs the KV-canary conformance suite (python -m conformance does the same).",
        "",
        "options (environment variable in brackets):",
    ]
    for option, env, what in OPTIONS:
        lines.append(f"  {option:<{width}}  {what}" + (f" [{env}]" if env else ""))
    lines += [
        "",
        "Any other argument goes to pytest (-x, -k EXPR, -q, ...; see pytest --help). Without a",
        "test selection the whole suite runs; select as pytest does under --pyargs, e.g.",
        "conformance.test_buffers. The summary names what the run did not check.",
        "",
        "exit status:",
    ]
    lines += [f"  {code}  {word}: {meaning}" for code, word, meaning in EXIT_STATUSES]
    return "\n".join(lines)


PROG = "kv-canary-conformance"
SUITE_DIR = Path(__file__).resolve().parent


#: Set by ``scripts/conformance.sh`` to the command it was run as (``bash scripts/conformance.sh``).
PROG_VARIABLE = "KV_CANARY_PROG"


def prog() -> str:
    """The command's name as it was run: the script's, ``python -m conformance`` or the
    console script."""
    given = os.environ.get(PROG_VARIABLE, "").strip()
    if given:
        return given
    return "python -m conformance" if Path(sys.argv[0]).name == "__main__.py" else PROG


def one_line(message: str) -> str:
    """A usage error of pytest's parser (``usage: ...`` on a line of its own, then ``PROG:
    error: ...``) in one line, with where the options are listed."""
    lines = message.splitlines()
    if len(lines) > 1 and lines[0].startswith("usage: "):
        return " ".join(line.strip() for line in lines[1:]) + f" (see {prog()} --help)"
    return message


def _parser(args: Sequence[str]):
    """pytest's parser of the command line, with the plugins a run with ``args`` loads: the
    suite's, those given with ``-p``, those installed and those of ``PYTEST_PLUGINS``."""
    from _pytest.config import get_config

    config = get_config(list(args))
    manager = config.pluginmanager
    manager.consider_preparse(list(args), exclude_only=False)
    if not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        manager.load_setuptools_entrypoints("pytest11")
    manager.consider_env()
    manager.import_plugin("conformance.plugin")
    parser = config._parser
    if getattr(parser, "optparser", None) is not None:  # pytest 9: argparse's own prog
        parser.optparser.prog = prog()
    else:
        parser.prog = prog()
    return parser


def _read(parser, args: Sequence[str]) -> argparse.Namespace:
    import pytest

    namespace, unknown = parser.parse_known_and_unknown_args(list(args))
    if unknown:
        raise pytest.UsageError(f"{prog()}: error: unrecognized arguments: {' '.join(unknown)}")
    return namespace


def parse(args: Sequence[str]) -> argparse.Namespace:
    """``args`` as pytest reads them: the options, their values and the test selections
    (``file_or_dir``). An unknown option, or one without its value, is a
    :class:`pytest.UsageError`, as in pytest."""
    return _read(_parser(args), args)


_PROBE = "kv-canary-conformance-probe"


def selection_positions(args: Sequence[str]) -> list[int]:
    """Where in ``args`` the test selections are: the arguments that pytest's parser reads as
    neither an option nor an option's value (each is put to the parser in turn)."""
    import pytest

    parser = _parser(args)
    _read(parser, args)
    positions = []
    for index, arg in enumerate(args):
        if arg.startswith("-"):
            continue
        probe = [*args[:index], _PROBE, *args[index + 1 :]]
        try:
            namespace = _read(parser, probe)
        except pytest.UsageError:  # the probe is no valid value: args[index] is one
            continue
        if _PROBE in (getattr(namespace, "file_or_dir", None) or []):
            positions.append(index)
    return positions


def has_selection(args: Sequence[str]) -> bool:
    """Whether ``args`` name tests to run."""
    return bool(selection_positions(args))


def suite_selection(arg: str, cwd: Path | None = None) -> str:
    """``arg`` as the run passes it to pytest (under ``--pyargs``), when it names tests of the
    suite: a module (``conformance.test_buffers``), a test in one (``...::test_x[id]``), the suite
    (``conformance``), or a path in the suite's folder, also as the reports print it
    (``conformance/test_buffers.py::test_x``, from any folder). Else a usage error."""
    import importlib.util

    import pytest

    cwd = cwd or Path.cwd()
    base = arg.partition("[")[0].split("::")[0]
    found: Path | None = None
    if base and all(part.isidentifier() for part in base.split(".")):
        if base == "conformance" or base.startswith("conformance."):
            try:
                spec = importlib.util.find_spec(base)
            except (ImportError, ValueError):
                spec = None
            if spec is not None and spec.origin:
                found = Path(spec.origin).resolve()
                found = found.parent if found.name == "__init__.py" else found
    else:
        path = Path(base)
        if not (cwd / path).exists() and path.parts[:1] == ("conformance",):
            # the suite's own id, from a folder that has no conformance/ of its own
            arg = str(SUITE_DIR.joinpath(*path.parts[1:])) + arg[len(base) :]
            path = SUITE_DIR.joinpath(*path.parts[1:])
        path = (cwd / path).resolve()
        if path.exists():
            found = path
    if found is None or not (found == SUITE_DIR or found.parent == SUITE_DIR):
        raise pytest.UsageError(
            f"{arg!r} is not a test of the suite ({SUITE_DIR}): the command runs the suite's tests "
            "only; select them as conformance.test_buffers, conformance.test_buffers::test_x or "
            "conformance/test_buffers.py::test_x, or with -k" + implementation_hint(arg, cwd)
        )
    return arg


def implementation_hint(arg: str, cwd: Path) -> str:
    """Where ``arg``, given as a test selection, is a .py file or a package folder: how to
    give it as the implementation under test instead."""
    path = (cwd / arg).resolve()
    if (path.is_file() and path.suffix == ".py") or (path / "__init__.py").is_file():
        quoted = shlex.quote(arg)
        return f"; to test the implementation {quoted}, give it as --canary-impl {quoted}"
    return ""


def pytest_args(args: Sequence[str]) -> list[str]:
    """The arguments of the pytest run that ``kv-canary-conformance args`` makes: the suite's
    plugin, ``--pyargs``, each selection as :func:`suite_selection` gives it, and the suite
    itself when nothing is selected.

    The suite's folder's parent is the run's rootdir, so that its tests have the ids they have in
    a checkout (``conformance/test_x.py::...``) wherever the suite is installed; pytest's cache
    stays in the current folder. The plugins this command read the arguments with were imported
    before pytest could rewrite their asserts; pytest's warning saying so is left out.
    """
    out = list(args)
    positions = selection_positions(args)
    for index in positions:
        out[index] = suite_selection(args[index])
    suite = [] if positions else ["conformance"]
    given = " ".join(args)
    setup = ["-p", "conformance.plugin", "--pyargs", "--canary-suite-only"]
    setup += ["-W", "ignore::pytest.PytestAssertRewriteWarning"]
    if "--rootdir" not in given:
        setup.append(f"--rootdir={SUITE_DIR.parent}")
        if "no:cacheprovider" not in given and "cache_dir" not in given:
            setup += ["-o", f"cache_dir={Path.cwd() / '.pytest_cache'}"]
    return [*setup, *out, *suite]


def version() -> str:
    """``--version``: the suite's version, with the pytest and Hypothesis it runs on."""
    import pytest

    try:
        own = importlib.metadata.version(PROG)
    except importlib.metadata.PackageNotFoundError:
        own = f"(not installed; from {SUITE_DIR.parent})"
    try:
        hypothesis = importlib.metadata.version("hypothesis")
    except importlib.metadata.PackageNotFoundError:
        hypothesis = "not installed"
    return f"{PROG} {own} (pytest {pytest.__version__}, hypothesis {hypothesis})"


def _say(text: str) -> None:
    """Print ``text``; a reader that stopped early (``| head``) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # what is left of the output goes nowhere, also when Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    import pytest

    try:
        namespace = parse(args)
        if namespace.help:
            _say(usage())
            return 0
        if namespace.version:
            _say(version())
            return 0
        run_args = pytest_args(args)
    except pytest.UsageError as error:
        for message in error.args:
            print(f"ERROR: {one_line(message)}", file=sys.stderr)  # as pytest prints its own
        return int(pytest.ExitCode.USAGE_ERROR)
    except Exception:
        # a plugin cannot be imported (a dependency of the suite missing, say): pytest, failing
        # to load it before it collects anything, says why in its own words
        return int(pytest.main(["-p", "conformance.plugin", *args]))
    # An implementation named as a module of the current folder is found as under python -m,
    # which puts the folder first on sys.path; a console script's sys.path has its own folder
    # instead. Last here, so that the folder's modules never hide the suite's own.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    os.environ.pop(PROG_VARIABLE, None)  # the command's own: no process it starts inherits it
    return int(pytest.main(run_args))


if __name__ == "__main__":
    sys.exit(main())
