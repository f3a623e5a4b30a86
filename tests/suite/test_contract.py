"""docs/CONTRACT.md is the contract the suite enforces: every message the suite compares
exactly is written there, every section a failure message cites exists, and failure messages
cite the contract in the repository rather than a document a clone does not have."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import strategies as st_kv
from tests.house import FOLDERS

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "CONTRACT.md"
# The modules whose strings become failure messages.
MESSAGE_MODULES = sorted(
    [*ROOT.glob("conformance/test_*.py")]
    + [
        ROOT / "conformance" / name
        for name in ("assertions.py", "support.py", "report.py", "launches.py")
    ]
)
PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def contract_messages(text: str) -> list[str]:
    """The message templates of the contract: code spans that start with ``kv-canary: ``."""
    return re.findall(r"`(kv-canary: [^`]+)`", text)


def template_pattern(template: str) -> re.Pattern:
    """A template as a regex: ``{...}`` stands for any non-empty text."""
    pieces = PLACEHOLDER.split(template)
    return re.compile("(.+?)".join(re.escape(piece) for piece in pieces), re.DOTALL)


RAW_TEMPLATES = contract_messages(CONTRACT.read_text())
TEMPLATES = [template_pattern(t) for t in RAW_TEMPLATES]


def in_contract(message: str) -> bool:
    return any(pattern.fullmatch(message) for pattern in TEMPLATES)


def literals(path: Path):
    """(line, text) of every string literal of ``path`` that is not a docstring; an f-string
    is given with each ``{...}`` replaced by ``0``."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    inside_fstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = ""
            for part in node.values:
                if isinstance(part, ast.Constant):
                    inside_fstrings.add(id(part))
                    text += str(part.value)
                else:
                    text += "0"
            yield node.lineno, text
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and id(node) not in inside_fstrings
        ):
            yield node.lineno, node.value


def test_contract_has_the_messages_and_sections():
    """The contract holds message templates, the numbered sections 1-11 and §3's rules 1-10."""
    text = CONTRACT.read_text()
    assert len(TEMPLATES) >= 15
    for number in range(1, 12):
        assert re.search(rf"(?m)^## {number}\. ", text), f"no section {number}"
    rules = re.findall(r"(?m)^\| (\d+) \| ", text.split("## 3. ")[1].split("## 4. ")[0])
    assert rules == [str(n) for n in range(1, 11)]


def test_template_matching_can_fail():
    """A message that differs from the contract's in one word is not taken for it."""
    assert in_contract("kv-canary: RealKvSource.page_size must be >= 1, got 0")
    assert not in_contract("kv-canary: RealKvSource.page_size must be > 0, got 0")
    assert not in_contract("kv-canary: RealKvSource.page_size must be >= 1 got 0")


def exact_messages_of_the_tables() -> list[tuple[str, str]]:
    """(where, message) of every message the suite's hand-written tables compare exactly."""
    from conformance import test_launch_refusals as launch
    from conformance import test_source_validation as source

    found = [("test_launch_refusals.CAP_MESSAGE", launch.CAP_MESSAGE)]
    for case in launch.CASES:
        if case.message is not None:
            found.append((f"test_launch_refusals.CASES[{case.name}]", case.message))
    for case in source.CASES:
        found.append((f"test_source_validation.CASES[{case[0]}]", case[-1]))
    return found


@pytest.mark.parametrize(("where", "message"), exact_messages_of_the_tables())
def test_every_exact_message_of_the_tables_is_in_the_contract(where, message):
    """Each message a table of the suite compares exactly matches a message of the contract."""
    assert in_contract(message), f"{where}: {message!r} is not in docs/CONTRACT.md"


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st_kv.invalid_source_cases() | st_kv.multi_invalid_source_cases())
def test_every_drawn_source_error_is_in_the_contract(case):
    """Each message the invalid-source strategies make the suite compare exactly is in the contract."""
    error, message = case.expected
    assert in_contract(message), f"{case.recipe}: {message!r} is not in docs/CONTRACT.md"


@pytest.mark.parametrize("path", MESSAGE_MODULES, ids=lambda p: p.name)
def test_kv_canary_messages_in_the_suite_are_in_the_contract(path):
    """Every kv-canary message written into the suite's code (plain or f-string) is in the contract."""
    for line, text in literals(path):
        if text.startswith("kv-canary: ") and not text.startswith("kv-canary: {"):
            if path.name == "report.py":
                continue  # the plugin's own announcements, not an implementation's message
            if any(template.startswith(text) for template in RAW_TEMPLATES):
                continue  # a prefix the suite builds messages from, e.g. "kv-canary: "
            assert in_contract(text), f"{path.name}:{line}: {text!r} is not in docs/CONTRACT.md"


