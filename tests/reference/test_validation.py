"""The oracle's validate_source returns the exact CONTRACT §3 error of the first broken rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from reference import SourceDescription, validate_source

P = "kv-canary: RealKvSource"

# A float16 [4, 64] tensor, two 64-byte slots per 128-byte row: every rule holds.
VALID = SourceDescription(
    is_tensor=True,
    type_name="Tensor",
    shape=(4, 64),
    strides=(64, 1),
    element_size=2,
    dtype_str="torch.float16",
    data_ptr_mod16=0,
    page_size=2,
    num_bytes_per_token=64,
    read_bytes=32,
)


def described(**changes) -> SourceDescription:
    return dataclasses.replace(VALID, **changes)


def call_id(changes: dict) -> str:
    """Ids read as the call that breaks the rule, e.g. ``RealKvSource(page_size=0)``."""
    return "RealKvSource(" + ", ".join(f"{k}={v!r}" for k, v in changes.items()) + ")"


ONE_BROKEN_RULE = [
    # Rule 1: a tensor.
    (
        dict(is_tensor=False, type_name="ndarray"),
        TypeError,
        f"{P}.tensor must be a torch.Tensor, got ndarray",
    ),
    (
        dict(is_tensor=False, type_name="list"),
        TypeError,
        f"{P}.tensor must be a torch.Tensor, got list",
    ),
    # Rule 2: integer sizes, bool excluded.
    (dict(page_size=True), TypeError, f"{P}.page_size must be an int, got bool"),
    (dict(page_size=np.bool_(True)), TypeError, f"{P}.page_size must be an int, got bool"),
    (dict(page_size=2.0), TypeError, f"{P}.page_size must be an int, got float"),
    (
        dict(num_bytes_per_token=None),
        TypeError,
        f"{P}.num_bytes_per_token must be an int, got NoneType",
    ),
    (
        dict(num_bytes_per_token=np.float64(64)),
        TypeError,
        f"{P}.num_bytes_per_token must be an int, got float64",
    ),
    (dict(read_bytes="32"), TypeError, f"{P}.read_bytes must be an int, got str"),
    # Rule 3.
    (dict(page_size=0), ValueError, f"{P}.page_size must be >= 1, got 0"),
    (dict(page_size=np.int64(-3)), ValueError, f"{P}.page_size must be >= 1, got -3"),
    # Rule 4.
    (
        dict(num_bytes_per_token=24),
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 24",
    ),
    (
        dict(num_bytes_per_token=0),
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 0",
    ),
    (
        dict(num_bytes_per_token=-16),
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got -16",
    ),
    # Rule 5.
    (
        dict(read_bytes=8),
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=64], got 8",
    ),
    (
        dict(read_bytes=0),
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=64], got 0",
    ),
    (
        dict(read_bytes=80),
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=64], got 80",
    ),
    # Rule 6.
    (
        dict(shape=(4,), strides=(1,)),
        ValueError,
        f"{P}.tensor must be at least 2-D, got shape (4,)",
    ),
    (dict(shape=(), strides=()), ValueError, f"{P}.tensor must be at least 2-D, got shape ()"),
    # Rule 7.
    (
        dict(strides=(68, 1)),
        ValueError,
        f"{P}.tensor row stride must be a multiple of 16 bytes, got 136 bytes "
        "(shape=(4, 64), strides=(68, 1), dtype=torch.float16)",
    ),
    # Rule 8.
    (
        dict(strides=(128, 2)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (4, 64) with strides (128, 2)",
    ),
    (
        dict(shape=(4, 2, 32), strides=(64, 1, 2)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (4, 2, 32) with strides (64, 1, 2)",
    ),
    # Rule 9.
    (
        dict(shape=(4, 32), strides=(64, 1)),
        ValueError,
        f"{P}.tensor row is 64 bytes wide but page_size=2 x num_bytes_per_token=64 needs 128 "
        "(shape=(4, 32), dtype=torch.float16)",
    ),
    (
        dict(
            shape=(4, 2, 16),
            strides=(32, 16, 1),
            element_size=4,
            dtype_str="torch.float32",
            page_size=3,
        ),
        ValueError,
        # the whole row counts (2 x 16 x 4 bytes), not dim 1 alone (2 x 4 bytes)
        f"{P}.tensor row is 128 bytes wide but page_size=3 x num_bytes_per_token=64 needs 192 "
        "(shape=(4, 2, 16), dtype=torch.float32)",
    ),
    # Rule 10.
    (
        dict(data_ptr_mod16=8),
        ValueError,
        f"{P}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == 8",
    ),
    (  # the largest misalignment (a check modulo 15 would pass it)
        dict(data_ptr_mod16=15),
        ValueError,
        f"{P}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == 15",
    ),
    # Rule 8 at its edges (each left alive by a cosmic-ray mutant: strength/mutation/survivors/).
    (
        dict(shape=(0, 4, 16), strides=(64, 1, 4)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (0, 4, 16) with strides (64, 1, 4)",
    ),
    (
        dict(shape=(2, 1, 4, 16), strides=(64, 64, 1, 4)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 1, 4, 16) with strides (64, 64, 1, 4)",
    ),
    (
        dict(shape=(2, 4, 16), strides=(64, 0, 1)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 4, 16) with strides (64, 0, 1)",
    ),
    (  # an empty row is dense whatever its strides: rule 9 refuses it
        dict(shape=(2, 0), strides=(8, 3)),
        ValueError,
        f"{P}.tensor row is 0 bytes wide but page_size=2 x num_bytes_per_token=64 needs 128 "
        "(shape=(2, 0), dtype=torch.float16)",
    ),
]


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    ONE_BROKEN_RULE,
    ids=[call_id(c) for c, _, _ in ONE_BROKEN_RULE],
)
def test_each_rule_gives_its_exact_error(changes, error, message):
    """A description breaking one rule gives that rule's exception type and exact message."""
    assert validate_source(described(**changes)) == (error, message)


