"""The causes of a run's failures, each named once before the details.

One defect of an implementation (a ``fingerprint`` that raises, a hash computed with the wrong
constant) fails many tests, each with a paragraph of its own. Before those paragraphs a failing
run lists its distinct causes: the exception an implementation raised (its type and message),
or, where the implementation returned something, what differs from the reference (a hash, or
the first field that differs: ``prev_hash of a canary record``), each with the number of
tests it explains, the modules they are in, and one line that reruns one of them.

Failures share a cause when their words do: numbers (slots, counts, hashes) are left out of
the comparison, so ``slot 17 out of range`` and ``slot 3 out of range`` are one cause.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pytest

#: ``raised TypeError: message; CONTRACT ...``: an error the suite caught and judged
_RAISED = re.compile(
    r"raised ([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)): (.*?)"
    r"(?:; CONTRACT|, but |$)",
    re.M,
)
#: ``fingerprint(...): entry 3 (slot 5) = 0x..., but the reference gives 0x...``
_HASH = re.compile(r"^(.*?): entry \d+(?: \([^)]*\))? = 0x[0-9a-f]+, but the reference gives", re.M)
_CALL = re.compile(r"([A-Za-z_]\w*)\(")
#: a stored engine-scale fingerprint vector's ``entry 0 (slot 0): hash got 0x..., want 0x...``
_ENTRY_HASH = re.compile(r"^entry -?\d+ \(slot -?\d+\): hash got ", re.M)
_RECORD = re.compile(r"^slot -?\d+: (\w+) got ")
_RING = re.compile(r"^ring row \d+ \(slot -?\d+\): (\w+) got ")
_RING_ROWS = (
    (re.compile(r"^ring row missing"), "a ring row the reference stores is missing"),
    (re.compile(r"^ring row extra"), "a ring row the reference does not store"),
    (re.compile(r"^\d+ ring rows stored, want \d+"), "the number of ring rows stored"),
)
_INDEXED = re.compile(r"^([A-Za-z_]\w*)\[[^\]]*\] got ")
_GOT = re.compile(r"^(.+?):? got .+?, want ")
_NUMBER = re.compile(r"0x[0-9a-fA-F]+|-?\d+")
LIMIT = 200


def _is_verdict(error: BaseException) -> bool:
    """Whether ``error`` is the suite's judgement (an assertion), not a cause of its own."""
    return isinstance(error, (AssertionError, pytest.fail.Exception))


def _words(error: BaseException) -> str:
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {text}"[:LIMIT] if text else type(error).__name__


def _first(error: BaseException | None) -> BaseException | None:
    """The first failure of a group of them (Hypothesis' distinct failures), else ``error``."""
    while isinstance(getattr(error, "exceptions", None), tuple) and error.exceptions:
        error = error.exceptions[0]  # an exception group (a backport's, before Python 3.11)
    return error


def _message(error: BaseException | None, text: str) -> list[str]:
    """The lines of the failure's message: the verdict's own, or pytest's ``E`` lines."""
    if error is not None:
        lines = str(error).splitlines()
    else:
        lines = [line[1:] for line in text.splitlines() if line.startswith(("E ", "E\t"))]
        lines = lines or text.splitlines()
    lines = [line.strip() for line in lines if line.strip()]
    if lines and lines[0].startswith("AssertionError: "):
        lines[0] = lines[0].removeprefix("AssertionError: ")
    return lines


def difference(lines: list[str]) -> str | None:
    """What differs from the reference, by name: a hash, or the first field that differs."""
    text = "\n".join(lines)
    found = _HASH.search(text)
    if found:
        calls = _CALL.findall(found[1]) or found[1].split()[:1]
        return f"{calls[-1] if calls else 'a call'} returns a hash other than the reference's"
    if _ENTRY_HASH.search(text):
        return "fingerprint returns a hash other than the reference's"
    for line in lines:
        for pattern, kind in ((_RECORD, "of a canary record"), (_RING, "of a ring row")):
            match = pattern.match(line)
            if match:
                return f"the first differing field: {match[1]} {kind}"
        for pattern, words in _RING_ROWS:
            if pattern.match(line):
                return f"the first differing field: {words}"
        match = _INDEXED.match(line) or _GOT.match(line)
        if match:
            return f"the first differing field: {match[1]}"
    return None


def cause_of(error: BaseException | None, text: str = "") -> str:
    """The cause of one failure, from its exception (``error``) or its report's ``text``: an
    error the implementation raised (also one the suite caught and names), else what differs
    from the reference, else the message's first line."""
    error = _first(error)
    if error is not None and not _is_verdict(error):
        return _words(error)
    lines = _message(error, text)
    raised = _RAISED.search("\n".join(lines))
    if raised:
        return f"{raised[1]}: {raised[2].strip()}"[:LIMIT]
    differs = difference(lines)
    if differs:
        return differs
    chained = error.__cause__ or error.__context__ if error is not None else None
    if chained is not None and not _is_verdict(chained):
        return _words(chained)
    return (lines[0] if lines else "no message")[:LIMIT]


def key(cause: str) -> str:
    """What two failures must share to share a cause: the words, not the numbers."""
    return _NUMBER.sub("#", cause)


@dataclass
class Cause:
    """One cause of a run's failures: its words (as the first test gave them), the tests it
    explains, in the run's order, and their modules."""

    cause: str
    ids: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def first(self) -> str:
        return self.ids[0]

    @property
    def modules(self) -> dict[str, int]:
        return dict(Counter(test_id.split("::", 1)[0].rsplit("/", 1)[-1] for test_id in self.ids))


def group(failures: Iterable[tuple[str, str]]) -> list[Cause]:
    """(test id, cause) pairs as causes, the one explaining most tests first."""
    groups: dict[str, Cause] = {}
    for test_id, cause in failures:
        groups.setdefault(key(cause), Cause(cause)).ids.append(test_id)
    return sorted(groups.values(), key=lambda c: -c.count)


def heading(causes: list[Cause]) -> str:
    failures = sum(c.count for c in causes)
    return (
        f"kv-canary: {failures} failure{'s' * (failures != 1)}, {len(causes)} "
        f"cause{'s' * (len(causes) != 1)} (each once; the details follow)"
    )


def lines(causes: list[Cause], rerun: Callable[[str], str]) -> list[str]:
    """The section's lines: each cause once, its count, its modules, one rerun line."""
    out = []
    for cause in causes:
        modules = ", ".join(f"{name} ({n})" for name, n in cause.modules.items())
        out += [
            f"{cause.count} test{'s' * (cause.count != 1)}: {cause.cause}",
            f"    in {modules}",
            f"    rerun one: {rerun(cause.first)}",
        ]
    return out
