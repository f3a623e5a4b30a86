"""The suite's own command: ``kv-canary-conformance`` (also ``python -m conformance``).

It runs the installed suite with its plugin loaded, wherever it is started: the ``--canary-*``
options and any other pytest arguments pass through, and the report header, the summary table
and the exit status are those of ``pytest conformance``. Without a test selection it runs the
whole suite (``--pyargs conformance``); a selection is given as pytest takes it under
``--pyargs``, e.g. ``conformance.test_plans`` or ``-k numpy``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

#: (option, its environment variable, what it does): what --help lists.
OPTIONS = (
    ("--canary-impl MODULE", "CANARY_IMPL", "the implementation: a dotted module, a .py file or a package folder (default canary)"),
    ("--canary-device DEV", "CANARY_DEVICE", "the device of the tensors (default cuda if available, else cpu)"),
    ("--canary-level core|full", "CANARY_LEVEL", "core: what SGLang's kv_canary promises; full (default): the whole contract"),
    ("--canary-expect FILE", "CANARY_EXPECT", "the tests expected to fail, each with its reason (strict)"),
    ("--canary-report PATH", "", "also write the report as JSON to PATH"),
    ("--canary-no-shrink", "", "report each failing property's first example, unshrunk"),
    ("--hypothesis-profile P", "HYPOTHESIS_PROFILE", "dev, ci (default when CI is set), nightly"),
)  # fmt: skip

#: Options of pytest and of the suite that take a value as the next argument.
_TAKES_VALUE = {
    "--canary-impl", "--canary-device", "--canary-level", "--canary-expect", "--canary-report",
    "--hypothesis-profile", "--hypothesis-seed", "-k", "-m", "-p", "-n", "-o", "-c", "-W",
    "--maxfail", "--rootdir", "--durations", "--junitxml", "--basetemp", "--dist", "--tb",
    "--override-ini", "--confcutdir", "--deselect", "--ignore",
}  # fmt: skip


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
        "conformance.test_plans. The exit status is pytest's (0 passed, 1 failed, 5 no tests).",
    ]
    return "\n".join(lines)


def has_selection(args: Sequence[str]) -> bool:
    """Whether ``args`` name tests to run (an argument that is no option and no option's value)."""
    expects_value = False
    for arg in args:
        if expects_value:
            expects_value = False
            continue
        if arg.startswith("-"):
            expects_value = arg in _TAKES_VALUE
            continue
        return True
    return False


def pytest_args(args: Sequence[str]) -> list[str]:
    """The arguments of the pytest run that ``kv-canary-conformance args`` makes."""
    selection = [] if has_selection(args) else ["conformance"]
    return ["-p", "conformance.plugin", "--pyargs", *args, *selection]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(usage())
        return 0
    import pytest

    return int(pytest.main(pytest_args(args)))


if __name__ == "__main__":
    sys.exit(main())
