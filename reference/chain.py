"""The canary buffer, the violation ring, and the write and verify launches (CONTRACT §5-§7).

State lives in numpy arrays that are mutated in place, exactly as the kernels mutate their
tensors. The chain is sequential per request, so requests and entries are walked in Python;
the real-KV fingerprints a launch needs are computed in one vectorised call before any state
changes, so a launch that raises leaves every array untouched.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import cast

import numpy as np

from reference.constants import (
    CANARY_CHAIN_ANCHOR,
    CANARY_SLOT_BYTES,
    MAX_REAL_KV_SOURCES,
    VIOLATION_FIELDS,
    CanaryField,
    FailReason,
    RealKvHashMode,
)
from reference.hashing import splitmix64, splitmix64_mix3, to_signed64
from reference.source import Source, fingerprint

_FIELD_BYTES = 8


@dataclass
class CanaryState:
    """The numpy mirror of ``VerifyOrWriteContext``.

    ``canary_buf``: uint8 ``[num_slots, slot_stride_bytes]``; ``violation_ring``: int64
    ``[ring_capacity, 8]``; ``violation_write_index``: int32 ``[1]``; both run counters: int64
    ``[1]``; ``enable_chain_position_assert``: int32 ``[1]``.

    ``past_capacity`` is no part of the contract's state: ``(index, row)`` of each violation
    whose index fell outside the ring, so nothing was stored. Which of one launch's violations
    take the ring's last free rows is unspecified (on a GPU it is the order in which lanes took
    their indices); the suite accepts any of them.
    """

    canary_buf: np.ndarray
    kernel_kind: int
    violation_ring: np.ndarray
    violation_write_index: np.ndarray
    slot_run_counter: np.ndarray
    kernel_run_counter: np.ndarray
    real_kv_sources: tuple[Source, ...]
    real_kv_hash_mode: RealKvHashMode | int
    enable_chain_position_assert: np.ndarray
    past_capacity: list[tuple[int, tuple[int, ...]]] = dataclasses.field(default_factory=list)

    @classmethod
    def allocate(
        cls,
        *,
        num_slots: int,
        ring_capacity: int,
        slot_stride_bytes: int = CANARY_SLOT_BYTES,
        kernel_kind: int = 0,
        real_kv_sources: tuple[Source, ...] = (),
        real_kv_hash_mode: RealKvHashMode | int = RealKvHashMode.NONE,
        enable_chain_position_assert: bool = False,
    ) -> CanaryState:
        """A zeroed state: empty canary buffer, empty ring, counters at 0."""
        return cls(
            canary_buf=np.zeros((num_slots, slot_stride_bytes), dtype=np.uint8),
            kernel_kind=int(kernel_kind),
            violation_ring=np.zeros((ring_capacity, VIOLATION_FIELDS), dtype=np.int64),
            violation_write_index=np.zeros(1, dtype=np.int32),
            slot_run_counter=np.zeros(1, dtype=np.int64),
            kernel_run_counter=np.zeros(1, dtype=np.int64),
            real_kv_sources=tuple(real_kv_sources),
            real_kv_hash_mode=real_kv_hash_mode,
            enable_chain_position_assert=np.array([int(enable_chain_position_assert)], np.int32),
        )


@dataclass
class VerifyPlan:
    """int64 ``[cap]`` per-entry arrays plus int32 ``[1]`` ``verify_num_valid`` and ``enable``.

    ``verify_expected_tokens`` uses -1 for "do not check"; ``verify_prev_slot_indices`` uses a
    negative value for "chain head: expect the anchor" and 0 for "do not check the chain".
    """

    verify_slot_indices: np.ndarray
    verify_expected_tokens: np.ndarray
    verify_expected_positions: np.ndarray
    verify_prev_slot_indices: np.ndarray
    verify_num_valid: np.ndarray
    enable: np.ndarray

    @classmethod
    def allocate(cls, *, verify_capacity: int) -> VerifyPlan:
        if verify_capacity <= 0:
            raise ValueError(f"kv-canary: verify_capacity must be > 0, got {verify_capacity}")
        return cls(
            verify_slot_indices=np.zeros(verify_capacity, dtype=np.int64),
            verify_expected_tokens=np.full(verify_capacity, -1, dtype=np.int64),
            verify_expected_positions=np.zeros(verify_capacity, dtype=np.int64),
            verify_prev_slot_indices=np.zeros(verify_capacity, dtype=np.int64),
            verify_num_valid=np.zeros(1, dtype=np.int32),
            enable=np.ones(1, dtype=np.int32),
        )


@dataclass
class WritePlan:
    """``write_offsets`` int64 ``[cap + 1]`` (exclusive prefix sums into the token arrays),
    ``write_seed_slot_indices`` int64 ``[cap]`` (negative = start from the anchor),
    ``write_num_valid_reqs`` int32 ``[1]``."""

    write_offsets: np.ndarray
    write_seed_slot_indices: np.ndarray
    write_num_valid_reqs: np.ndarray

    @classmethod
    def allocate(cls, *, write_req_capacity: int) -> WritePlan:
        if write_req_capacity <= 0:
            raise ValueError(f"kv-canary: write_req_capacity must be > 0, got {write_req_capacity}")
        return cls(
            write_offsets=np.zeros(write_req_capacity + 1, dtype=np.int64),
            write_seed_slot_indices=np.full(write_req_capacity, -1, dtype=np.int64),
            write_num_valid_reqs=np.zeros(1, dtype=np.int32),
        )


def write(
    state: CanaryState,
    plan: WritePlan,
    *,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
) -> None:
    """Stamp the canary fields of every written slot and chain them (CONTRACT §6)."""
    _check_source_count(state.real_kv_sources)  # CONTRACT §8: the first check of a launch
    _check_expected_inputs_given(
        enable_write_input_assert, expected_input_tokens, expected_input_positions
    )
    num_slots = _check_canary_buf(state.canary_buf)
    token_arrays = _write_token_arrays(
        input_ids,
        positions,
        out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    slots = token_arrays["out_cache_loc"]
    # the loops below read entries one by one: Python ints, not numpy scalars
    slot_of = slots.tolist()
    request_ranges = _write_request_ranges(plan, slot_of, num_slots)

    written_entries = [
        entry
        for begin, end, _ in request_ranges
        for entry in range(begin, end)
        if slot_of[entry] >= 0
    ]
    real_kv_hashes = fingerprint(
        state.real_kv_sources, slots[written_entries], mode=state.real_kv_hash_mode
    )
    real_kv_hash_of_entry = dict(
        zip(written_entries, (int(h) for h in real_kv_hashes), strict=True)
    )
    position_assert_enabled = int(state.enable_chain_position_assert[0]) != 0
    kind = int(state.kernel_kind)
    entries = _WriteEntries.read(token_arrays, slot_of, real_kv_hash_of_entry)
    # Validation is over, and every field is read; from here on the launch mutates state.
    np.add(state.kernel_run_counter, 1, out=state.kernel_run_counter)

    for begin, end, seed in request_ranges:
        if begin == end:
            continue
        _write_request(
            state,
            entries,
            (begin, end, seed),
            kind=kind,
            position_assert_enabled=position_assert_enabled,
        )

    np.add(state.slot_run_counter, len(written_entries), out=state.slot_run_counter)


def _check_expected_inputs_given(
    enable_write_input_assert: bool, expected_input_tokens, expected_input_positions
) -> None:
    """Refuse expected input tensors missing under the write assert, or given without it."""
    if enable_write_input_assert:
        if expected_input_tokens is None or expected_input_positions is None:
            raise ValueError(
                "kv-canary: expected input tensors are required when enable_write_input_assert=True"
            )
    elif expected_input_tokens is not None or expected_input_positions is not None:
        raise ValueError(
            "kv-canary: expected input tensors must be None when enable_write_input_assert=False"
        )


def _write_token_arrays(
    input_ids,
    positions,
    out_cache_loc,
    *,
    enable_write_input_assert: bool,
    expected_input_tokens,
    expected_input_positions,
) -> dict[str, np.ndarray]:
    """A write's per-token arrays as int64 vectors by argument name, each as long as
    ``out_cache_loc`` (the expected ones only under the write assert)."""
    tokens = _int64_vector(input_ids, "input_ids")
    token_positions = _int64_vector(positions, "positions")
    slots = _int64_vector(out_cache_loc, "out_cache_loc")
    token_arrays = {"input_ids": tokens, "positions": token_positions}
    if enable_write_input_assert:
        expected_tokens = _int64_vector(expected_input_tokens, "expected_input_tokens")
        expected_positions = _int64_vector(expected_input_positions, "expected_input_positions")
        token_arrays["expected_input_tokens"] = expected_tokens
        token_arrays["expected_input_positions"] = expected_positions
    num_tokens = slots.shape[0]
    for name, array in token_arrays.items():
        if array.shape[0] != num_tokens:
            raise ValueError(
                f"kv-canary: {name} has {array.shape[0]} entries but out_cache_loc has {num_tokens}"
            )
    token_arrays["out_cache_loc"] = slots
    return token_arrays


def _write_request_ranges(
    plan: WritePlan, slot_of: list[int], num_slots: int
) -> list[tuple[int, int, int]]:
    """``(begin, end, seed)`` of each active request of a write plan, its offsets and its
    slots checked against the token entries and the canary buffer."""
    num_tokens = len(slot_of)
    seeds = _int64_vector(plan.write_seed_slot_indices, "plan.write_seed_slot_indices")
    offsets = _int64_vector(plan.write_offsets, "plan.write_offsets")
    capacity = seeds.shape[0]
    if offsets.shape[0] != capacity + 1:
        raise ValueError(
            f"kv-canary: plan.write_offsets must have {capacity + 1} entries, "
            f"got {offsets.shape[0]}"
        )
    active = _clamp(int(plan.write_num_valid_reqs[0]), 0, capacity)

    request_ranges = []
    for request in range(active):
        begin, end = int(offsets[request]), int(offsets[request + 1])
        if not 0 <= begin <= end <= num_tokens:
            raise ValueError(
                f"kv-canary: plan.write_offsets must be non-decreasing within the "
                f"{num_tokens} token entries, got [{begin}, {end}) for request {request}"
            )
        seed = int(seeds[request])
        if seed >= 0:
            _check_slot_index(seed, num_slots, f"plan.write_seed_slot_indices[{request}]")
        request_ranges.append((begin, end, seed))
        for entry in range(begin, end):
            _check_slot_index(slot_of[entry], num_slots, f"out_cache_loc[{entry}]", skip=True)
    return request_ranges


@dataclass(frozen=True)
class _WriteEntries:
    """A write's entries as Python ints, read before the launch mutates any state."""

    slot_of: list[int]
    token_of: list[int]
    position_of: list[int]
    #: the expected tokens and positions; None without the write assert
    expected_token_of: list[int] | None
    expected_position_of: list[int] | None
    real_kv_hash_of_entry: dict[int, int]

    @classmethod
    def read(
        cls,
        token_arrays: dict[str, np.ndarray],
        slot_of: list[int],
        real_kv_hash_of_entry: dict[int, int],
    ) -> _WriteEntries:
        """The entries of ``token_arrays`` (of ``_write_token_arrays``) as lists."""
        expected_tokens = token_arrays.get("expected_input_tokens")
        expected_positions = token_arrays.get("expected_input_positions")
        return cls(
            slot_of=slot_of,
            token_of=token_arrays["input_ids"].tolist(),
            position_of=token_arrays["positions"].tolist(),
            expected_token_of=None if expected_tokens is None else expected_tokens.tolist(),
            expected_position_of=(
                None if expected_positions is None else expected_positions.tolist()
            ),
            real_kv_hash_of_entry=real_kv_hash_of_entry,
        )


