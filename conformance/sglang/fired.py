"""The checks SGLang's runtime fired in the manager leg's trials, per step label: the counts
(:func:`fired_counts`), the printed table (:func:`fired_table`), and ``conformance/README.md``'s
table held to them (:func:`readme_never_cells`, :func:`table_problems`): a cell that says a
check cannot fire never does, and every other cell fires.

A fired report is counted as ``(step label, launch tag, reasons)``, the label's text
(:func:`conformance.sglang.histories.step_label`); the README's header names a label by its
short name (``graph DECODE``).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import reference
from conformance.sglang.histories import REQUIRED_STEPS

__all__ = [
    "CHECKS",
    "README",
    "README_LABELS",
    "fired_counts",
    "fired_table",
    "readme_never_cells",
    "table_problems",
]

#: The checks of the kernels' reports (``FAIL_REASON_BITS``), as the firing table names them.
CHECKS = {
    "CHAIN": reference.FailReason.VERIFY_CHAIN_HASH_MISMATCH,
    "POSITION": reference.FailReason.VERIFY_POSITION_MISMATCH,
    "REAL_KV": reference.FailReason.VERIFY_REAL_KV_HASH_MISMATCH,
    "TOKEN": reference.FailReason.VERIFY_TOKEN_MISMATCH,
    "WRITE_TOKEN": reference.FailReason.WRITE_TOKEN_MISMATCH,
    "WRITE_POSITION": reference.FailReason.WRITE_POSITION_MISMATCH,
}
#: The README that keeps today's table.
README = Path(__file__).resolve().parents[1] / "README.md"
#: The README's short names of the step labels in the table's header, and their text.
README_LABELS = {label.short: str(label) for label in REQUIRED_STEPS if label.short != str(label)}


def fired_counts(fired: Counter) -> dict[tuple[str, str], int]:
    """Reports per ``(check, step label)``, every label that ran: 0 where the check never
    fired there."""
    labels = sorted({label for label, _, _ in fired})
    return {
        (name, label): sum(
            n for (other, _, bits), n in fired.items() if other == label and bits & int(bit)
        )
        for name, bit in CHECKS.items()
        for label in labels
    }


def fired_table(fired: Counter) -> list[str]:
    """The checks SGLang's runtime fired, per step label, as markdown rows."""
    counts = fired_counts(fired)
    labels = sorted({label for _, label in counts})
    lines = ["| check | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    for name in CHECKS:
        cells = [str(counts[name, label] or "never") for label in labels]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def readme_never_cells(readme: Path = README) -> tuple[str, set[tuple[str, str]]]:
    """The release of ``conformance/README.md``'s table of the checks SGLang's runtime fired
    ("Today on X, ..."), and its cells that say the check cannot fire (``cannot``, or a
    divergence's tag): ``(check, step label)`` pairs, the labels as :func:`fired_table` names
    them."""
    text = readme.read_text()
    release = re.search(r"Today on (\S+), the checks SGLang's runtime fired", text)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = next(line for line in lines if line.startswith("| check |"))
    labels = [README_LABELS.get(c, c) for c in (c.strip() for c in header.strip("|").split("|"))]
    never = set()
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in CHECKS:
            never |= {
                (cells[0], label)
                for label, cell in zip(labels[1:], cells[1:], strict=True)
                if cell == "cannot" or cell.startswith("[")
            }
    if release is None or not never:
        raise LookupError("conformance/README.md has no table of the checks SGLang fired")
    return release.group(1), never


def table_problems(fired: Counter, cannot: set[tuple[str, str]]) -> list[str]:
    """Where the run's fired checks disagree with a table whose ``cannot`` cells never fire
    and whose other cells do (:func:`readme_never_cells`)."""
    never = {cell for cell, n in fired_counts(fired).items() if n == 0}
    return [
        f"{check} never fired in {label}, which the README says it does"
        for check, label in sorted(never - cannot)
    ] + [
        f"{check} fired in {label}, which the README says it cannot"
        for check, label in sorted(cannot - never)
    ]
