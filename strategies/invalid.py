"""Invalid RealKvSource arguments, each with the exact error CONTRACT §3 says it must raise.

A case is built from a valid configuration by applying "breaks", each aimed at one rule
(the ``nbpt_small`` break — ``num_bytes_per_token`` of 0, 8 or below — necessarily breaks
rule 5 as well, since no positive multiple of 16 fits under it). Breaks that would mask
each other (a non-tensor has no strides to get wrong; ``page_size=0`` cannot make a row
too narrow) are never combined, so ``broken_rules`` is exact by construction.

Importing this module does not import torch. Drawing a case does: its expected error is the
reference's verdict on the object itself, made on the CPU by :mod:`strategies.materialize`
(imported where a case is drawn or built, never at module level).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
from hypothesis.errors import InvalidArgument

import reference
from strategies.layouts import (
    ELEMENT_SIZES,
    _align16,
    _row_shapes,
    default_dtypes,
)
from strategies.sizes import check_int

__all__ = [
    "FIELDS",
    "InvalidSourceCase",
    "ObjectSpec",
    "invalid_source_cases",
    "multi_invalid_source_cases",
]

#: The integer arguments of RealKvSource, in the order rule 2 checks them.
FIELDS = ("page_size", "num_bytes_per_token", "read_bytes")

_RULES = tuple(range(1, 11))
# Dtypes numpy has too, for the ndarray / list stand-ins of rule 1.
_NUMPY_TWINS = frozenset({"uint8", "int8", "float16", "float32", "int32", "int64"})
_TENSOR_RULES = frozenset({6, 7, 8, 9, 10})


@dataclass(frozen=True)
class ObjectSpec:
    """Plain description of the object passed as ``tensor=``; ``materialize_object`` makes it.

    ``kind`` is ``"tensor"``, ``"tuple"`` (a ``(k_buffer, v_buffer)`` pair of such tensors),
    ``"ndarray"``, ``"list"`` or ``"none"``. A tensor is ``torch.as_strided`` over a
    16-aligned buffer with ``shape``/``strides`` in elements, starting ``offset_bytes`` in,
    followed by ``tail_bytes``; then ``ops`` are applied in order:
    ``("transpose", d0, d1)``, ``("select", dim, index)``,
    ``("slice", dim, start, stop, step)``.
    """

    kind: str
    dtype: str = "uint8"
    shape: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset_bytes: int = 0
    tail_bytes: int = 0
    ops: tuple[tuple, ...] = ()
    seed: int = 0

    @property
    def element_size(self) -> int:
        return ELEMENT_SIZES[self.dtype]

    @property
    def backing_bytes(self) -> int:
        if any(n == 0 for n in self.shape):
            extent = 0
        else:
            extent = sum((n - 1) * s for n, s in zip(self.shape, self.strides, strict=True)) + 1
            extent *= self.element_size
        return self.offset_bytes + extent + self.tail_bytes

    def label(self) -> str:
        """A short, call-like name, e.g. ``float16[2, 4, 8].transpose(1, 2)``."""
        if self.kind == "none":
            return "None"
        shape = ", ".join(map(str, self.shape))
        if self.kind == "ndarray":
            return f"np.ones(({shape}), {self.dtype})"
        if self.kind == "list":
            return f"np.ones(({shape})).tolist()"
        text = f"{self.dtype}[{shape}]"
        contiguous_row = math.prod(self.shape[1:])
        if len(self.shape) >= 2 and self.strides[0] != contiguous_row:
            text += f" (row stride {self.strides[0] * self.element_size} B)"
        for op, *args in self.ops:
            if op == "transpose":
                text += f".transpose({args[0]}, {args[1]})"
            elif op == "select":
                text += f"[{'' if args[0] == 0 else ':, ' * args[0]}{args[1]}]"
            else:
                dim, start, stop, step = args
                part = f"{'' if start is None else start}:{'' if stop is None else stop}"
                if step not in (None, 1):
                    part += f":{step}"
                text += f"[{':, ' * dim}{part}]"
        if self.offset_bytes % 16:
            text += f" at byte offset {self.offset_bytes % 16}"
        if self.kind == "tuple":
            text = f"(k_buffer, v_buffer) of {text}"
        return text


@dataclass(frozen=True)
class InvalidSourceCase:
    """``RealKvSource(tensor=..., page_size=..., ...)`` arguments that break CONTRACT §3.

    ``rule`` is the first broken rule (the one that must raise), ``broken_rules`` every
    rule broken, ``recipe`` a call-like id naming the arguments that break them, and
    ``expected`` the exception type and exact message, from the reference validator.
    ``obj`` describes the ``tensor=`` argument; the three integer arguments are kept as
    the raw values passed (a float, None, a numpy integer, ...).
    """

    rule: int
    broken_rules: frozenset[int]
    recipe: str
    expected: tuple[type, str]
    obj: ObjectSpec
    page_size: object
    num_bytes_per_token: object
    read_bytes: object

    def build(self, device) -> dict:
        """Fresh keyword arguments for RealKvSource, the tensor made on ``device``."""
        from strategies.materialize import materialize_object

        return {
            "tensor": materialize_object(self.obj, device),
            "page_size": self.page_size,
            "num_bytes_per_token": self.num_bytes_per_token,
            "read_bytes": self.read_bytes,
        }


# Breaks, by name. Each maps to the rules it breaks.
_BREAK_RULES = {
    "not_tensor": frozenset({1}),
    "not_int": frozenset({2}),
    "page_size": frozenset({3}),
    "nbpt": frozenset({4}),
    "nbpt_small": frozenset({4, 5}),
    "read_bytes": frozenset({5}),
    "ndim": frozenset({6}),
    "row_stride": frozenset({7}),
    "not_dense": frozenset({8}),
    "too_narrow": frozenset({9}),
    "misaligned": frozenset({10}),
}
_SINGLE_BREAK = {
    1: "not_tensor",
    2: "not_int",
    3: "page_size",
    4: "nbpt",
    5: "read_bytes",
    6: "ndim",
    7: "row_stride",
    8: "not_dense",
    9: "too_narrow",
    10: "misaligned",
}
_TENSOR_BREAKS = {"ndim", "row_stride", "not_dense", "too_narrow", "misaligned"}
_CONFLICTS = {
    frozenset(pair)
    for pair in [
        *(("not_tensor", b) for b in _TENSOR_BREAKS),
        ("ndim", "row_stride"),
        ("ndim", "not_dense"),
        ("ndim", "too_narrow"),
        ("page_size", "too_narrow"),
        ("nbpt", "nbpt_small"),
        ("read_bytes", "nbpt_small"),
        ("too_narrow", "nbpt_small"),
    ]
}


def _not_int_fields(breaks: frozenset[str]) -> tuple[str, ...]:
    """Fields a ``not_int`` break may retype without hiding the other breaks."""
    excluded = set()
    if "page_size" in breaks:
        excluded.add("page_size")
    if "nbpt" in breaks:
        excluded.add("num_bytes_per_token")
    if "nbpt_small" in breaks or "read_bytes" in breaks:
        excluded |= {"num_bytes_per_token", "read_bytes"}
    if "too_narrow" in breaks:
        excluded |= {"page_size", "num_bytes_per_token"}
    return tuple(f for f in FIELDS if f not in excluded)


def _compatible(breaks: frozenset[str]) -> bool:
    if any(frozenset(pair) in _CONFLICTS for pair in itertools.combinations(breaks, 2)):
        return False
    return "not_int" not in breaks or bool(_not_int_fields(breaks))


def _multi_break_sets() -> dict[int, tuple[frozenset[str], ...]]:
    names = sorted(_BREAK_RULES)
    sets = []
    for size in (1, 2, 3):
        for combo in itertools.combinations(names, size):
            breaks = frozenset(combo)
            rules = frozenset().union(*(_BREAK_RULES[b] for b in breaks))
            if len(rules) >= 2 and _compatible(breaks):
                sets.append(breaks)
    by_rule: dict[int, list[frozenset[str]]] = {}
    # Smallest first so that shrinking heads for the simplest combination.
    for breaks in sorted(sets, key=lambda s: (len(s), sorted(s))):
        first = min(frozenset().union(*(_BREAK_RULES[b] for b in breaks)))
        by_rule.setdefault(first, []).append(breaks)
    return {rule: tuple(group) for rule, group in by_rule.items()}


_MULTI_BREAK_SETS = _multi_break_sets()


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


@st.composite
def _as_int(draw, value: int):
    """``value`` as a Python int or a numpy integer: both are valid integers for rule 2."""
    kinds = [int, np.int64, np.int32]
    if value >= 0:
        kinds.append(np.uint32)
    return draw(st.sampled_from(kinds))(value)


_NOT_INT_KINDS = ("float", "bool", "None", "str", "np.float64", "np.bool_")


def _not_int(kind: str, value: int) -> object:
    return {
        "float": float(value),
        "bool": True,
        "None": None,
        "str": str(value),
        "np.float64": np.float64(value),
        "np.bool_": np.bool_(True),
    }[kind]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    step = 1
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


@st.composite
def _invalid_case(draw, break_sets_by_rule, max_ndim):
    # The winning rule first, then a combination with it: every rule wins equally often.
    winning_rule = draw(st.sampled_from(sorted(break_sets_by_rule)))
    breaks = draw(st.sampled_from(break_sets_by_rule[winning_rule]))
    dtype = draw(st.sampled_from(default_dtypes()))
    element_size = ELEMENT_SIZES[dtype]
    rows = draw(st.integers(1, 4))
    page0, nbpt0, read0 = _draw_slot_layout(draw, breaks)
    values, touched = _draw_field_values(draw, breaks, page0, nbpt0, read0)
    row_elems, need = _draw_row_elems(draw, breaks, values, page0 * nbpt0, element_size)
    if "too_narrow" in breaks:
        touched |= {"tensor", "page_size", "num_bytes_per_token"}

    offset_bytes = 16 * draw(st.integers(0, 3))
    if "misaligned" in breaks:
        offset_bytes += element_size * draw(st.integers(1, 15 // element_size))
    tail_bytes = draw(st.integers(0, 32))
    seed = draw(st.integers(0, 2**32 - 1))
    common = {"dtype": dtype, "offset_bytes": offset_bytes, "tail_bytes": tail_bytes, "seed": seed}
    aligned_row_stride = _align16(row_elems * element_size) // element_size

    if "not_tensor" in breaks:
        kind = draw(st.sampled_from(("ndarray", "list", "none", "tuple")))
        if kind in ("ndarray", "list") and dtype not in _NUMPY_TWINS:
            common["dtype"] = "uint8"
        obj = ObjectSpec(
            kind=kind,
            shape=(rows, row_elems),
            strides=(aligned_row_stride, 1),
            **common,
        )
    elif "ndim" in breaks:
        obj = _draw_wrong_ndim(draw, rows, row_elems, aligned_row_stride, common)
    else:
        obj = _draw_row_view(draw, breaks, (rows, row_elems, need), element_size, max_ndim, common)
    if breaks & _TENSOR_BREAKS or "not_tensor" in breaks:
        touched.add("tensor")
    return _case_of(obj, breaks, values, touched)


def _draw_slot_layout(draw, breaks: frozenset[str]) -> tuple[int, int, int]:
    """The valid ``page_size``, ``num_bytes_per_token`` and ``read_bytes`` that ``breaks``
    then break (roomy enough for a narrower row where the row must be too narrow)."""
    if "too_narrow" in breaks:
        # A slot layout of >= 96 bytes leaves room for a narrower row that still splits
        # into the >= 4 even elements the non-dense views below need.
        page0 = draw(st.integers(3, 4))
        nbpt0 = 16 * draw(st.integers(2, 4))
    else:
        page0 = draw(st.integers(1, 4))
        nbpt0 = 16 * draw(st.integers(1, 4))
    read0 = 16 * draw(st.integers(1, nbpt0 // 16))
    return page0, nbpt0, read0


def _draw_field_values(
    draw, breaks: frozenset[str], page0: int, nbpt0: int, read0: int
) -> tuple[dict, set[str]]:
    """The three int fields by name, broken as ``breaks`` says and each drawn as some kind of
    int (or not one, for ``not_int``), and the names of the fields broken."""
    page_size, nbpt, read_bytes = page0, nbpt0, read0
    touched: set[str] = set()
    if "page_size" in breaks:
        page_size = draw(st.sampled_from((0, -1, -page0, -16)))
        touched.add("page_size")
    if "nbpt" in breaks:
        # Above the old value, so read_bytes still fits under it and rule 5 holds.
        nbpt = nbpt0 + draw(st.one_of(st.just(8), st.integers(1, 15)))
        touched.add("num_bytes_per_token")
    if "nbpt_small" in breaks:
        nbpt = draw(st.sampled_from((0, 8, -16, -nbpt0, 4)))
        touched |= {"num_bytes_per_token", "read_bytes"}
    if "read_bytes" in breaks:
        read_bytes = draw(st.sampled_from((0, 8, nbpt + 16, -16, read0 + 8)))
        touched |= {"num_bytes_per_token", "read_bytes"}
    values: dict = {"page_size": page_size, "num_bytes_per_token": nbpt, "read_bytes": read_bytes}
    for field in FIELDS:
        values[field] = draw(_as_int(values[field]))
    if "not_int" in breaks:
        fields = draw(st.sets(st.sampled_from(_not_int_fields(breaks)), min_size=1))
        for field in sorted(fields, key=FIELDS.index):
            kind = draw(st.sampled_from(_NOT_INT_KINDS))
            values[field] = _not_int(kind, int(values[field]))
            touched.add(field)
    return values, touched


def _draw_row_elems(
    draw, breaks: frozenset[str], values: dict, basis_bytes: int, element_size: int
) -> tuple[int, int]:
    """A row's width in elements of the final view, and the bytes a row needs (``basis_bytes``:
    those of the valid layout): narrower than that for ``too_narrow``, else wide enough."""
    if "too_narrow" in breaks:
        need = int(values["page_size"]) * int(values["num_bytes_per_token"])
        row_elems = (need - 1) // element_size - draw(st.integers(0, 2))
        row_elems -= row_elems % 2
    else:
        need = basis_bytes
        if _is_int(values["page_size"]) and _is_int(values["num_bytes_per_token"]):
            need = max(need, int(values["page_size"]) * int(values["num_bytes_per_token"]))
        # A few spare bytes past the slots: 8 gives the classic uint8 [rows, 24] of rule 7.
        spare_bytes = draw(st.sampled_from((0, 8, 2, 4, 16, 24)))
        row_elems = -(-(need + spare_bytes) // element_size)
        row_elems = max(row_elems + row_elems % 2, 4)
    return row_elems, need


def _draw_wrong_ndim(draw, rows: int, row_elems: int, aligned_row_stride: int, common: dict):
    """A tensor of the wrong rank: the rows flattened to 1-D, one row, or one element."""
    variant = draw(st.sampled_from(("flat", "row", "scalar")))
    if variant == "flat":
        return ObjectSpec(kind="tensor", shape=(rows * row_elems,), strides=(1,), **common)
    ops: tuple[tuple, ...] = (("select", 0, draw(st.integers(0, rows - 1))),)
    if variant == "scalar":
        # Element 0 of a row keeps the row's 16-byte alignment.
        ops += (("select", 0, 0),)
    return ObjectSpec(
        kind="tensor",
        shape=(rows, row_elems),
        strides=(aligned_row_stride, 1),
        ops=ops,
        **common,
    )


def _draw_row_view(
    draw,
    breaks: frozenset[str],
    size: tuple[int, int, int],
    element_size: int,
    max_ndim: int | None,
    common: dict,
) -> ObjectSpec:
    """A tensor of rows: not dense, with a row stride off the 16-byte grid, or of valid N-D
    rows, as ``breaks`` says; ``size`` is ``(rows, row_elems, need)`` (a row's width in
    elements, the bytes a row needs)."""
    rows, row_elems, need = size
    classic = False
    base_inner: tuple[int, ...]
    if "not_dense" in breaks:
        base_inner, ops = _draw_not_dense(draw, row_elems)
    elif classic := ("row_stride" in breaks and draw(st.booleans())):
        # The classic: a contiguous pool whose rows end 8 bytes off the 16-byte grid,
        # like uint8 [rows, 24] for one 16-byte slot per row.
        off_grid = need - 8 if "too_narrow" in breaks else need + 8
        base_inner, ops = (off_grid // element_size,), ()
    else:
        base_inner, ops = draw(_row_shapes(row_elems, True, max_ndim)), ()
    base_row_bytes = math.prod(base_inner) * element_size
    gap_bytes = 0 if classic else 16 * draw(st.integers(0, 2))
    if "row_stride" in breaks:
        # Element sizes are below 16, so one extra element always breaks the multiple.
        row_stride_bytes = base_row_bytes + (element_size if base_row_bytes % 16 == 0 else 0)
    else:
        row_stride_bytes = _align16(base_row_bytes)
    row_stride_bytes += gap_bytes
    return ObjectSpec(
        kind="tensor",
        shape=(rows, *base_inner),
        strides=(row_stride_bytes // element_size, *_contiguous_strides(base_inner)),
        ops=ops,
        **common,
    )


def _draw_not_dense(draw, row_elems: int) -> tuple[tuple[int, ...], tuple[tuple, ...]]:
    """The inner shape of a base tensor and the view ops that make its rows of
    ``row_elems`` elements not dense: a transpose, a step, or a narrowed head_dim."""
    variant = draw(st.sampled_from(("transpose", "step", "narrow")))
    if variant == "transpose":
        # Heads and head_dim swapped: (rows, a, b) viewed as (rows, b, a).
        divisors = [d for d in range(2, row_elems // 2 + 1) if row_elems % d == 0]
        a = draw(st.sampled_from(divisors))
        return (a, row_elems // a), (("transpose", 1, 2),)
    if variant == "step":
        return (2 * row_elems,), (("slice", 1, None, None, 2),)
    # Only the first half of head_dim of each of 2 heads.
    half = row_elems // 2
    head_dim = half + draw(st.integers(1, 8))
    return (2, head_dim), (("slice", 2, None, half, 1),)


def _case_of(
    obj: ObjectSpec, breaks: frozenset[str], values: dict, touched: set[str]
) -> InvalidSourceCase:
    """The case of ``obj`` with the field ``values``, its error the reference's verdict."""
    rules = frozenset().union(*(_BREAK_RULES[b] for b in breaks))
    # The expected error is the reference's verdict on the object itself, made on the CPU.
    from strategies.materialize import describe, materialize_object

    built = materialize_object(obj, "cpu")
    expected = reference.validate_source(
        describe(built, values["page_size"], values["num_bytes_per_token"], values["read_bytes"])
    )
    if expected is None:
        raise RuntimeError(f"strategy bug: breaks {sorted(breaks)} produced a valid source {obj}")
    shown = [f"tensor={obj.label()}"] if "tensor" in touched else []
    shown += [f"{field}={values[field]!r}" for field in FIELDS if field in touched]
    return InvalidSourceCase(
        rule=min(rules),
        broken_rules=rules,
        recipe=f"RealKvSource({', '.join(shown)}, ...)",
        expected=expected,
        obj=obj,
        page_size=values["page_size"],
        num_bytes_per_token=values["num_bytes_per_token"],
        read_bytes=values["read_bytes"],
    )