def _write_request(
    state: CanaryState,
    entries: _WriteEntries,
    request_range: tuple[int, int, int],
    *,
    kind: int,
    position_assert_enabled: bool,
) -> None:
    """Stamp and chain the written slots of one request's entries ``[begin, end)`` from the
    chain value that follows its ``seed``, reporting each failed write assert."""
    begin, end, seed = request_range
    slot_of, token_of, position_of = entries.slot_of, entries.token_of, entries.position_of
    expected_token_of = entries.expected_token_of
    expected_position_of = entries.expected_position_of
    running = _slot_hash(state.canary_buf, seed)
    check_positions = seed >= 0 and position_assert_enabled
    prev_pos = _load_field(state.canary_buf, seed, CanaryField.POSITION) if seed >= 0 else 0
    for entry in range(begin, end):
        slot = slot_of[entry]
        if slot < 0:
            continue
        token = token_of[entry]
        pos = position_of[entry]

        if expected_token_of is not None and expected_position_of is not None:
            expected_token = expected_token_of[entry]
            expected_pos = expected_position_of[entry]
            # only a failed assert builds its row: most entries pass, and this loop is hot
            if token != expected_token or pos != expected_pos:
                _check_write_input(
                    state,
                    (kind, slot, pos, token, to_signed64(running)),
                    expected_token,
                    expected_pos,
                )

        if check_positions:
            # int64 successor: 2**63 - 1 is followed by -2**63, as on the device.
            successor = to_signed64(prev_pos + 1)
            if pos != successor:
                _emit_violation(
                    state,
                    (
                        kind,
                        slot,
                        pos,
                        token,
                        token,
                        to_signed64(running),
                        successor,
                        int(FailReason.WRITE_POSITION_MISMATCH),
                    ),
                )
            prev_pos = pos

        _store_fields(
            state.canary_buf,
            slot,
            (token, pos, to_signed64(running), entries.real_kv_hash_of_entry[entry]),
        )
        # The chain advances with the actual values, so one failed assert never
        # cascades into the next entry's row.
        running = splitmix64_mix3(running, token, pos)