# Each pair breaks two rules; the earlier one must be reported.
TWO_BROKEN_RULES = [
    (
        dict(is_tensor=False, type_name="ndarray", page_size=True),
        TypeError,
        f"{P}.tensor must be a torch.Tensor, got ndarray",
    ),
    (dict(page_size=1.5, read_bytes=None), TypeError, f"{P}.page_size must be an int, got float"),
    (
        dict(num_bytes_per_token=None, read_bytes=None),
        TypeError,
        f"{P}.num_bytes_per_token must be an int, got NoneType",
    ),
    (dict(read_bytes=None, page_size=0), TypeError, f"{P}.read_bytes must be an int, got NoneType"),
    (dict(page_size=0, num_bytes_per_token=24), ValueError, f"{P}.page_size must be >= 1, got 0"),
    (
        dict(num_bytes_per_token=24, read_bytes=8),
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 24",
    ),
    (
        dict(read_bytes=8, shape=(4,), strides=(1,)),
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=64], got 8",
    ),
    (
        dict(shape=(4,), strides=(3,)),
        ValueError,
        f"{P}.tensor must be at least 2-D, got shape (4,)",
    ),
    (
        dict(strides=(68, 2)),
        ValueError,
        f"{P}.tensor row stride must be a multiple of 16 bytes, got 136 bytes "
        "(shape=(4, 64), strides=(68, 2), dtype=torch.float16)",
    ),
    (
        dict(shape=(4, 32), strides=(64, 2)),
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (4, 32) with strides (64, 2)",
    ),
    (
        dict(shape=(4, 32), strides=(32, 1), data_ptr_mod16=4),
        ValueError,
        f"{P}.tensor row is 64 bytes wide but page_size=2 x num_bytes_per_token=64 needs 128 "
        "(shape=(4, 32), dtype=torch.float16)",
    ),
]


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    TWO_BROKEN_RULES,
    ids=[call_id(c) for c, _, _ in TWO_BROKEN_RULES],
)
def test_first_broken_rule_wins(changes, error, message):
    """With two rules broken, the one earlier in CONTRACT §3 is reported."""
    assert validate_source(described(**changes)) == (error, message)


VALID_VARIANTS = [
    {},
    dict(page_size=np.int64(2), num_bytes_per_token=np.int32(64), read_bytes=np.uint16(64)),
    # Row gap: the row stride (256 bytes) is larger than the row (128 bytes).
    dict(strides=(128, 1)),
    # Holes: the row (192 bytes) is longer than the slot layout (128 bytes).
    dict(shape=(4, 96), strides=(96, 1)),
    # N-D rows, row-major.
    dict(shape=(4, 2, 4, 8), strides=(64, 32, 8, 1)),
    # A size-1 dim may carry any stride.
    dict(shape=(4, 1, 64), strides=(64, 999, 1)),
    dict(shape=(4, 64, 1), strides=(64, 1, 7)),
    # Strides past 256 elements (ints that are not cached objects: compared by value).
    dict(shape=(2, 2, 512), strides=(1024, 512, 1)),
    # Another dtype seeing the same bytes.
    dict(shape=(4, 128), strides=(128, 1), element_size=1, dtype_str="torch.uint8"),
    dict(data_ptr_mod16=0, page_size=1, num_bytes_per_token=128, read_bytes=128),
]


@pytest.mark.parametrize("changes", VALID_VARIANTS, ids=[call_id(c) for c in VALID_VARIANTS])
def test_valid_descriptions_pass(changes):
    """A description that keeps every rule validates to None."""
    assert validate_source(described(**changes)) is None


def test_zero_size_row_counts_as_dense():
    """A row with a zero-size dim is dense whatever its strides, so rule 9 is the one to fail."""
    result = validate_source(described(shape=(4, 0, 64), strides=(64, 5, 3)))
    assert result == (
        ValueError,
        f"{P}.tensor row is 0 bytes wide but page_size=2 x num_bytes_per_token=64 needs 128 "
        "(shape=(4, 0, 64), dtype=torch.float16)",
    )