def invalid_source_cases(
    *, rule: int | None = None, max_ndim: int | None = None
) -> st.SearchStrategy[InvalidSourceCase]:
    """RealKvSource arguments that break exactly one CONTRACT §3 rule (``rule``, or any of 1..10).

    Realistic objects per rule: 1 an ndarray / list / None / a ``(k, v)`` tuple; 2 a float,
    bool, None, str, ``np.float64`` or ``np.bool_`` in one or more of the three fields
    (numpy integers appear as valid values everywhere); 3 ``page_size`` 0 or negative; 4 a
    positive non-multiple of 16 such as 24; 5 ``read_bytes`` 0, 8, negative, not a multiple
    of 16 or above ``num_bytes_per_token``; 6 a 0-D element or 1-D buffer/row; 7 a row
    stride that is not a multiple of 16 bytes (``uint8[rows, 24]``); 8 a transposed or
    sliced view whose row stride is still fine; 9 a row narrower than ``page_size *
    num_bytes_per_token``; 10 a view 1..15 bytes into an aligned buffer. ``num_bytes_per_token``
    of 0, 8 or negative breaks rule 5 too, so it is in :func:`multi_invalid_source_cases`.
    ``max_ndim`` caps the rank of the N-D rows drawn for valid parts (as in
    :func:`source_layouts`); None: no cap.

    Example draw from ``invalid_source_cases(rule=7)``::

        InvalidSourceCase(rule=7, broken_rules=frozenset({7}),
            recipe='RealKvSource(tensor=uint8[2, 24], ...)',
            expected=(ValueError, 'kv-canary: RealKvSource.tensor row stride must be a '
                      'multiple of 16 bytes, got 24 bytes (shape=(2, 24), strides=(24, 1), '
                      'dtype=torch.uint8)'),
            obj=ObjectSpec(kind='tensor', dtype='uint8', shape=(2, 24), ...),
            page_size=1, num_bytes_per_token=16, read_bytes=16)
    """
    if rule is None:
        rules = _RULES
    elif isinstance(rule, bool) or not isinstance(rule, int) or rule not in _RULES:
        raise InvalidArgument(f"rule={rule!r} must be None or an int in 1..10")
    else:
        rules = (rule,)
    _check_max_ndim(max_ndim)
    return _invalid_case({r: (frozenset({_SINGLE_BREAK[r]}),) for r in rules}, max_ndim)