def _check_write_input(
    state: CanaryState,
    written: tuple[int, int, int, int, int],
    expected_token: int,
    expected_pos: int,
) -> None:
    """Report a written entry whose token or position is not the expected one;
    ``written`` is ``(kind, slot, pos, token, prev_hash)``."""
    kind, slot, pos, token, prev_hash = written
    bits = 0
    if token != expected_token:
        bits |= FailReason.WRITE_TOKEN_MISMATCH
    if pos != expected_pos:
        bits |= FailReason.WRITE_POSITION_MISMATCH
    if bits:
        _emit_violation(
            state,
            (
                kind,
                slot,
                pos,
                token,
                expected_token,
                prev_hash,
                expected_pos,
                int(bits),
            ),
        )


def verify(state: CanaryState, plan: VerifyPlan, *, check_verify_expected_token: bool) -> None:
    """Check the stored fields of every planned slot; report mismatches (CONTRACT §7)."""
    _check_source_count(state.real_kv_sources)
    num_slots = _check_canary_buf(state.canary_buf)

    slots, prev_slots, expected_positions, expected_tokens = _verify_plan_arrays(
        plan, check_verify_expected_token=check_verify_expected_token
    )
    capacity = slots.shape[0]
    if int(plan.enable[0]) == 0:
        # A plan disabled for overflow leaves its entries unwritten: nothing is read or counted
        # but the launch itself, and its slots are not range-checked.
        np.add(state.kernel_run_counter, 1, out=state.kernel_run_counter)
        return
    active = _clamp(int(plan.verify_num_valid[0]), 0, capacity)
    # the loops below read entries one by one: Python ints, not numpy scalars
    slot_of, prev_of = slots[:active].tolist(), prev_slots[:active].tolist()
    position_of = expected_positions[:active].tolist()
    token_of = None if expected_tokens is None else expected_tokens[:active].tolist()

    for entry in range(active):
        _check_slot_index(slot_of[entry], num_slots, f"plan.verify_slot_indices[{entry}]")
        prev = prev_of[entry]
        if prev >= 0:
            _check_slot_index(prev, num_slots, f"plan.verify_prev_slot_indices[{entry}]")

    # Slot 0 is the padding slot: it is never checked, so its KV bytes are never read.
    checked_entries = [entry for entry in range(active) if slot_of[entry] != 0]
    current_real_kv = fingerprint(
        state.real_kv_sources, slots[checked_entries], mode=state.real_kv_hash_mode
    )
    current_real_kv_of_entry = dict(
        zip(checked_entries, (int(h) for h in current_real_kv), strict=True)
    )

    kind = int(state.kernel_kind)
    np.add(state.kernel_run_counter, 1, out=state.kernel_run_counter)
    np.add(state.slot_run_counter, active, out=state.slot_run_counter)
    anchor_hash = to_signed64(splitmix64(CANARY_CHAIN_ANCHOR))

    for entry in checked_entries:
        _verify_entry(
            state,
            (slot_of[entry], prev_of[entry], position_of[entry]),
            None if token_of is None else token_of[entry],
            current_real_kv_of_entry[entry],
            kind=kind,
            anchor_hash=anchor_hash,
        )


