"""The project's self-tests: the slowest modules first.

``scripts/tests.sh`` runs them with pytest-xdist's ``--dist loadfile``, which hands whole
modules to the workers in collection order: a long module collected last (the detection
table's regeneration is in ``tests/tools``) leaves one worker alone with it at the end. Started
first, the long ones run beside the many short ones instead.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The modules that take longest, longest first (``--durations`` of a CI run).
SLOWEST_FIRST = (
    "tests/suite/test_failure_reports.py",
    "tests/tools/test_detection_table.py",
    "tests/suite/test_not_checked.py",
    "tests/suite/test_cli.py",
    "tests/suite/test_upstream.py",
    "tests/suite/test_expectations.py",
    "tests/strength/test_gate.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = [path for path in SLOWEST_FIRST if not (ROOT / path).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py: SLOWEST_FIRST names no module: {missing}")
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    # a stable sort: within a module, and among the other modules, the order stays pytest's
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
