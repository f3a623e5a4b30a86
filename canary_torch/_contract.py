"""The types and argument rules of ``canary_torch``, written from the contract
(docs/CONTRACT.md) alone.

Nothing here comes from the Triton implementation: the constants and enums are declared
again (CONTRACT §1), ``RealKvSource`` validates its own way (CONTRACT §3), and the launch
checks of ``fingerprint`` (CONTRACT §4) and of write and verify (CONTRACT §6, §8) are this
module's own code. So the conformance suite checks two independent implementations of those
rules, and a bug in one of them is not hidden by sharing it with the other.

Error types and the messages the contract gives are its own, character for character; where
it only says what a message names, the wording here is this module's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, IntEnum, IntFlag
from typing import NamedTuple

import numpy as np
import torch

# --- CONTRACT §1 ---------------------------------------------------------------------------

CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890
TOKEN_TO_KV_SLOT_PADDING = 0
CANARY_FIELDS_PER_SLOT = 4
CANARY_SLOT_BYTES = 32
VIOLATION_FIELDS = 8
MAX_REAL_KV_SOURCES = 4

FIELD_TOKEN, FIELD_POSITION, FIELD_PREV_HASH, FIELD_REAL_KV_HASH = range(4)

PARTIAL_WINDOW_BYTES = 16  # CONTRACT §3: PARTIAL reads the first 16 bytes of a slot


class RealKvHashMode(IntEnum):
    NONE = 0
    PARTIAL = 1
    ALL = 2


class FailReason(IntFlag):
    VERIFY_CHAIN_HASH_MISMATCH = 1
    VERIFY_POSITION_MISMATCH = 2
    VERIFY_REAL_KV_HASH_MISMATCH = 4
    WRITE_TOKEN_MISMATCH = 8
    WRITE_POSITION_MISMATCH = 16
    VERIFY_TOKEN_MISMATCH = 32


class CanaryLaunchTag(IntEnum):
    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


# --- CONTRACT §3: RealKvSource ---------------------------------------------------------------

_SOURCE = "kv-canary: RealKvSource"
_INT_FIELDS = ("page_size", "num_bytes_per_token", "read_bytes")


def _integer(value: object) -> bool:
    """Rule 2: a Python or numpy integer, never a bool (of either kind)."""
    if isinstance(value, (bool, np.bool_)):
        return False
    return isinstance(value, (int, np.integer))


def _dense_rows(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Rule 8: dims 1.. are row-major contiguous (size-1 dims may have any stride)."""
    if 0 in shape[1:]:
        return True  # no element, nothing to lay out
    step = 1
    for dim in range(len(shape) - 1, 0, -1):
        if shape[dim] == 1:
            continue
        if strides[dim] != step:
            return False
        step *= shape[dim]
    return True


