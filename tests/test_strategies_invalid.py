"""Self-tests of the invalid-source strategies: each case breaks the rules it claims, and only those."""

from __future__ import annotations

import collections
import math
import re

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import InvalidArgument

import reference
import strategies as st_kv

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# SPEC §3 messages up to their first value, as a second reading of the table.
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
    8: (ValueError, _P + r"\.tensor rows must be contiguous, got shape \(.*\) with strides \(.*\)$"),
    9: (
        ValueError,
        _P + r" row is too narrow for its slot layout: dim-1 is \d+ bytes but "
        r"page_size=\d+ x num_bytes_per_token=\d+ needs \d+$",
    ),
    10: (ValueError, _P + r"\.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == \d+$"),
}


def collect(strategy, n, key=lambda x: x):
    """``key`` of ``n`` derandomized draws: distribution checks that do not depend on luck."""
    seen = []

    @settings(
        max_examples=n,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(value):
        seen.append(key(value))

    run()
    return seen


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def broken_rules(desc) -> set[int]:
    """Every SPEC §3 rule ``desc`` breaks, each judged on its own.

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
    desc = st_kv.describe(kwargs["tensor"], kwargs["page_size"], kwargs["num_bytes_per_token"], kwargs["read_bytes"])
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


def test_every_rule_is_reached():
    """Fixed-seed draws of ``invalid_source_cases()`` reach every rule 1..10."""
    rules = collections.Counter(collect(st_kv.invalid_source_cases(), 200, lambda c: c.rule))
    assert set(rules) == set(range(1, 11)), rules


def _case_facts(case):
    kwargs = case.build("cpu")
    tensor = kwargs["tensor"]
    return {
        "rule": case.rule,
        "broken": case.broken_rules,
        "type": type(tensor).__name__,
        "ndim": tensor.ndim if isinstance(tensor, torch.Tensor) else None,
        "contiguous": isinstance(tensor, torch.Tensor) and tensor.is_contiguous(),
        "dtype": str(tensor.dtype) if isinstance(tensor, torch.Tensor) else None,
        "ops": tuple(op for op, *_ in case.obj.ops),
        "values": {f: kwargs[f] for f in st_kv.FIELDS},
        "ptr_mod16": tensor.data_ptr() % 16 if isinstance(tensor, torch.Tensor) else None,
    }


def _single(rule, n=60):
    return collect(st_kv.invalid_source_cases(rule=rule), n, _case_facts)


def test_rule_1_objects_are_realistic():
    """Rule 1 cases pass numpy arrays, lists, None and (k, v) tuples."""
    assert {f["type"] for f in _single(1)} == {"ndarray", "list", "NoneType", "tuple"}


def test_rule_2_retypes_every_field_every_way():
    """Rule 2 cases give each field a float, a bool, None and a str (numpy bool and float too)."""
    seen = set()
    for facts in _single(2, 200):
        for field, value in facts["values"].items():
            if not _is_int(value):
                seen.add((field, type(value).__name__))
    for field in st_kv.FIELDS:
        for name in ("float", "bool", "NoneType", "str", "float64"):
            assert (field, name) in seen, (field, name)


def test_numpy_integers_appear_as_valid_values():
    """Valid integer fields are sometimes numpy integers, which rule 2 accepts."""
    values = [v for facts in _single(3) + _single(7) for v in facts["values"].values()]
    assert any(isinstance(v, np.integer) for v in values)
    assert any(type(v) is int for v in values)


def test_rules_3_to_5_use_the_classic_values():
    """Rules 3-5 reach page_size 0 and negative, 24 bytes per token, read_bytes 0, 8 and too large."""
    pages = {int(f["values"]["page_size"]) for f in _single(3)}
    assert 0 in pages and any(p < 0 for p in pages)
    assert 24 in {int(f["values"]["num_bytes_per_token"]) for f in _single(4)}
    reads = [(int(f["values"]["read_bytes"]), int(f["values"]["num_bytes_per_token"])) for f in _single(5)]
    assert {0, 8} <= {r for r, _ in reads}
    assert any(r > n for r, n in reads)
    small = [
        int(f["values"]["num_bytes_per_token"])
        for f in collect(st_kv.multi_invalid_source_cases(), 300, _case_facts)
        if f["rule"] == 4 and f["broken"] == {4, 5}
    ]
    assert {0, 8} <= set(small) and any(n < 0 for n in small)


def test_tensor_rules_use_realistic_views():
    """Rules 6-10 reach 0-D and 1-D tensors, uint8 [rows, 24], transposed and sliced views, offsets."""
    assert {f["ndim"] for f in _single(6)} == {0, 1}
    rule7 = _single(7, 100)
    assert any(f["contiguous"] for f in rule7)
    assert any(f["dtype"] == "torch.uint8" and f["contiguous"] for f in rule7)
    ops = {f["ops"] for f in _single(8)}
    assert ("transpose",) in ops and ("slice",) in ops
    assert len({f["ptr_mod16"] for f in _single(10)}) > 3


def test_multi_cases_vary_the_winning_rule():
    """Fixed-seed multi draws have many different first rules and reach three-rule combinations."""
    cases = collect(st_kv.multi_invalid_source_cases(), 200)
    assert len({c.rule for c in cases}) >= 7
    assert any(len(c.broken_rules) >= 3 for c in cases)


def test_invalid_rule_argument_is_refused():
    """``invalid_source_cases(rule=...)`` accepts only None or 1..10."""
    for bad in (0, 11, "3", True):
        with pytest.raises(InvalidArgument):
            st_kv.invalid_source_cases(rule=bad)
