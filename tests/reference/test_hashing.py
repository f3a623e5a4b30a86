"""The oracle's hash primitives reproduce the pinned values of CONTRACT §2 on both paths."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import reference

REPO_ROOT = Path(__file__).resolve().parents[2]

SPLITMIX64_PINNED = [
    (1, 0x5692161D100B05E5),
    (0x9E3779B97F4A7C15, 0xE220A8397B1DCDAF),
    (0xFFFFFFFFFFFFFFFF, 0xB4D055FCF2CBBD7B),
    (0x8000000000000000, 0x25C26EA579CEA98A),
    (reference.CANARY_CHAIN_ANCHOR, 0xDE7FAE23A9A1B716),
    (0, 0),
]

MIX3_PINNED = [
    ((1, 2, 3), 0xA55BDF37C08724B5),
    ((1, 3, 2), 0xE2771370E2E9D965),
]


def test_reference_never_imports_torch():
    """Importing the oracle pulls in no torch module, not even indirectly."""
    code = "import reference, sys; assert 'torch' not in sys.modules, 'torch was imported'"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    SPLITMIX64_PINNED,
    ids=[f"splitmix64({v:#x})" for v, _ in SPLITMIX64_PINNED],
)
def test_splitmix64_scalar_matches_pinned(value, expected):
    """splitmix64 on a Python int gives the CONTRACT §2 value as a Python int."""
    result = reference.splitmix64(value)
    assert type(result) is int
    assert result == expected, f"splitmix64({value:#x}) = {result:#x}, expected {expected:#x}"


def test_splitmix64_array_matches_pinned():
    """splitmix64 on a uint64 array gives the CONTRACT §2 values as uint64, element by element."""
    inputs = np.array([v for v, _ in SPLITMIX64_PINNED], dtype=np.uint64)
    expected = np.array([e for _, e in SPLITMIX64_PINNED], dtype=np.uint64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = reference.splitmix64(inputs)
    np.testing.assert_array_equal(result, expected, strict=True)


def test_splitmix64_signed_inputs_are_twos_complement():
    """A negative input, scalar or int64 array, hashes as its two's complement."""
    assert reference.splitmix64(-1) == 0xB4D055FCF2CBBD7B
    assert reference.splitmix64(-(2**63)) == 0x25C26EA579CEA98A
    signed = np.array([-1, -(2**63), 1], dtype=np.int64)
    expected = np.array([0xB4D055FCF2CBBD7B, 0x25C26EA579CEA98A, 0x5692161D100B05E5], np.uint64)
    np.testing.assert_array_equal(reference.splitmix64(signed), expected, strict=True)
    # Narrower signed dtypes sign-extend like the int64 they would be stored as.
    np.testing.assert_array_equal(
        reference.splitmix64(np.array([-1], dtype=np.int32)), expected[:1], strict=True
    )


def test_splitmix64_scalar_is_taken_modulo_2_64():
    """Python ints outside 64 bits are reduced modulo 2**64 first."""
    assert reference.splitmix64(2**64 + 1) == 0x5692161D100B05E5
    assert reference.splitmix64(np.uint64(1)) == 0x5692161D100B05E5


@pytest.mark.parametrize(
    "value",
    [
        1.0,
        True,
        np.bool_(True),
        "1",
        np.array([1.0]),
        np.array([True]),
        np.array([1], dtype="m8[s]"),  # timedelta64: kind "m", an int64 underneath
        np.array([1], dtype="M8[s]"),
        np.array([1], dtype=object),
    ],
    ids=repr,
)
def test_splitmix64_refuses_what_is_not_an_integer(value):
    """Only integers hash: floats, bools, strings and time or object arrays raise TypeError."""
    with pytest.raises(TypeError, match="expected an integer"):
        reference.splitmix64(value)