def _verify_plan_arrays(
    plan: VerifyPlan, *, check_verify_expected_token: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """A verify plan's slots, previous slots, expected positions and (where checked) expected
    tokens as int64 vectors, each checked to be as long as the slots."""
    slots = _int64_vector(plan.verify_slot_indices, "plan.verify_slot_indices")
    prev_slots = _int64_vector(plan.verify_prev_slot_indices, "plan.verify_prev_slot_indices")
    expected_positions = _int64_vector(
        plan.verify_expected_positions, "plan.verify_expected_positions"
    )
    capacity = slots.shape[0]
    for name, array in (
        ("plan.verify_prev_slot_indices", prev_slots),
        ("plan.verify_expected_positions", expected_positions),
    ):
        if array.shape[0] != capacity:
            raise ValueError(
                f"kv-canary: {name} must have {capacity} entries, got {array.shape[0]}"
            )
    expected_tokens = None
    if check_verify_expected_token:
        expected_tokens = _int64_vector(plan.verify_expected_tokens, "plan.verify_expected_tokens")
        if expected_tokens.shape[0] != capacity:
            raise ValueError(
                f"kv-canary: plan.verify_expected_tokens must have {capacity} entries, "
                f"got {expected_tokens.shape[0]}"
            )
    return slots, prev_slots, expected_positions, expected_tokens


def _verify_entry(
    state: CanaryState,
    planned: tuple[int, int, int],
    token: int | None,
    current_real_kv: int,
    *,
    kind: int,
    anchor_hash: int,
) -> None:
    """Check one planned slot's stored fields against its plan entry ``planned`` (slot,
    previous slot, expected position), its expected ``token`` (None: not checked) and its
    KV's fingerprint now, and report a mismatch."""
    slot, prev, expected_pos = planned
    stored_token, stored_pos, stored_prev_hash, stored_real_kv = _load_fields(
        state.canary_buf, slot
    )
    if prev < 0:
        expected_chain = anchor_hash
    elif prev == 0:
        expected_chain = stored_prev_hash
    else:
        expected_chain = to_signed64(_slot_hash(state.canary_buf, prev))

    bits = 0
    if prev != 0 and stored_prev_hash != expected_chain:
        bits |= FailReason.VERIFY_CHAIN_HASH_MISMATCH
    expected_token = -1
    if token is not None:
        expected_token = token
        if expected_token != -1 and stored_token != expected_token:
            bits |= FailReason.VERIFY_TOKEN_MISMATCH
    if stored_pos != expected_pos:
        bits |= FailReason.VERIFY_POSITION_MISMATCH
    if stored_real_kv != current_real_kv:
        bits |= FailReason.VERIFY_REAL_KV_HASH_MISMATCH
    if bits:
        _emit_violation(
            state,
            (
                kind,
                slot,
                stored_pos,
                stored_token,
                expected_token,
                stored_prev_hash,
                expected_chain,
                int(bits),
            ),
        )


def _slot_hash(canary_buf: np.ndarray, slot: int) -> int:
    """The chain value that follows ``slot``; a negative slot means the chain head."""
    if slot < 0:
        return splitmix64(CANARY_CHAIN_ANCHOR)
    token, pos, prev_hash, _ = _load_fields(canary_buf, slot)
    return splitmix64_mix3(prev_hash, token, pos)


def _load_field(canary_buf: np.ndarray, slot: int, field: int) -> int:
    start = field * _FIELD_BYTES
    raw = canary_buf[slot, start : start + _FIELD_BYTES].tobytes()
    return int.from_bytes(raw, "little", signed=True)


# A slot's fields, in CanaryField order, as one little-endian int64 each from its first byte
# (the verify reads four fields of every entry: one unpack, not four slices).
assert [int(field) for field in CanaryField] == list(range(len(CanaryField)))
_SLOT_FIELDS = struct.Struct("<" + "q" * len(CanaryField))
assert _SLOT_FIELDS.size == len(CanaryField) * _FIELD_BYTES


def _load_fields(canary_buf: np.ndarray, slot: int) -> tuple[int, int, int, int]:
    # one value per CanaryField, of which there are four
    return cast(
        "tuple[int, int, int, int]",
        _SLOT_FIELDS.unpack(canary_buf[slot, : _SLOT_FIELDS.size].tobytes()),
    )


def _store_fields(canary_buf: np.ndarray, slot: int, values: tuple[int, int, int, int]) -> None:
    if len(values) != len(CanaryField):
        raise ValueError(f"one value per field, got {len(values)}")
    raw = b"".join(int(value).to_bytes(_FIELD_BYTES, "little", signed=True) for value in values)
    canary_buf[slot, : len(raw)] = np.frombuffer(raw, dtype=np.uint8)


def _emit_violation(state: CanaryState, row: tuple[int, ...]) -> None:
    # Fill-once: the index always advances so the host sees how many were lost, but a
    # stored row is never overwritten.
    index = int(state.violation_write_index[0])
    np.add(state.violation_write_index, 1, out=state.violation_write_index)
    if 0 <= index < state.violation_ring.shape[0]:
        state.violation_ring[index] = np.array(row, dtype=np.int64)
    else:
        state.past_capacity.append((index, tuple(int(value) for value in row)))


def _check_source_count(sources) -> None:
    if len(sources) > MAX_REAL_KV_SOURCES:
        raise ValueError(
            f"kv-canary: at most {MAX_REAL_KV_SOURCES} RealKvSource entries supported by the "
            f"CUDA ABI, got {len(sources)}"
        )


def _check_canary_buf(canary_buf: np.ndarray) -> int:
    if canary_buf.dtype != np.uint8 or canary_buf.ndim != 2:
        raise ValueError(
            f"kv-canary: context.canary_buf must be uint8 [num_slots, slot_stride_bytes], "
            f"got {canary_buf.dtype} {canary_buf.shape}"
        )
    slot_stride_bytes = canary_buf.shape[1]
    if slot_stride_bytes < CANARY_SLOT_BYTES or slot_stride_bytes % _FIELD_BYTES:
        raise ValueError(
            f"kv-canary: context.canary_buf slot stride must be >= {CANARY_SLOT_BYTES} bytes "
            f"and a multiple of {_FIELD_BYTES}, got {slot_stride_bytes}"
        )
    num_slots: int = canary_buf.shape[0]
    return num_slots


def _check_slot_index(slot: int, num_slots: int, name: str, *, skip: bool = False) -> None:
    """Raise for a slot outside the canary buffer; ``skip`` lets negative slots through."""
    if skip and slot < 0:
        return
    if not 0 <= slot < num_slots:
        raise IndexError(
            f"kv-canary: {name} = {slot} is out of range for canary_buf with {num_slots} slots"
        )


def _int64_vector(values, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"kv-canary: {name} must be 1-D, got shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        raise ValueError(f"kv-canary: {name} must hold integers, got dtype {array.dtype}")
    return array.astype(np.int64)


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))
