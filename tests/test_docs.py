"""The docs name files that exist: every repository path the README, CONTRIBUTING.md and the
docs folder write in backticks is there (a layout move must take its docs along)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.house import FOLDERS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ["README.md", "CONTRIBUTING.md", "conformance/README.md", "benchmarks/README.md"] + [
    f"docs/{path.name}" for path in sorted((ROOT / "docs").glob("*.md"))
]
#: The project's top folders, and those of its earlier layout: a backticked token that starts
#: with one of them is a path, which must exist.
TOP = (*FOLDERS, "known_bad", "mutation")
SPAN = re.compile(r"`([^`\s]+)`")
#: Outputs a run writes, named by the docs but never committed.
OUTPUTS = (".sqlite",)


def named_paths(text: str) -> set[str]:
    """Repository paths named in backticks: ``canary/kernels.py``, ``tests/suite/``, and the
    file part of a node id (``conformance/test_golden.py::test_x``)."""
    found = set()
    for match in SPAN.finditer(text):
        path = match.group(1).split("::")[0].rstrip(".,")
        if path.split("/")[0] not in TOP or "/" not in path:
            continue
        if any(mark in path for mark in "*<{[") or path.endswith(OUTPUTS):
            continue  # a pattern, a template or an output, not one file
        found.add(path)
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
    """Each backticked repository path of the doc exists (patterns and outputs aside)."""
    paths = named_paths((ROOT / doc).read_text())
    missing = sorted(
        path
        for path in paths
        if not (ROOT / path).exists()
        and not path.endswith((".sqlite", ".json"))
        or (path.endswith(".json") and "golden" in path and not (ROOT / path).exists())
    )
    assert missing == [], f"{doc} names paths that do not exist: {missing}"


def test_a_missing_path_is_seen():
    """The check can fail: a path that is not there is named, one that is there is not."""
    text = "see `canary/kernels.py`, `canary/nowhere.py` and `tests/suite/`"
    paths = named_paths(text)
    assert paths == {"canary/kernels.py", "canary/nowhere.py", "tests/suite/"}
    assert [p for p in sorted(paths) if not (ROOT / p).exists()] == ["canary/nowhere.py"]


def test_the_performance_record_holds_one_days_figures_in_at_most_300_lines():
    """docs/PERFORMANCE.md keeps the figures of the day it was measured, not a notebook of
    earlier runs: at most 300 lines, and one measurement date."""
    text = (ROOT / "docs" / "PERFORMANCE.md").read_text()
    assert len(text.splitlines()) <= 300, f"docs/PERFORMANCE.md has {len(text.splitlines())} lines"
    dates = set(re.findall(r"\b20\d\d-\d\d-\d\d\b", text))
    assert len(dates) == 1, f"docs/PERFORMANCE.md names the dates {sorted(dates)}, not one day"
