"""canary's constants and enums (``canary.constants``, SGLang's names) and the torch backend's
are SPEC §1's, as the reference spells them: every value, every member."""

from __future__ import annotations

import importlib

import pytest

import reference
from reference import constants as spec

U64 = (1 << 64) - 1
MODULES = ["canary.constants", "canary._torch_contract"]
VALUES = [
    "CANARY_CHAIN_ANCHOR",
    "TOKEN_TO_KV_SLOT_PADDING",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "VIOLATION_FIELDS",
    "MAX_REAL_KV_SOURCES",
]
# the PARTIAL window under each module's own name
PARTIAL_NAMES = {"canary.constants": "PARTIAL_READ_BYTES", "canary._torch_contract": "PARTIAL_WINDOW_BYTES"}
ENUMS = ["RealKvHashMode", "FailReason", "CanaryLaunchTag"]


@pytest.mark.parametrize("module", MODULES)
def test_values_are_the_contracts(module):
    constants = importlib.import_module(module)
    for name in VALUES:
        assert getattr(constants, name) & U64 == getattr(spec, name) & U64, name
    assert getattr(constants, PARTIAL_NAMES[module]) == spec.PARTIAL_READ_BYTES


@pytest.mark.parametrize("module", MODULES)
def test_enums_are_the_contracts(module):
    constants = importlib.import_module(module)
    for name in ENUMS:
        got = {member.name: int(member) for member in getattr(constants, name)}
        assert got == {member.name: int(member) for member in getattr(spec, name)}, name


@pytest.mark.parametrize("module", MODULES)
def test_field_indices_are_the_contracts(module):
    """``FIELD_<field>`` indexes a canary slot's int64 fields as SPEC §5 orders them."""
    constants = importlib.import_module(module)
    for field in spec.CanaryField:
        assert getattr(constants, f"FIELD_{field.name}") == field, field.name


def test_ring_columns_are_the_contracts():
    """canary.constants' ``VIOLATION_<column>`` (SGLang's names) index a ring row as SPEC §5 does."""
    from canary import constants

    for column in spec.ViolationField:
        assert getattr(constants, f"VIOLATION_{column.name}") == column, column.name


def test_the_reference_exports_the_protocol_enums():
    assert reference.RealKvHashMode is spec.RealKvHashMode
    assert reference.CanaryLaunchTag is spec.CanaryLaunchTag
