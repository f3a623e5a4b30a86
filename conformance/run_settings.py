"""The run's settings as given: each option's value and where it came from (the flag, else its
environment variable), refused with a usage error that names that source when it is empty,
unknown, or given twice with two values (the last would silently win)."""

from __future__ import annotations

import os
import re

import pytest

from . import levels

#: The suite's options that take one value: given twice with two values, a run stops.
SINGLE_VALUED = ("--canary-impl", "--canary-device", "--canary-level", "--canary-report",
                 "--canary-expect")  # fmt: skip


def named(source: str, value: object) -> str:
    """How an error names a value by where it came from: ``--canary-impl 'x'``, ``CANARY_IMPL='x'``."""
    return f"{source} {value!r}" if source.startswith("-") else f"{source}={value!r}"


def setting(config: pytest.Config, option: str, variable: str | None) -> tuple[str | None, str]:
    """A run setting as given, and where from: the flag, else the variable; (None, flag) when
    neither is set. An empty value (what an unset shell variable gives) is a usage error naming
    its source: it never falls back to the default."""
    value = config.getoption(option, default=None)
    source = option
    if value is None and variable:
        value = os.environ.get(variable)
        source = variable if value is not None else option
    if value is not None and not value.strip():
        raise pytest.UsageError(
            f"{source} is empty"
            + ("" if source.startswith("-") else " (set, but to nothing)")
            + "; give a value, or "
            + ("leave the option out" if source.startswith("-") else "unset it")
            + " for the default"
        )
    return value, source


#: The profiles the suite loads for one given: ``ci`` on the CPU is ``ci-cpu``, and so on.
_DERIVED_PROFILE = re.compile(r"(dev|ci|nightly|mutation)(-cpu|-no-shrink|-derandomized)+")


def profile_given(config: pytest.Config) -> str:
    """The Hypothesis profile this run was given (``--hypothesis-profile``, else
    ``$HYPOTHESIS_PROFILE``, else ``ci`` when ``CI`` is set, else ``dev``); an unknown one, or
    a name the suite derives from one (``ci-cpu``), is a usage error naming where it came from."""
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument

    value, source = setting(config, "--hypothesis-profile", "HYPOTHESIS_PROFILE")
    if value is None:
        return "ci" if os.environ.get("CI") else "dev"
    where = named(source, value)
    base = _DERIVED_PROFILE.fullmatch(value)
    if base:
        raise pytest.UsageError(
            f"{where}: the suite derives that name from the profile {base[1]!r} (on the CPU, "
            f"without shrinking or with an expectations file); give {base[1]!r}"
        )
    try:
        settings.get_profile(value)
    except InvalidArgument as error:
        raise pytest.UsageError(
            f"{where}: no such Hypothesis profile; the suite's are dev, ci, nightly (and "
            "mutation: ci without shrinking)"
        ) from error
    return value


def level_given(config: pytest.Config) -> str:
    """The conformance level of this run: ``--canary-level``, else ``$CANARY_LEVEL``, else full."""
    level, source = setting(config, "--canary-level", "CANARY_LEVEL")
    if level is None:
        return levels.FULL
    if level not in levels.LEVELS_ORDER:
        raise pytest.UsageError(
            f"{named(source, level)}: the levels are {', '.join(levels.LEVELS_ORDER)}"
        )
    return level


def given_values(args: list[str], option: str) -> list[str]:
    """The values ``option`` is given in ``args`` (``--opt VALUE`` and ``--opt=VALUE``)."""
    values = []
    for index, arg in enumerate(args):
        if arg == option and index + 1 < len(args):
            values.append(args[index + 1])
        elif arg.startswith(f"{option}="):
            values.append(arg.split("=", 1)[1])
    return values


def check_given_once(args: list[str]) -> None:
    """An option of :data:`SINGLE_VALUED` given twice with two values is a usage error."""
    for option in SINGLE_VALUED:
        values = list(dict.fromkeys(given_values(args, option)))
        if len(values) > 1:
            raise pytest.UsageError(
                f"{option} is given twice, as {values[0]!r} and as {values[1]!r}; give it once"
            )