def test_splitmix64_array_leaves_input_untouched():
    """The array path returns a new array and does not hash in place."""
    inputs = np.array([1, 2, 3], dtype=np.uint64)
    reference.splitmix64(inputs)
    np.testing.assert_array_equal(inputs, np.array([1, 2, 3], dtype=np.uint64), strict=True)


def test_splitmix64_zero_dimensional_array_stays_an_array():
    """A 0-d array comes back as a 0-d uint64 array, not a numpy scalar."""
    result = reference.splitmix64(np.array(1, dtype=np.uint64))
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, np.array(0x5692161D100B05E5, np.uint64), strict=True)


@pytest.mark.parametrize(
    ("args", "expected"), MIX3_PINNED, ids=[f"splitmix64_mix3{a}" for a, _ in MIX3_PINNED]
)
def test_mix3_scalar_matches_pinned(args, expected):
    """splitmix64_mix3 on Python ints gives the CONTRACT §2 value."""
    result = reference.splitmix64_mix3(*args)
    assert type(result) is int
    assert result == expected, f"splitmix64_mix3{args} = {result:#x}, expected {expected:#x}"


def test_mix3_array_matches_pinned():
    """splitmix64_mix3 on uint64 arrays gives the CONTRACT §2 values element by element."""
    a, b, c = (np.array(column, dtype=np.uint64) for column in zip(*(a for a, _ in MIX3_PINNED)))
    expected = np.array([e for _, e in MIX3_PINNED], dtype=np.uint64)
    np.testing.assert_array_equal(reference.splitmix64_mix3(a, b, c), expected, strict=True)


def test_mix3_mixes_scalars_with_arrays():
    """A Python int argument broadcasts against array arguments."""
    result = reference.splitmix64_mix3(1, np.array([2, 3], dtype=np.uint64), np.array([3, 2]))
    expected = np.array([0xA55BDF37C08724B5, 0xE2771370E2E9D965], dtype=np.uint64)
    np.testing.assert_array_equal(result, expected, strict=True)


def test_mix3_equal_inputs_do_not_cancel():
    """mix3(a, a, a) is neither 0 nor splitmix64(a): each input passes a splitmix step."""
    for a in (1, 7, reference.CANARY_CHAIN_ANCHOR):
        assert reference.splitmix64_mix3(a, a, a) not in (0, reference.splitmix64(a))


def test_signed_unsigned_reinterpretation():
    """to_signed64 and to_unsigned64 reinterpret 64-bit patterns and invert each other."""
    assert reference.to_signed64(2**64 - 1) == -1
    assert reference.to_signed64(2**63) == -(2**63)
    assert reference.to_signed64(2**63 - 1) == 2**63 - 1
    assert reference.to_unsigned64(-1) == 2**64 - 1
    assert reference.to_unsigned64(-(2**63)) == 2**63
    anchor_signed = reference.to_signed64(reference.CANARY_CHAIN_ANCHOR)
    assert anchor_signed == reference.CANARY_CHAIN_ANCHOR - 2**64
    assert reference.to_unsigned64(anchor_signed) == reference.CANARY_CHAIN_ANCHOR
    np.testing.assert_array_equal(
        reference.to_signed64(np.array([2**64 - 1, 5], dtype=np.uint64)),
        np.array([-1, 5], dtype=np.int64),
        strict=True,
    )


def test_unsigned_reinterpretation_keeps_its_kind_and_copies():
    """to_unsigned64: a Python int for a scalar, a fresh uint64 array for an array (the input,
    int64 or uint64, is never shared with the result)."""
    assert type(reference.to_unsigned64(-1)) is int
    assert type(reference.to_unsigned64(np.int64(-1))) is int
    for given in (np.array([-1, 5], dtype=np.int64), np.array([2**64 - 1, 5], dtype=np.uint64)):
        kept = given.copy()
        unsigned = reference.to_unsigned64(given)
        np.testing.assert_array_equal(unsigned, np.array([2**64 - 1, 5], np.uint64), strict=True)
        unsigned[:] = 0
        np.testing.assert_array_equal(given, kept, strict=True)


