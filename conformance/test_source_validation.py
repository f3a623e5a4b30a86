"""RealKvSource validation (CONTRACT §3): valid configs accepted, invalid ones raise the exact error."""

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import example, given

import strategies as st_kv
from conformance import profiles
from conformance.assertions import fail
from conformance.profiles import examples
from conformance.support import source_case_repro


def aligned(device, nbytes: int, offset: int = 0) -> torch.Tensor:
    """A uint8 buffer whose element ``offset`` sits at a 16-byte-aligned address plus ``offset``."""
    raw = torch.zeros(nbytes + 32, dtype=torch.uint8, device=device)
    start = (-raw.data_ptr()) % 16
    return raw[start + offset : start + offset + nbytes]


GOOD = dict(page_size=2, num_bytes_per_token=32, read_bytes=16)
P = "kv-canary: RealKvSource"


def two_rows(device) -> torch.Tensor:
    """A valid tensor for GOOD: two aligned rows of 64 bytes."""
    return aligned(device, 128).view(2, 64)


CASES = [
    # (id, tensor factory, overrides, exception, message)
    ("tensor=ndarray", lambda d: np.zeros((2, 64), np.uint8), {}, TypeError, f"{P}.tensor must be a torch.Tensor, got ndarray"),
    ("tensor=None", lambda d: None, {}, TypeError, f"{P}.tensor must be a torch.Tensor, got NoneType"),
    ("page_size=2.0", two_rows, {"page_size": 2.0}, TypeError, f"{P}.page_size must be an int, got float"),
    ("page_size=True", two_rows, {"page_size": True}, TypeError, f"{P}.page_size must be an int, got bool"),
    ("num_bytes_per_token='32'", two_rows, {"num_bytes_per_token": "32"}, TypeError, f"{P}.num_bytes_per_token must be an int, got str"),
    ("read_bytes=None", two_rows, {"read_bytes": None}, TypeError, f"{P}.read_bytes must be an int, got NoneType"),
    ("page_size=0", two_rows, {"page_size": 0}, ValueError, f"{P}.page_size must be >= 1, got 0"),
    ("page_size=-3", two_rows, {"page_size": -3}, ValueError, f"{P}.page_size must be >= 1, got -3"),
    (
        "num_bytes_per_token=24",
        two_rows,
        {"num_bytes_per_token": 24},
        ValueError,
        f"{P}.num_bytes_per_token must be a positive multiple of 16, got 24",
    ),
    ("num_bytes_per_token=0", two_rows, {"num_bytes_per_token": 0}, ValueError, f"{P}.num_bytes_per_token must be a positive multiple of 16, got 0"),
    (
        "read_bytes=48",
        two_rows,
        {"read_bytes": 48},
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=32], got 48",
    ),
    (
        "read_bytes=8",
        two_rows,
        {"read_bytes": 8},
        ValueError,
        f"{P}.read_bytes must be a positive multiple of 16 in (0, num_bytes_per_token=32], got 8",
    ),
    ("tensor 1-D", lambda d: aligned(d, 128), {}, ValueError, f"{P}.tensor must be at least 2-D, got shape (128,)"),
    ("tensor 0-D", lambda d: torch.tensor(3), {}, ValueError, f"{P}.tensor must be at least 2-D, got shape ()"),
    (
        "row stride 72 bytes",
        lambda d: aligned(d, 144).view(2, 72),
        {},
        ValueError,
        f"{P}.tensor row stride must be a multiple of 16 bytes, got 72 bytes "
        "(shape=(2, 72), strides=(72, 1), dtype=torch.uint8)",
    ),
    (
        "rows not contiguous",
        lambda d: aligned(d, 256).view(2, 64, 2)[:, :, 0],
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 64) with strides (128, 2)",
    ),
    (
        "row too narrow",
        lambda d: aligned(d, 96).view(2, 48),
        {},
        ValueError,
        f"{P}.tensor row is 48 bytes wide but page_size=2 x num_bytes_per_token=32 needs 64 "
        "(shape=(2, 48), dtype=torch.uint8)",
    ),
    (
        # 16 x 64 wraps to 0 in int8 arithmetic: the check must not be fooled into accepting
        "row too narrow, int8 sizes",
        lambda d: aligned(d, 1024).view(2, 512),
        {"page_size": np.int8(16), "num_bytes_per_token": np.int8(64), "read_bytes": np.int8(16)},
        ValueError,
        f"{P}.tensor row is 512 bytes wide but page_size=16 x num_bytes_per_token=64 needs "
        "1024 (shape=(2, 512), dtype=torch.uint8)",
    ),
    (
        # the whole row counts (2 x 8 bf16 = 32 bytes), not dim 1 alone
        "row too narrow, N-D",
        lambda d: aligned(d, 64).view(torch.bfloat16).view(2, 2, 8),
        {},
        ValueError,
        f"{P}.tensor row is 32 bytes wide but page_size=2 x num_bytes_per_token=32 needs 64 "
        "(shape=(2, 2, 8), dtype=torch.bfloat16)",
    ),
    (
        "data_ptr % 16 == 4",
        lambda d: aligned(d, 128, offset=4).view(torch.int32).view(2, 16),
        {},
        ValueError,
        f"{P}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == 4",
    ),
    # several rules broken at once: the first in the contract's order wins
    ("page_size=0 and read_bytes=8", two_rows, {"page_size": 0, "read_bytes": 8}, ValueError, f"{P}.page_size must be >= 1, got 0"),
    ("1-D tensor and page_size=0.5", lambda d: aligned(d, 128), {"page_size": 0.5}, TypeError, f"{P}.page_size must be an int, got float"),
    (
        "narrow row and misaligned",
        lambda d: aligned(d, 64, offset=1).view(2, 32),
        {},
        ValueError,
        f"{P}.tensor row is 32 bytes wide but page_size=2 x num_bytes_per_token=32 needs 64 "
        "(shape=(2, 32), dtype=torch.uint8)",
    ),
    # rule 8 at its edges (each found by a surviving mutant: strength/mutation/survivors/)
    (
        "no rows, rows not dense",
        lambda d: torch.as_strided(aligned(d, 256), (0, 4, 16), (64, 1, 4)),
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (0, 4, 16) with strides (64, 1, 4)",
    ),
    (
        "a size-1 dim beside a transposed pair",
        lambda d: torch.as_strided(aligned(d, 256), (2, 1, 4, 16), (128, 64, 1, 4)),
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 1, 4, 16) with strides (128, 64, 1, 4)",
    ),
    (
        "a size-1 dim between a row's last dim and a gapped one",
        lambda d: torch.as_strided(aligned(d, 256), (2, 4, 1, 16), (128, 32, 16, 1)),
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 4, 1, 16) with strides (128, 32, 16, 1)",
    ),
    (
        "a broadcast (stride 0) dim in a row",
        lambda d: torch.as_strided(aligned(d, 256), (2, 4, 16), (64, 0, 1)),
        {},
        ValueError,
        f"{P}.tensor rows must be contiguous, got shape (2, 4, 16) with strides (64, 0, 1)",
    ),
    (
        "zero-width rows with an odd inner stride: rule 9, not rule 8",
        lambda d: torch.as_strided(aligned(d, 64), (2, 0), (16, 3)),
        {},
        ValueError,
        f"{P}.tensor row is 0 bytes wide but page_size=2 x num_bytes_per_token=32 needs 64 "
        "(shape=(2, 0), dtype=torch.uint8)",
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "overrides", "error", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_spec_examples(impl, device, make, overrides, error, message):
    """Hand-written CONTRACT §3 cases raise exactly its exception type and message, first rule first."""
    with pytest.raises(Exception) as caught:
        impl.RealKvSource(tensor=make(device), **{**GOOD, **overrides})
    assert type(caught.value) is error
    assert str(caught.value) == message


@pytest.mark.parametrize(
    "make",
    [
        two_rows,
        lambda d: aligned(d, 256).view(torch.float16).view(2, 4, 16),  # N-D rows
        lambda d: aligned(d, 512).view(2, 256)[:, :64],  # row gap: stride(0) > row
        lambda d: aligned(d, 256, offset=16).view(2, 128),  # storage offset
        lambda d: aligned(d, 0).view(0, 64),  # no rows
        lambda d: torch.as_strided(aligned(d, 256), (2, 1, 64), (128, 7, 1)),  # size-1 dim
        lambda d: aligned(d, 2048).view(2, 2, 512),  # strides past 256 elements
    ],
    ids=[
        "plain",
        "N-D rows",
        "row gap",
        "storage offset",
        "zero rows",
        "size-1 dim, odd stride",
        "strides past 256",
    ],
)
def test_valid_examples_are_accepted(impl, device, make):
    """Valid layouts (N-D rows, row gaps, offsets, no rows, numpy ints) construct and keep their fields."""
    tensor = make(device)
    source = impl.RealKvSource(
        tensor=tensor, page_size=np.int64(2), num_bytes_per_token=32, read_bytes=16
    )
    assert source.tensor is tensor
    assert source.page_size == 2


def test_source_is_frozen_and_keyword_only(impl, device):
    """RealKvSource is frozen and keyword-only."""
    source = impl.RealKvSource(tensor=aligned(device, 128).view(2, 64), **GOOD)
    with pytest.raises(AttributeError):
        source.page_size = 4
    with pytest.raises(TypeError):
        impl.RealKvSource(aligned(device, 128).view(2, 64), 2, 32, 16)


def check_case(impl, case, device):
    """Build ``case`` and check that RealKvSource raises exactly its expected error."""
    __tracebackhide__ = True
    kwargs = case.build(device)
    error, message = case.expected
    try:
        impl.RealKvSource(**kwargs)
    except Exception as caught:  # noqa: BLE001 - the type itself is under test
        if type(caught) is not error or str(caught) != message:
            fail(
                f"{case.recipe} raised {type(caught).__name__}: {caught}\n"
                f"  but CONTRACT §3 rule {case.rule} requires {error.__name__}: {message}",
                config=f"rules broken: {sorted(case.broken_rules)}",
                repro=source_case_repro(impl.__name__, device, case),
            )
    else:
        fail(
            f"{case.recipe} was accepted, but CONTRACT §3 rule {case.rule} requires "
            f"{error.__name__}: {message}",
            repro=source_case_repro(impl.__name__, device, case),
        )


INT_TYPES = (int, np.int64, np.int32, np.uint16, np.int8)


@examples(1.0)
@given(
    layout=st_kv.source_layouts(**profiles.layout_sizes(), fills=("dense",)),
    int_types=st.tuples(*[st.sampled_from(INT_TYPES)] * 3),
)
@example(  # int8 16 x int8 64 wraps in numpy: the narrow-row check must compute with Python ints
    layout=st_kv.layout(rows=1, page_size=16, num_bytes_per_token=64),
    int_types=(np.int8, np.int8, np.int8),
)
def test_valid_configs_are_accepted(impl, device, layout, int_types):
    """Every valid generated layout constructs, with Python or numpy integers, keeping its tensor (not a copy) and its ints."""
    m = st_kv.materialize(layout, device)
    names = ("page_size", "num_bytes_per_token", "read_bytes")
    values = {
        name: kind(value)
        for name, kind, value in zip(names, int_types, m.kwargs().values(), strict=True)
        if kind is int or value <= np.iinfo(kind).max
    }
    kwargs = {**m.kwargs(), **values}
    try:
        source = impl.RealKvSource(tensor=m.tensor, **kwargs)
    except Exception as caught:  # noqa: BLE001
        fail(
            f"a valid source was refused: {type(caught).__name__}: {caught}",
            config=f"{layout!r} with {', '.join(f'{k}={v!r}' for k, v in kwargs.items())}",
        )
    assert source.tensor is m.tensor
    assert (source.page_size, source.num_bytes_per_token, source.read_bytes) == (
        layout.page_size,
        layout.num_bytes_per_token,
        layout.read_bytes,
    )


@pytest.mark.parametrize("rule", range(1, 11))
@examples(0.3)
@given(data=st.data())
def test_each_rule_raises_its_error(impl, device, rule, data):
    """A config breaking only rule N raises rule N's exact exception type and message."""
    cases = st_kv.invalid_source_cases(rule=rule, max_ndim=profiles.SOURCE_NDIM_MAX)
    case = data.draw(cases, label="case")
    check_case(impl, case, device)


@examples(1.0)
@given(case=st_kv.multi_invalid_source_cases(max_ndim=profiles.SOURCE_NDIM_MAX))
def test_first_broken_rule_wins(impl, device, case):
    """A config breaking several rules raises the error of the first of them in the contract's order."""
    check_case(impl, case, device)