#: The project's own text: every file of its folders, and these files at the top.
TEXT_FOLDERS = FOLDERS
TEXT_FILES = ("README.md", "CONTRIBUTING.md", "tox.ini", "pyproject.toml")
TEXT_SUFFIXES = (".py", ".md", ".txt", ".toml", ".sh", ".ini", ".json", ".yml", ".yaml", "")
#: What the project must not cite: a document a clone does not have (built from pieces, so
#: that this file does not cite it either).
FOREIGN = ("SPEC" + " §", "SPEC" + ".md")
CITATION = re.compile(r"§(\d+)(?: rules? (\d+))?")


def project_texts() -> list[Path]:
    found = [ROOT / name for name in TEXT_FILES if (ROOT / name).exists()]
    for folder in TEXT_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts:
                found.append(path)
    return found


def contract_sections() -> tuple[set[str], set[str]]:
    """The numbers of the contract's sections, and those of §3's rules."""
    text = CONTRACT.read_text()
    sections = set(re.findall(r"(?m)^## (\d+)\. ", text))
    rules = set(re.findall(r"(?m)^\| (\d+) \| ", text.split("## 3. ")[1].split("## 4. ")[0]))
    return sections, rules


def bad_citations(text: str, sections: set[str], rules: set[str]) -> list[str]:
    """What ``text`` cites that the contract lacks: a foreign document, a section number that
    is not one of the contract's, or a rule of §3 that it does not have."""
    bad = [f"cites {foreign!r}" for foreign in FOREIGN if foreign in text]
    for match in CITATION.finditer(text):
        section, rule = match.groups()
        if section not in sections:
            bad.append(f"cites §{section}, which docs/CONTRACT.md lacks")
        elif rule is not None and section == "3" and rule not in rules:
            bad.append(f"cites §3 rule {rule}, which docs/CONTRACT.md lacks")
    return bad


def test_the_project_cites_the_contract_alone():
    """Every file of the project cites one document, docs/CONTRACT.md, as "CONTRACT §N", and
    every section (and §3 rule) it cites exists there."""
    sections, rules = contract_sections()
    texts = project_texts()
    assert len(texts) > 100 and ROOT / "docs" / "CONTRACT.md" in texts
    problems = [
        f"{path.relative_to(ROOT)}: {problem}"
        for path in texts
        for problem in bad_citations(path.read_text(errors="replace"), sections, rules)
    ]
    assert problems == []


def test_a_bad_citation_is_found():
    """The citation check can fail: a foreign document, a missing section, a missing rule."""
    sections, rules = contract_sections()
    assert bad_citations("see CONTRACT §4 and §3 rule 10", sections, rules) == []
    assert len(bad_citations("see " + FOREIGN[0] + "4", sections, rules)) == 1
    assert bad_citations("see CONTRACT §" + "42", sections, rules) == [
        "cites §" + "42, which docs/CONTRACT.md lacks"
    ]
    assert bad_citations("CONTRACT §3 rule " + "11", sections, rules) == [
        "cites §3 rule " + "11, which docs/CONTRACT.md lacks"
    ]


def test_readme_points_to_the_contract():
    """The README names docs/CONTRACT.md as the contract."""
    assert "docs/CONTRACT.md" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize(
    ("message", "word", "named"),
    [
        ("kv-canary: capacity 4, got slot 4", "4", True),
        ("kv-canary: capacity 40, got slot 40", "4", False),
        ("kv-canary: real_kv_sources[0] is on meta", "real_kv_sources[0]", True),
        ("kv-canary: plans must be ...", "plan", False),
        ("kv-canary: context.real_kv_hash_mode must be ...", "mode", False),
        ("kv-canary: mode must be one of [0, 1, 2], got 7", "mode", True),
        ("kv-canary: violation_ring must have dtype torch.int64", "int", False),
        ("kv-canary: got cpus", "cpu", False),
    ],
)
def test_words_are_matched_as_whole_tokens(message, word, named):
    """The launch tables' word checks match a whole token: "4" is not found in "40"."""
    from conformance.launches import names

    assert names(message, word) is named


def test_the_driver_compares_every_field_of_the_oracles_plans():
    """conformance/driver.py's PLAN_FIELDS are the reference's plan fields, in its order: a plan
    field added to the contract (CONTRIBUTING's recipe) is compared after every launch."""
    import dataclasses

    import reference
    from conformance import driver

    want = [("verify", f.name) for f in dataclasses.fields(reference.VerifyPlan)]
    want += [("write", f.name) for f in dataclasses.fields(reference.WritePlan)]
    assert list(driver.PLAN_FIELDS) == want
