"""canary's constants and enums (``canary.constants``, SGLang's names) and the torch backend's
are CONTRACT §1's, as the reference spells them: every value, every member."""

from __future__ import annotations

import importlib

import pytest

import reference
from reference import constants as spec

U64 = (1 << 64) - 1
MODULES = ["canary.constants", "canary_torch._contract"]
VALUES = [
    "CANARY_CHAIN_ANCHOR",
    "TOKEN_TO_KV_SLOT_PADDING",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "VIOLATION_FIELDS",
    "MAX_REAL_KV_SOURCES",
]
# the PARTIAL window under each module's own name
PARTIAL_NAMES = {
    "canary.constants": "PARTIAL_READ_BYTES",
    "canary_torch._contract": "PARTIAL_WINDOW_BYTES",
}
ENUMS = ["RealKvHashMode", "FailReason", "CanaryLaunchTag"]


@pytest.mark.parametrize("module", MODULES)
def test_values_are_the_contracts(module):
    constants = importlib.import_module(module)
    for name in VALUES:
        assert getattr(constants, name) & U64 == getattr(spec, name) & U64, name
    assert getattr(constants, PARTIAL_NAMES[module]) == spec.PARTIAL_READ_BYTES


@pytest.mark.parametrize("module", ["canary.constants", "canary_torch._plan"])
def test_the_padding_pool_row_is_the_contracts(module):
    """REQ_POOL_IDX_PADDING (CONTRACT §12, §14): pool row 0."""
    assert importlib.import_module(module).REQ_POOL_IDX_PADDING == reference.REQ_POOL_IDX_PADDING
    assert reference.REQ_POOL_IDX_PADDING == 0


@pytest.mark.parametrize("module", MODULES)
def test_enums_are_the_contracts(module):
    constants = importlib.import_module(module)
    for name in ENUMS:
        # __members__, not iteration: iteration skips a member whose value repeats another's
        got = {key: int(member) for key, member in getattr(constants, name).__members__.items()}
        want = {key: int(member) for key, member in getattr(spec, name).__members__.items()}
        assert got == want, name


@pytest.mark.parametrize("module", MODULES)
def test_field_indices_are_the_contracts(module):
    """``CANARY_FIELD_<field>`` (SGLang's name; ``FIELD_<field>`` in canary_torch's private
    module) indexes a canary slot's int64 fields as CONTRACT §5 orders them."""
    constants = importlib.import_module(module)
    prefix = "CANARY_FIELD_" if module.startswith("canary.") else "FIELD_"
    for name, field in spec.CanaryField.__members__.items():
        assert getattr(constants, f"{prefix}{name}") == int(field), name


def test_ring_columns_are_the_contracts():
    """canary.constants' ``VIOLATION_FIELD_<column>`` (SGLang's names) index a ring row as CONTRACT §5 does."""
    from canary import constants

    for name, column in spec.ViolationField.__members__.items():
        assert getattr(constants, f"VIOLATION_FIELD_{name}") == int(column), name


@pytest.mark.parametrize("name", ["CanaryField", "ViolationField", *ENUMS])
def test_no_two_members_share_a_value(name):
    """Every member of CONTRACT §1's enums is its own value: none is an alias of another."""
    members = getattr(spec, name).__members__
    assert len({int(member) for member in members.values()}) == len(members)


def test_the_reference_exports_the_protocol_enums():
    assert reference.RealKvHashMode is spec.RealKvHashMode
    assert reference.CanaryLaunchTag is spec.CanaryLaunchTag
