"""Self-tests of the invalid-source strategies: each case breaks the rules it claims, and only those."""

from __future__ import annotations

import collections
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import InvalidArgument

import reference
import strategies as st_kv
from tests.strategies.draws import collect

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# CONTRACT §3 messages up to their first value, as a second reading of the table.
_P = re.escape("kv-canary: RealKvSource")
MESSAGE = {
    1: (TypeError, _P + r"\.tensor must be a torch\.Tensor, got \w+$"),
    2: (TypeError, _P + r"\.(page_size|num_bytes_per_token|read_bytes) must be an int, got \w+$"),
    3: (ValueError, _P + r"\.page_size must be >= 1, got -?\d+$"),
    4: (ValueError, _P + r"\.num_bytes_per_token must be a positive multiple of 16, got -?\d+$"),
    5: (
        ValueError,
        _P + r"\.read_bytes must be a positive multiple of 16 in "
        r"\(0, num_bytes_per_token=-?\d+\], got -?\d+$",
    ),
    6: (ValueError, _P + r"\.tensor must be at least 2-D, got shape \((\d+,)?\)$"),
    7: (
        ValueError,
        _P + r"\.tensor row stride must be a multiple of 16 bytes, got \d+ bytes "
        r"\(shape=\(.*\), strides=\(.*\), dtype=torch\.\w+\)$",
    ),
    8: (
        ValueError,
        _P + r"\.tensor rows must be contiguous, got shape \(.*\) with strides \(.*\)$",
    ),
    9: (
        ValueError,
        _P + r"\.tensor row is \d+ bytes wide but page_size=\d+ x num_bytes_per_token=\d+ "
        r"needs \d+ \(shape=\(.*\), dtype=torch\.\w+\)$",
    ),
    10: (
        ValueError,
        _P + r"\.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == \d+$",
    ),
}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def broken_rules(desc) -> set[int]:
    """Every CONTRACT §3 rule ``desc`` breaks, each judged on its own.

    A rule about a value that is not there (strides of a non-tensor, the row of a 1-D
    tensor, a bound against a field that is not an integer) is not counted as broken.
    """
    broken = set()
    if not desc.is_tensor:
        broken.add(1)
    ints = {f: int(getattr(desc, f)) if _is_int(getattr(desc, f)) else None for f in st_kv.FIELDS}
    if None in ints.values():
        broken.add(2)
    page, nbpt, read = (ints[f] for f in st_kv.FIELDS)
    if page is not None and page < 1:
        broken.add(3)
    if nbpt is not None and (nbpt <= 0 or nbpt % 16):
        broken.add(4)
    if read is not None and (read <= 0 or read % 16 or (nbpt is not None and read > nbpt)):
        broken.add(5)
    if desc.is_tensor:
        shape, strides, size = desc.shape, desc.strides, desc.element_size
        if len(shape) < 2:
            broken.add(6)
        else:
            if strides[0] * size % 16:
                broken.add(7)
            expected_stride = 1
            for n, stride in reversed(list(zip(shape[1:], strides[1:]))):
                if n != 1 and stride != expected_stride and 0 not in shape[1:]:
                    broken.add(8)
                expected_stride *= n
            row_bytes = math.prod(shape[1:]) * size
            if page is not None and nbpt is not None and row_bytes < page * nbpt:
                broken.add(9)
        if desc.data_ptr_mod16 % 16:
            broken.add(10)
    return broken


def check_case(case):
    """The case's claims hold for a freshly built object, judged independently and by the reference."""
    kwargs = case.build("cpu")
    desc = st_kv.describe(
        kwargs["tensor"], kwargs["page_size"], kwargs["num_bytes_per_token"], kwargs["read_bytes"]
    )
    assert broken_rules(desc) == set(case.broken_rules), case.recipe
    assert case.rule == min(case.broken_rules)
    assert reference.validate_source(desc) == case.expected
    exc_type, pattern = MESSAGE[case.rule]
    assert case.expected[0] is exc_type
    assert re.match(pattern, case.expected[1]), case.expected[1]
    assert case.recipe.startswith("RealKvSource(") and case.recipe.endswith(", ...)")
    return kwargs


@pytest.mark.parametrize("rule", range(1, 11))
def test_single_rule_cases_break_exactly_the_named_rule(rule):
    """``invalid_source_cases(rule=r)`` breaks rule ``r`` and no other rule."""

    @FAST
    @given(case=st_kv.invalid_source_cases(rule=rule))
    def run(case):
        assert case.rule == rule and case.broken_rules == {rule}
        check_case(case)

    run()


@settings(FAST, max_examples=60)
@given(case=st_kv.multi_invalid_source_cases())
def test_multi_rule_cases_break_several_and_the_first_wins(case):
    """Multi cases break two or more rules, and the expected error is the lowest-numbered one."""
    assert len(case.broken_rules) >= 2
    check_case(case)


@FAST
@given(case=st_kv.invalid_source_cases())
def test_build_gives_fresh_objects(case):
    """Two builds of a case give equal descriptions but never the same tensor memory."""
    first, second = case.build("cpu"), case.build("cpu")
    args = ("page_size", "num_bytes_per_token", "read_bytes")
    describe = st_kv.describe
    assert describe(first["tensor"], *(first[a] for a in args)) == describe(
        second["tensor"], *(second[a] for a in args)
    )
    if isinstance(first["tensor"], torch.Tensor):
        assert first["tensor"].data_ptr() != second["tensor"].data_ptr()