def validate_source(tensor, page_size, num_bytes_per_token, read_bytes) -> None:
    """Raise the error of the first CONTRACT §3 rule the arguments break, if any."""
    if not isinstance(tensor, torch.Tensor):  # rule 1
        raise TypeError(f"{_SOURCE}.tensor must be a torch.Tensor, got {type(tensor).__name__}")
    values = dict(zip(_INT_FIELDS, (page_size, num_bytes_per_token, read_bytes)))
    for name, value in values.items():  # rule 2, in field order
        if not _integer(value):
            raise TypeError(f"{_SOURCE}.{name} must be an int, got {type(value).__name__}")
    # Python ints from here on: numpy integer arithmetic would wrap at its own width.
    page, per_token, read = (int(v) for v in values.values())
    if not page >= 1:  # rule 3
        raise ValueError(f"{_SOURCE}.page_size must be >= 1, got {page}")
    if not (per_token > 0 and per_token % 16 == 0):  # rule 4
        raise ValueError(
            f"{_SOURCE}.num_bytes_per_token must be a positive multiple of 16, got {per_token}"
        )
    if not (read > 0 and read % 16 == 0 and read <= per_token):  # rule 5
        raise ValueError(
            f"{_SOURCE}.read_bytes must be a positive multiple of 16 in "
            f"(0, num_bytes_per_token={per_token}], got {read}"
        )
    shape = tuple(tensor.shape)
    if len(shape) < 2:  # rule 6
        raise ValueError(f"{_SOURCE}.tensor must be at least 2-D, got shape {shape}")
    strides = tuple(tensor.stride())
    itemsize = tensor.element_size()
    row_stride = strides[0] * itemsize
    if row_stride % 16:  # rule 7
        raise ValueError(
            f"{_SOURCE}.tensor row stride must be a multiple of 16 bytes, got {row_stride} "
            f"bytes (shape={shape}, strides={strides}, dtype={tensor.dtype})"
        )
    if not _dense_rows(shape, strides):  # rule 8
        raise ValueError(
            f"{_SOURCE}.tensor rows must be contiguous, got shape {shape} with strides {strides}"
        )
    row_bytes = itemsize
    for size in shape[1:]:
        row_bytes *= size
    layout_bytes = page * per_token
    if row_bytes < layout_bytes:  # rule 9
        raise ValueError(
            f"{_SOURCE}.tensor row is {row_bytes} bytes wide but page_size={page} x "
            f"num_bytes_per_token={per_token} needs {layout_bytes} "
            f"(shape={shape}, dtype={tensor.dtype})"
        )
    remainder = tensor.data_ptr() % 16
    if remainder:  # rule 10
        raise ValueError(
            f"{_SOURCE}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == "
            f"{remainder}"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RealKvSource:
    """A tensor whose rows hold the real KV bytes of ``page_size`` slots each (CONTRACT §3).

    Slot ``s`` lives in row ``s // page_size`` at byte ``(s % page_size) *
    num_bytes_per_token`` of the row; rows are ``stride(0)`` apart. The tensor is kept, not
    copied: a hash always reads its current bytes.
    """

    tensor: torch.Tensor
    page_size: int
    num_bytes_per_token: int
    read_bytes: int

    def __post_init__(self) -> None:
        validate_source(self.tensor, self.page_size, self.num_bytes_per_token, self.read_bytes)

    @property
    def capacity(self) -> int:
        """Slots this source addresses: ``rows * page_size``."""
        return int(self.tensor.shape[0]) * int(self.page_size)


# --- CONTRACT §5: context and plans ----------------------------------------------------------


def _positive_capacity(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")
    if int(value) <= 0:
        raise ValueError(f"kv-canary: {name} must be > 0, got {int(value)}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class VerifyOrWriteContext:
    """What a write or verify launch reads and updates besides its plan (CONTRACT §5)."""

    canary_buf: torch.Tensor
    kernel_kind: CanaryLaunchTag
    violation_ring: torch.Tensor
    violation_write_index: torch.Tensor
    slot_run_counter: torch.Tensor
    kernel_run_counter: torch.Tensor
    real_kv_sources: tuple[RealKvSource, ...]
    real_kv_hash_mode: RealKvHashMode
    enable_chain_position_assert: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class VerifyPlan:
    """The entries one verify launch checks (CONTRACT §5)."""

    verify_slot_indices: torch.Tensor
    verify_expected_tokens: torch.Tensor
    verify_expected_positions: torch.Tensor
    verify_prev_slot_indices: torch.Tensor
    verify_num_valid: torch.Tensor
    enable: torch.Tensor

    @classmethod
    def allocate(cls, *, verify_capacity: int, device: torch.device | str) -> VerifyPlan:
        """An enabled plan of ``verify_capacity`` entries, none valid yet."""
        n = _positive_capacity("verify_capacity", verify_capacity)

        def longs(fill: int) -> torch.Tensor:
            return torch.full((n,), fill, dtype=torch.int64, device=device)

        return cls(
            verify_slot_indices=longs(0),
            verify_expected_tokens=longs(-1),
            verify_expected_positions=longs(0),
            verify_prev_slot_indices=longs(0),
            verify_num_valid=torch.zeros(1, dtype=torch.int32, device=device),
            enable=torch.ones(1, dtype=torch.int32, device=device),
        )


@dataclass(frozen=True, kw_only=True)
class WritePlan:
    """The requests one write launch writes (CONTRACT §5)."""

    write_offsets: torch.Tensor
    write_seed_slot_indices: torch.Tensor
    write_num_valid_reqs: torch.Tensor

    @classmethod
    def allocate(cls, *, write_req_capacity: int, device: torch.device | str) -> WritePlan:
        """A plan for ``write_req_capacity`` requests, none valid yet, all seeded at the anchor."""
        n = _positive_capacity("write_req_capacity", write_req_capacity)
        return cls(
            write_offsets=torch.zeros(n + 1, dtype=torch.int64, device=device),
            write_seed_slot_indices=torch.full((n,), -1, dtype=torch.int64, device=device),
            write_num_valid_reqs=torch.zeros(1, dtype=torch.int32, device=device),
        )


# --- CONTRACT §4: fingerprint's launch checks ------------------------------------------------


def refuse_too_many_sources(sources: Sequence) -> None:
    """CONTRACT §4's first launch check."""
    if len(sources) > MAX_REAL_KV_SOURCES:
        raise ValueError(
            f"kv-canary: at most {MAX_REAL_KV_SOURCES} RealKvSource entries supported by the "
            f"CUDA ABI, got {len(sources)}"
        )


def _foreign_enum(value: object, enum_name: str) -> bool:
    """An enum member of another enum than ``enum_name`` (any implementation's of that name
    is accepted: engines may hand over their own)."""
    return isinstance(value, Enum) and type(value).__name__ != enum_name


def sequence_of_sources(sources: object, name: str, what: str) -> tuple:
    """``sources`` as a tuple, refused unless it is a list or tuple (a bare source, None...)."""
    if not isinstance(sources, (list, tuple)):
        raise TypeError(f"kv-canary: {name} must be {what}, got {type(sources).__name__}")
    return tuple(sources)


def launch_flag(name: str, value: object) -> bool:
    """A launch flag: a Python bool, not something that converts to one (None, 'no', a tensor)."""
    if not isinstance(value, bool):
        raise TypeError(f"kv-canary: {name} must be a bool, got {type(value).__name__}")
    return value


def hash_mode(mode: object, name: str = "mode") -> RealKvHashMode:
    """``mode`` as a RealKvHashMode: an int (or a RealKvHashMode) of one of its values."""
    if (
        isinstance(mode, (bool, np.bool_))
        or not isinstance(mode, (int, np.integer))
        or _foreign_enum(mode, "RealKvHashMode")
    ):
        raise TypeError(
            f"kv-canary: {name} must be a RealKvHashMode or its int value, "
            f"got {type(mode).__name__}"
        )
    value = int(mode)
    if value not in RealKvHashMode._value2member_map_:
        raise ValueError(
            f"kv-canary: {name} must be one of {[m.value for m in RealKvHashMode]}, got {value}"
        )
    return RealKvHashMode(value)


def refuse_sources_elsewhere(sources: Sequence, device: torch.device, where: str) -> None:
    """Each source is a RealKvSource on ``device`` (that of ``where``)."""
    for i, source in enumerate(sources):
        if not isinstance(source, RealKvSource):
            raise TypeError(
                f"kv-canary: real_kv_sources[{i}] must be a RealKvSource, "
                f"got {type(source).__name__}"
            )
        if source.tensor.device != device:
            raise ValueError(
                f"kv-canary: real_kv_sources[{i}] is on {source.tensor.device}, but {where} is "
                f"on {device}"
            )


def refuse_slots_past_sources(
    sources: Sequence[RealKvSource], slots, what: str, as_given=None
) -> None:
    """IndexError for the first source that lacks some slot of ``slots`` (host int64). The
    slot is named by its value in ``as_given``, the caller's own tensor before the int64 cast
    (CONTRACT §4: a uint64 slot past 2^63 is named as that number, not as a negative one)."""
    if len(slots) == 0:
        return
    smallest, largest = int(slots.min()), int(slots.max())
    for i, source in enumerate(sources):
        capacity = source.capacity
        if smallest >= 0 and largest < capacity:
            continue
        first = int(((slots < 0) | (slots >= capacity)).nonzero()[0, 0])
        outside = (slots if as_given is None else as_given)[first].item()
        raise IndexError(
            f"kv-canary: {what} {outside} is not in real_kv_sources[{i}], which has "
            f"capacity {capacity} slots"
        )


class FingerprintArgs(NamedTuple):
    sources: tuple[RealKvSource, ...]
    slots: torch.Tensor  # int64, contiguous, on the caller's device
    mode: RealKvHashMode


def fingerprint_args(sources, slot_indices, mode) -> FingerprintArgs:
    """CONTRACT §4's launch checks in its order (source cap first), and the checked arguments."""
    sources = sequence_of_sources(sources, "sources", "a list or tuple of RealKvSource")
    refuse_too_many_sources(sources)
    mode = hash_mode(mode)
    if not isinstance(slot_indices, torch.Tensor):
        raise TypeError(
            f"kv-canary: slot_indices must be a torch.Tensor, got {type(slot_indices).__name__}"
        )
    dtype = slot_indices.dtype
    if (
        slot_indices.dim() != 1
        or dtype == torch.bool
        or dtype.is_floating_point
        or dtype.is_complex
    ):
        raise ValueError(
            f"kv-canary: slot_indices must be a 1-D integer tensor, got shape "
            f"{tuple(slot_indices.shape)} of {dtype}"
        )
    refuse_sources_elsewhere(sources, slot_indices.device, "slot_indices")
    slots = slot_indices.to(torch.int64).contiguous()
    if mode is not RealKvHashMode.NONE:  # NONE reads no source, so it checks no slot
        refuse_slots_past_sources(sources, slots.cpu(), "slot", slot_indices)
    return FingerprintArgs(sources, slots, mode)


# --- CONTRACT §6, §8: write and verify launch checks -------------------------------------------

_LONG = (torch.int64,)
_INT = (torch.int32,)
_TOKENS = (torch.int32, torch.int64)  # CONTRACT §10: token arrays may be either


def _tensor(name: str, value, dtypes, shape, device) -> torch.Tensor:
    """``value`` is a contiguous tensor of ``dtypes``, of ``shape`` (None: any size), on
    ``device`` (None: any); the error names the field, what it must be and what it is."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"kv-canary: {name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_contiguous():
        raise ValueError(f"kv-canary: {name} must be contiguous")
    if value.dtype not in dtypes:
        allowed = "/".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"kv-canary: {name} has dtype {value.dtype}, expected {allowed}")
    fits = value.dim() == len(shape) and all(
        want is None or have == want for have, want in zip(value.shape, shape)
    )
    if not fits:
        wanted = "(" + ", ".join("any" if n is None else str(n) for n in shape) + ")"
        raise ValueError(
            f"kv-canary: {name} has shape {tuple(value.shape)}, expected shape {wanted}"
        )
    if device is not None and value.device != device:
        raise ValueError(
            f"kv-canary: {name} is on {value.device}, expected the canary buffer's device {device}"
        )
    return value


def _below(name: str, slots, bound: int) -> None:
    """Every slot of ``slots`` (host int64) is in [0, bound)."""
    if len(slots) == 0:
        return
    outside = slots[(slots < 0) | (slots >= bound)]
    if len(outside):
        raise IndexError(
            f"kv-canary: {name} has slot {int(outside[0])}, but the canary buffer has {bound} slots"
        )


class Context(NamedTuple):
    device: torch.device
    num_slots: int
    mode: RealKvHashMode
    sources: tuple[RealKvSource, ...]


def _context_sources(context: VerifyOrWriteContext) -> tuple:
    return sequence_of_sources(
        context.real_kv_sources, "context.real_kv_sources", "a tuple of RealKvSource"
    )


def _context(context) -> Context:
    if not isinstance(context, VerifyOrWriteContext):
        raise TypeError(
            f"kv-canary: context must be a VerifyOrWriteContext, got {type(context).__name__}"
        )
    sources = _context_sources(context)
    refuse_too_many_sources(sources)
    buf = _tensor("context.canary_buf", context.canary_buf, (torch.uint8,), (None, None), None)
    device = buf.device
    stride = buf.shape[1]
    if stride < CANARY_SLOT_BYTES or stride % 8:
        raise ValueError(
            f"kv-canary: context.canary_buf rows are {stride} bytes, but a slot stride must be "
            f">= {CANARY_SLOT_BYTES} and a multiple of 8"
        )
    if buf.data_ptr() % 8:
        raise ValueError(
            f"kv-canary: context.canary_buf must be 8-byte aligned, got data_ptr % 8 == "
            f"{buf.data_ptr() % 8}"
        )
    _tensor("context.violation_ring", context.violation_ring, _LONG, (None, 8), device)
    for name in ("violation_write_index", "enable_chain_position_assert"):
        _tensor(f"context.{name}", getattr(context, name), _INT, (1,), device)
    for name in ("slot_run_counter", "kernel_run_counter"):
        _tensor(f"context.{name}", getattr(context, name), _LONG, (1,), device)
    kind = context.kernel_kind
    if (
        isinstance(kind, (bool, np.bool_))
        or not isinstance(kind, (int, np.integer))
        or _foreign_enum(kind, "CanaryLaunchTag")
    ):
        raise TypeError(
            f"kv-canary: context.kernel_kind must be a CanaryLaunchTag, got {type(kind).__name__}"
        )
    if int(kind) not in CanaryLaunchTag._value2member_map_:
        raise ValueError(
            f"kv-canary: context.kernel_kind must be a CanaryLaunchTag, got {int(kind)}"
        )
    mode = hash_mode(context.real_kv_hash_mode, "context.real_kv_hash_mode")
    refuse_sources_elsewhere(sources, device, "context.canary_buf")
    return Context(device, buf.shape[0], mode, sources)


class VerifyLaunch(NamedTuple):
    context: Context
    enabled: bool
    active: int  # entries to check: clamp(verify_num_valid, 0, cap), 0 when disabled


def verify_launch(context, plan, check_verify_expected_token: bool = False) -> VerifyLaunch:
    """Every CONTRACT §8 rule of a verify launch; raises for the first one broken."""
    ctx = _context(context)
    launch_flag("check_verify_expected_token", check_verify_expected_token)
    if not isinstance(plan, VerifyPlan):
        raise TypeError(f"kv-canary: plan must be a VerifyPlan, got {type(plan).__name__}")
    slots = _tensor(
        "plan.verify_slot_indices", plan.verify_slot_indices, _LONG, (None,), ctx.device
    )
    cap = slots.shape[0]
    for name in ("verify_expected_tokens", "verify_expected_positions", "verify_prev_slot_indices"):
        _tensor(f"plan.{name}", getattr(plan, name), _LONG, (cap,), ctx.device)
    _tensor("plan.verify_num_valid", plan.verify_num_valid, _INT, (1,), ctx.device)
    _tensor("plan.enable", plan.enable, _INT, (1,), ctx.device)
    if int(plan.enable.item()) == 0:
        # CONTRACT §8: a disabled plan's entries may be unwritten, so they are not looked at.
        return VerifyLaunch(ctx, False, 0)
    active = min(max(int(plan.verify_num_valid.item()), 0), cap)
    host_slots = slots[:active].cpu()
    host_prev = plan.verify_prev_slot_indices[:active].cpu()
    _below("plan.verify_slot_indices", host_slots, ctx.num_slots)
    _below("plan.verify_prev_slot_indices", host_prev[host_prev >= 0], ctx.num_slots)
    if ctx.mode is not RealKvHashMode.NONE:
        checked = host_slots[host_slots != TOKEN_TO_KV_SLOT_PADDING]  # slot 0 is never read
        refuse_slots_past_sources(ctx.sources, checked, "plan.verify_slot_indices slot")
    return VerifyLaunch(ctx, True, active)


class WriteLaunch(NamedTuple):
    context: Context
    active: int  # valid requests: clamp(write_num_valid_reqs, 0, cap)
    first: int  # their entries are [first, last) of the token arrays
    last: int


def write_launch(
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
) -> WriteLaunch:
    """Every CONTRACT §6/§8 rule of a write launch; raises for the first one broken."""
    if isinstance(context, VerifyOrWriteContext):
        refuse_too_many_sources(_context_sources(context))  # CONTRACT §4: the cap comes first
    launch_flag("enable_write_input_assert", enable_write_input_assert)
    expected = {
        "expected_input_tokens": expected_input_tokens,
        "expected_input_positions": expected_input_positions,
    }
    given = [value is not None for value in expected.values()]
    if enable_write_input_assert and not all(given):
        raise ValueError(
            "kv-canary: expected input tensors are required when enable_write_input_assert=True"
        )
    if not enable_write_input_assert and any(given):
        raise ValueError(
            "kv-canary: expected input tensors must be None when enable_write_input_assert=False"
        )
    ctx = _context(context)
    if not isinstance(plan, WritePlan):
        raise TypeError(f"kv-canary: plan must be a WritePlan, got {type(plan).__name__}")
    seeds = _tensor(
        "plan.write_seed_slot_indices", plan.write_seed_slot_indices, _LONG, (None,), ctx.device
    )
    cap = seeds.shape[0]
    offsets = _tensor("plan.write_offsets", plan.write_offsets, _LONG, (cap + 1,), ctx.device)
    _tensor("plan.write_num_valid_reqs", plan.write_num_valid_reqs, _INT, (1,), ctx.device)
    loc = _tensor("out_cache_loc", out_cache_loc, _TOKENS, (None,), ctx.device)
    entries = loc.shape[0]
    _tensor("input_ids", input_ids, _TOKENS, (entries,), ctx.device)
    _tensor("positions", positions, _TOKENS, (entries,), ctx.device)
    if enable_write_input_assert:
        for name, value in expected.items():
            _tensor(name, value, _TOKENS, (entries,), ctx.device)

    active = min(max(int(plan.write_num_valid_reqs.item()), 0), cap)
    host_seeds = seeds[:active].cpu()
    _below("plan.write_seed_slot_indices", host_seeds[host_seeds >= 0], ctx.num_slots)
    if active == 0:
        return WriteLaunch(ctx, 0, 0, 0)
    bounds = offsets[: active + 1].cpu()
    steps = bounds[1:] - bounds[:-1]
    if int(bounds[0]) < 0 or int(bounds[-1]) > entries or bool((steps < 0).any()):
        raise ValueError(
            f"kv-canary: plan.write_offsets of the {active} valid requests must be "
            f"non-decreasing within [0, {entries}], got {bounds.tolist()}"
        )
    first, last = int(bounds[0]), int(bounds[-1])
    written = loc[first:last].to(torch.int64).cpu()
    written = written[written >= 0]  # a negative slot is skipped: nothing is written there
    _below("out_cache_loc", written, ctx.num_slots)
    if ctx.mode is not RealKvHashMode.NONE:
        refuse_slots_past_sources(ctx.sources, written, "out_cache_loc slot")
    return WriteLaunch(ctx, active, first, last)