def multi_invalid_source_cases(
    *, rule: int | None = None, max_ndim: int | None = None
) -> st.SearchStrategy[InvalidSourceCase]:
    """RealKvSource arguments that break two or more CONTRACT §3 rules; the first one must win.

    Each winning rule (1..9; rule 10 is last, so it never wins over another) is drawn
    equally often; ``rule`` keeps only cases where that rule wins; ``max_ndim`` as in
    :func:`invalid_source_cases`.

    Example draw::

        InvalidSourceCase(rule=3, broken_rules=frozenset({3, 10}),
            recipe='RealKvSource(tensor=int32[1, 16] at byte offset 8, page_size=0, ...)',
            expected=(ValueError, 'kv-canary: RealKvSource.page_size must be >= 1, got 0'),
            ...)
    """
    _check_max_ndim(max_ndim)
    if rule is None:
        return _invalid_case(_MULTI_BREAK_SETS, max_ndim)
    if isinstance(rule, bool) or not isinstance(rule, int) or rule not in _MULTI_BREAK_SETS:
        raise InvalidArgument(
            f"rule={rule!r} must be None or one of {sorted(_MULTI_BREAK_SETS)} (a rule that can "
            "be the first of several)"
        )
    return _invalid_case({rule: _MULTI_BREAK_SETS[rule]}, max_ndim)


def _check_max_ndim(max_ndim: int | None) -> None:
    if max_ndim is not None:
        check_int("max_ndim", max_ndim, 2, 64)