def reaches(strategy, condition, n=300) -> bool:
    """Whether one of ``n`` derandomized draws satisfies ``condition`` (stops at the first)."""

    class Found(Exception):
        pass

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(strategy)
    def run(value):
        if condition(value):
            raise Found

    try:
        run()
    except Found:
        return True
    return False


def test_every_rule_is_reached():
    """Fixed-seed draws of ``invalid_source_cases()`` reach every rule 1..10."""
    rules = collections.Counter(collect(st_kv.invalid_source_cases(), 400, lambda c: c.rule))
    assert set(rules) == set(range(1, 11)), rules


def test_multi_cases_vary_the_winning_rule():
    """Fixed-seed multi draws let every rule that can come first win, alone or with two others."""
    cases = collect(st_kv.multi_invalid_source_cases(), 400)
    assert {c.rule for c in cases} == set(range(1, 10))
    assert any(len(c.broken_rules) >= 3 for c in cases)


def _built(case):
    return case.build("cpu")["tensor"]


def _value(field):
    return lambda case: getattr(case, field)


@pytest.mark.parametrize(
    "rule, what, condition",
    [
        (1, "a numpy array", lambda c: isinstance(_built(c), np.ndarray)),
        (1, "a list", lambda c: isinstance(_built(c), list)),
        (1, "None", lambda c: _built(c) is None),
        (1, "a (k, v) tuple", lambda c: isinstance(_built(c), tuple)),
        (3, "page_size 0", lambda c: c.page_size == 0),
        (3, "negative page_size", lambda c: c.page_size < 0),
        (4, "num_bytes_per_token 24", lambda c: c.num_bytes_per_token == 24),
        (5, "read_bytes 0", lambda c: c.read_bytes == 0),
        (5, "read_bytes 8", lambda c: c.read_bytes == 8),
        (5, "read_bytes over num_bytes_per_token", lambda c: c.read_bytes > c.num_bytes_per_token),
        (5, "negative read_bytes", lambda c: c.read_bytes < 0),
        (6, "a 0-D tensor", lambda c: _built(c).ndim == 0),
        (6, "a 1-D tensor", lambda c: _built(c).ndim == 1),
        (
            # The family of uint8 [rows, 24]: contiguous rows that end 8 bytes off the grid.
            7,
            "a contiguous [rows, W] pool 8 bytes off the grid",
            lambda c: (
                _built(c).is_contiguous()
                and _built(c).ndim == 2
                and _built(c).shape[1] * _built(c).element_size() % 16 == 8
            ),
        ),
        (7, "a row gap off the 16-byte grid", lambda c: not _built(c).is_contiguous()),
        (8, "a transposed view", lambda c: ("transpose", 1, 2) in c.obj.ops),
        (8, "a strided column slice", lambda c: ("slice", 1, None, None, 2) in c.obj.ops),
        (8, "a head_dim slice", lambda c: any(op[:2] == ("slice", 2) for op in c.obj.ops)),
        (9, "a narrow 2-D row", lambda c: _built(c).ndim == 2),
        (10, "data_ptr % 16 == 1", lambda c: _built(c).data_ptr() % 16 == 1),
        (10, "data_ptr % 16 == 8", lambda c: _built(c).data_ptr() % 16 == 8),
        (10, "an fp16 view 2 bytes in", lambda c: _built(c).data_ptr() % 16 == 2),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_single_rule_cases_reach_realistic_objects(rule, what, condition):
    """Each rule's cases include the realistic mistakes the brief of CONTRACT §3 lists."""
    assert reaches(st_kv.invalid_source_cases(rule=rule), condition), what


@pytest.mark.parametrize("field", st_kv.FIELDS)
@pytest.mark.parametrize("type_name", ["float", "bool", "NoneType", "str", "float64"])
def test_rule_2_retypes_every_field_every_way(field, type_name):
    """Rule 2 cases give each field a float, a bool, None and a str (and numpy bool/float)."""

    def condition(case):
        value = getattr(case, field)
        return not _is_int(value) and type(value).__name__ == type_name

    assert reaches(st_kv.invalid_source_cases(rule=2), condition)


def test_rule_2_checks_fields_in_order():
    """Some rule 2 cases break several fields, and the message names the first in the contract's order."""

    def condition(case):
        bad = [f for f in st_kv.FIELDS if not _is_int(getattr(case, f))]
        return len(bad) >= 2 and f"RealKvSource.{bad[0]} must" in case.expected[1]

    assert reaches(st_kv.invalid_source_cases(rule=2), condition)


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint32, int])
def test_numpy_integers_appear_as_valid_values(kind):
    """Valid integer fields are sometimes numpy integers, which rule 2 accepts."""
    assert reaches(
        st_kv.invalid_source_cases(rule=9),
        lambda c: all(type(getattr(c, f)) is kind for f in st_kv.FIELDS),
    )


@pytest.mark.parametrize("value", [0, 8, -16])
def test_small_bytes_per_token_break_rules_4_and_5(value):
    """``num_bytes_per_token`` 0, 8 or negative is a multi case where rule 4 beats rule 5."""
    assert reaches(
        st_kv.multi_invalid_source_cases(rule=4),
        lambda c: c.num_bytes_per_token == value and {4, 5} <= c.broken_rules,
    )


def test_invalid_rule_argument_is_refused():
    """``invalid_source_cases(rule=...)`` accepts only None or 1..10."""
    for bad in (0, 11, "3", True):
        with pytest.raises(InvalidArgument):
            st_kv.invalid_source_cases(rule=bad)
    for bad in (0, 10, 11):
        with pytest.raises(InvalidArgument):
            st_kv.multi_invalid_source_cases(rule=bad)
