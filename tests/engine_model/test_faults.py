"""engine_model.faults: the fault classes are listed in one place. The registry, the class table of
CONTRACT §15 and the tables of docs/DETECTION.md name the same classes (the detection table in
the registry's order, with each class's description), and every class is a whole object."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from engine_model.faults import FAULT_KINDS, FAULTS, KV_BYTE_FAULTS, KV_FAULTS, FaultClass

ROOT = Path(__file__).resolve().parents[2]


def contract_classes() -> list[str]:
    """The classes the first column of CONTRACT §15's class table names, in its order."""
    text = (ROOT / "docs" / "CONTRACT.md").read_text()
    section = text[text.index("## 15. ") :]
    section = section[: section.index("\n## ", 1)]
    table = section[section.index("| class | made | reported |") :].split("\n\n")[0]
    names = []
    for line in table.splitlines()[2:]:
        names += re.findall(r"`([a-z_]+)`", line.split("|")[1])
    return names


def detection_rows() -> list[list[tuple[str, str]]]:
    """``(class, description)`` of each row of each table of docs/DETECTION.md."""
    tables = []
    for block in (ROOT / "docs" / "DETECTION.md").read_text().split("| fault |")[1:]:
        rows = []
        for line in block.split("\n\n")[0].splitlines()[2:]:
            m = re.match(r"\| `([a-z_]+)`(?:: ([^|]+))? \|", line)
            assert m, line
            rows.append((m.group(1), (m.group(2) or "").strip()))
        tables.append(rows)
    return tables


def test_the_contract_names_every_class_of_the_registry_and_no_other():
    assert sorted(contract_classes()) == sorted(FAULT_KINDS)


def test_the_detection_table_has_a_row_per_class_in_the_registrys_order():
    first, serving, sglang, by_mode = detection_rows()
    assert [name for name, _ in first] == list(FAULT_KINDS)
    assert [name for name, _ in serving] == list(FAULT_KINDS)
    assert [text for _, text in first] == [FAULTS[k].description for k in FAULT_KINDS]
    assert [name for name, _ in sglang] == list(KV_BYTE_FAULTS)
    assert [name for name, _ in by_mode] == list(FAULT_KINDS)


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_class_is_one_whole_object(kind):
    cls = FAULTS[kind]
    assert isinstance(cls, FaultClass) and cls.name == kind
    assert cls.description and "\n" not in cls.description
    assert cls.__doc__, "a class says what it is and what it predicts"
    for method in ("make", "due"):
        assert getattr(type(cls), method) is not getattr(FaultClass, method), method
    assert cls.changes_kv == (kind in KV_FAULTS)
    assert not (cls.flips_byte and not cls.changes_kv)
    assert not (cls.unseeable and cls.changes_kv), "a class that changes KV is seen in ALL"


@pytest.mark.parametrize("write_input_assert", [True, False])
def test_a_moved_position_is_due_where_a_check_can_see_it(write_input_assert):
    """``positions_moved`` predicts its ``WRITE_POSITION`` where the write's input assert is on,
    or where the moved token has a predecessor for the chain's position check: a fresh
    request's first token, moved in an engine without the assert, is due nowhere."""
    from engine_model import Engine, EngineConfig
    from reference import FailReason

    cls = FAULTS["positions_moved"]
    engine = Engine(EngineConfig(write_input_assert=write_input_assert, seed=5))
    engine.admit(3)
    fault = cls.make(engine, 0, 0)
    assert fault is not None
    assert engine.prefill(3) is not None  # the fresh request's first token moves
    dues = cls.due_after_settle(engine, fault)
    assert dues is not None and (len(dues) > 0) == write_input_assert, dues
    fault = cls.make(engine, 0, 0)
    assert fault is not None
    assert engine.decode() is not None  # a decode's token follows the request's last
    dues = cls.due_after_settle(engine, fault)
    moved = int(FailReason.WRITE_POSITION_MISMATCH)
    assert dues and all(int(d.bits) & moved for d in dues), dues


@pytest.mark.parametrize("kind", ["req_to_token", "page_swap"])
def test_a_page_table_fault_promises_nothing_until_its_request_runs_again(kind):
    """A changed page-table entry is read by its own request's next verify: before that
    request runs again nothing is promised (an admission can take the SWA pages it waits
    for); once it has, the class's reports are."""
    from engine_model import Engine, EngineConfig

    cls = FAULTS[kind]
    engine = Engine(EngineConfig(page_size=2, seed=7))
    for _ in range(3):
        engine.admit(6)
    assert engine.prefill(18) is not None
    made = cls.make(engine, 0, 0)
    assert made is not None and made.entries
    fault = dataclasses.replace(made, made_at=engine.steps)  # as the harness stamps it
    assert cls.due_after_settle(engine, fault) is None  # nobody ran since
    assert engine.decode() is not None
    assert cls.due_after_settle(engine, fault) == []
