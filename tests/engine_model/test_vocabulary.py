"""engine_model.vocabulary: each word of a history is spelled once, and everything else derives
its lists from it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import reference
from engine_model import vocabulary as v
from tests.house import PACKAGES

ROOT = Path(__file__).resolve().parents[2]
HOME = ROOT / "engine_model" / "vocabulary.py"

#: Every spelling the vocabulary owns: forward modes, groups, launch stages, step labels (as
#: text, as a table header's short name and as a settle mode's name) and settle modes.
SPELLINGS = frozenset(
    {*v.FORWARD_MODES, *v.GROUPS, *v.LAUNCH_STAGES, *v.SETTLE_MODES, *v.DRAFT_SETTLE_MODES}
    | set(v.MANAGER_SETTLE_MODES)
    | {str(s) for s in (*v.SETTLE_STEPS, *v.MANAGER_SETTLE_STEPS, v.SWEEP_STEP, v.MOVE_STEP)}
    | {s.short for s in (*v.SETTLE_STEPS, *v.MANAGER_SETTLE_STEPS)}
    | {str(v.StepLabel(m, prefill_engine=True)) for m in v.FORWARD_MODES}
    | {str(v.StepLabel(m, graph=True)) for m in v.FORWARD_MODES}
    | {v.situation(s) for s in (*v.SETTLE_STEPS, *v.REQUIRED_FORWARDS)}
)


def spelled_literals(source: str, name: str) -> list[tuple[int, str]]:
    """The string literals of ``source`` that are one of :data:`SPELLINGS`, leaving out
    docstrings (prose may name a mode) and ``__all__`` (names of the module's attributes)."""
    tree = ast.parse(source, name)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skip.update(id(n) for n in ast.walk(node.value))
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in SPELLINGS
        and id(node) not in skip
    )


def test_a_spelling_is_written_as_a_literal_in_the_vocabulary_alone():
    """No module of the project's code (tests aside, which pin spellings) writes a forward mode,
    group, launch stage, step label or settle mode as a string literal: it names the
    vocabulary's constant."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == HOME:
                continue
            rel = path.relative_to(ROOT)
            found += [
                f"{rel}:{line}: {text!r}"
                for line, text in spelled_literals(path.read_text(), str(rel))
            ]
    assert not found, "spelled outside engine_model/vocabulary.py:\n" + "\n".join(found)


def test_the_literal_check_sees_a_mode_but_not_prose_or_exports():
    """The check above finds a literal mode in code, and passes over docstrings and
    ``__all__``."""
    source = (
        '"""A module about DECODE."""\n__all__ = ["SWA"]\n'
        'def f(mode):\n    """TAIL."""\n    return mode == "DECODE" or mode == "x"\n'
    )
    assert spelled_literals(source, "probe") == [(5, "DECODE")]


def test_step_labels_spell_what_the_tables_print():
    """A step label's text, short name and settle-mode name are derived from its fields."""
    graph = v.StepLabel(v.DECODE, graph=True)
    assert (str(graph), graph.short, graph.name) == (
        "DECODE replaying a graph",
        "graph DECODE",
        "DECODE_GRAPH",
    )
    assert (
        str(v.DRAFT_DECODE) == "DECODE of the draft model" and v.DRAFT_DECODE.name == "DRAFT_DECODE"
    )
    assert str(v.StepLabel(v.EXTEND, prefill_engine=True)) == "EXTEND on the prefill engine"
    assert v.SETTLE_MODES == ("DECODE", "DECODE_GRAPH", "MIXED", "TARGET_VERIFY")
    assert v.DRAFT_SETTLE_MODES == ("DRAFT_DECODE", "DRAFT_EXTEND_V2")
    assert v.MANAGER_SETTLE_MODES == (
        "TARGET_VERIFY_GRAPH",
        "DRAFT_DECODE_GRAPH",
        "DRAFT_EXTEND_V2_GRAPH",
    )
    both = v.StepLabel(v.DECODE, draft=True, graph=True)
    assert (str(both), both.short, both.name) == (
        "DECODE of the draft model replaying a graph",
        "graph draft DECODE",
        "DRAFT_DECODE_GRAPH",
    )
    assert v.of_the_draft_model(both) and v.of_the_draft_model(v.StepLabel(v.DRAFT_EXTEND_V2))
    assert not v.of_the_draft_model(graph)
    assert all(v.settle_step(s.name) is s for s in (*v.SETTLE_STEPS, *v.MANAGER_SETTLE_STEPS))


@pytest.mark.parametrize(
    "call",
    [
        lambda: v.StepLabel("DECODING"),
        lambda: v.StepLabel(v.EXTEND, graph=True, prefill_engine=True),
        lambda: v.settle_step("DECODE_REPLAY"),
        lambda: v.launch_tag("MIDDLE", v.FULL),
        lambda: v.launch_tag(v.HEAD, v.FULL, "Q"),
    ],
    ids=[
        "unknown mode",
        "a prefill engine's graph",
        "unknown settle mode",
        "unknown stage",
        "unknown half",
    ],
)
def test_a_word_the_vocabulary_lacks_is_refused(call):
    """A misspelt mode, stage or half is a ValueError, not a new word."""
    with pytest.raises(ValueError):
        call()


def test_launch_tags_are_the_contracts():
    """Every launch stage on every group names a launch tag of the contract, K and V."""
    names = {t.name for t in reference.CanaryLaunchTag}
    made = {v.launch_tag(s, g, h) for s in v.LAUNCH_STAGES for g in v.GROUPS for h in "KV"}
    assert made <= names, made - names