WIDE = [0, 1, 2, 3, 7, 2**31 + 5, 2**63, 2**64 - 1, -1, -5, reference.CANARY_CHAIN_ANCHOR]


def test_mix3_array_path_equals_the_scalar_path():
    """Element by element, the array path (arrays alone, or with scalars broadcast) gives what
    the scalar path gives, over values that use every bit, negatives included."""
    triples = [(a, b, c) for a in WIDE for b in WIDE[::2] for c in WIDE[1::2]]
    a, b, c = (np.array([reference.to_unsigned64(v) for v in column], np.uint64)
               for column in zip(*triples))  # fmt: skip
    expected = np.array([reference.splitmix64_mix3(*t) for t in triples], np.uint64)
    np.testing.assert_array_equal(reference.splitmix64_mix3(a, b, c), expected, strict=True)
    for scalar in WIDE:  # a scalar first argument broadcasts against array ones
        want = np.array([reference.splitmix64_mix3(scalar, x, x) for x in WIDE], np.uint64)
        column = np.array([reference.to_unsigned64(x) for x in WIDE], np.uint64)
        np.testing.assert_array_equal(
            reference.splitmix64_mix3(scalar, column, column), want, strict=True
        )


def test_constants_match_spec():
    """The CONTRACT §1 constants and enum values."""
    assert reference.CANARY_CHAIN_ANCHOR == 0xC0FFEE1234567890
    assert reference.TOKEN_TO_KV_SLOT_PADDING == 0
    assert reference.CANARY_FIELDS_PER_SLOT == 4
    assert reference.CANARY_SLOT_BYTES == 32
    assert reference.VIOLATION_FIELDS == 8
    assert reference.MAX_REAL_KV_SOURCES == 4
    assert {m.name: m.value for m in reference.RealKvHashMode} == {
        "NONE": 0,
        "PARTIAL": 1,
        "ALL": 2,
    }
    assert {m.name: m.value for m in reference.FailReason} == {
        "VERIFY_CHAIN_HASH_MISMATCH": 1,
        "VERIFY_POSITION_MISMATCH": 2,
        "VERIFY_REAL_KV_HASH_MISMATCH": 4,
        "WRITE_TOKEN_MISMATCH": 8,
        "WRITE_POSITION_MISMATCH": 16,
        "VERIFY_TOKEN_MISMATCH": 32,
    }
    tags = [
        "HEAD_K_FULL",
        "HEAD_V_FULL",
        "TAIL_K_FULL",
        "TAIL_V_FULL",
        "SWEEP_K_FULL",
        "SWEEP_V_FULL",
        "HEAD_K_SWA",
        "HEAD_V_SWA",
        "TAIL_K_SWA",
        "TAIL_V_SWA",
        "SWEEP_K_SWA",
        "SWEEP_V_SWA",
    ]
    assert [(m.name, m.value) for m in reference.CanaryLaunchTag] == [
        (name, value) for value, name in enumerate(tags)
    ]


def test_public_api_is_exported():
    """Every name of the shared contract is importable from the package and in __all__."""
    names = [
        "CANARY_CHAIN_ANCHOR",
        "RealKvHashMode",
        "FailReason",
        "CanaryLaunchTag",
        "TOKEN_TO_KV_SLOT_PADDING",
        "CANARY_FIELDS_PER_SLOT",
        "CANARY_SLOT_BYTES",
        "VIOLATION_FIELDS",
        "MAX_REAL_KV_SOURCES",
        "splitmix64",
        "splitmix64_mix3",
        "to_signed64",
        "to_unsigned64",
        "Source",
        "fingerprint",
        "SourceDescription",
        "validate_source",
        "write",
        "verify",
        "CanaryState",
        "VerifyPlan",
        "WritePlan",
    ]
    for name in names:
        assert hasattr(reference, name), name
        assert name in reference.__all__, name
