"""canary_torch agrees bit for bit with canary (Triton, interpreted) and the reference,
and shares no code with canary: each implementation is called with its own types."""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import canary
import canary_torch
import canary_torch as tb
import reference
from canary_torch import _ops

KIND = int(canary.CanaryLaunchTag.SWEEP_V_SWA)
NUM_SLOTS = 32
SLOT_STRIDE_BYTES = 48  # bytes 32..47 of each slot belong to someone else
TAIL_BYTE = 0xAB

W_TOKEN = int(canary.FailReason.WRITE_TOKEN_MISMATCH)
W_POSITION = int(canary.FailReason.WRITE_POSITION_MISMATCH)

ALL_MODES = list(canary.RealKvHashMode)
READING_MODES = [canary.RealKvHashMode.PARTIAL, canary.RealKvHashMode.ALL]


# ---------------------------------------------------------------------------------------------
# layouts: every byte random in 1..255, so each slot's window is distinct and non-zero


def _random_bytes(tensor: torch.Tensor, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    raw = torch.randint(1, 256, (tensor.numel() * tensor.element_size(),), generator=generator)
    tensor.view(-1).view(torch.uint8).copy_(raw.to(torch.uint8))
    return tensor


def plain_layout(seed: int) -> canary.RealKvSource:
    """uint8 [8, 4 * 32]: 32 slots of 32 bytes, rows back to back."""
    tensor = _random_bytes(torch.empty(8, 4 * 32, dtype=torch.uint8), seed)
    return canary.RealKvSource(tensor=tensor, page_size=4, num_bytes_per_token=32, read_bytes=32)


def layer_view_layout(seed: int) -> canary.RealKvSource:
    """Layer 1 of a float16 [16, 3, 2 * 32 + 8] pool: row gaps, a 16-byte hole, read 32 of 64."""
    pool = _random_bytes(torch.empty(16, 3, 2 * 32 + 8, dtype=torch.float16), seed)
    return canary.RealKvSource(
        tensor=pool[:, 1], page_size=2, num_bytes_per_token=64, read_bytes=32
    )


def nd_rows_layout(seed: int) -> canary.RealKvSource:
    """bfloat16 [4, 8, 2, 8] rows at a 48-element storage offset: 32 slots of 32 bytes, read 16."""
    backing = _random_bytes(torch.empty(48 + 4 * 8 * 2 * 8 + 40, dtype=torch.bfloat16), seed)
    tensor = backing[48 : 48 + 4 * 8 * 2 * 8].view(4, 8, 2, 8)
    return canary.RealKvSource(tensor=tensor, page_size=8, num_bytes_per_token=32, read_bytes=16)


def gapped_int32_layout(seed: int) -> canary.RealKvSource:
    """int32 rows of 3 slots x 48 bytes, 16 gap bytes between rows, over 11 rows (33 slots)."""
    backing = _random_bytes(torch.empty(11 * 40 + 4, dtype=torch.int32), seed)
    tensor = torch.as_strided(backing, (11, 36), (40, 1), 4)
    return canary.RealKvSource(tensor=tensor, page_size=3, num_bytes_per_token=48, read_bytes=48)


LAYOUTS = {
    "plain": plain_layout,
    "layer_view": layer_view_layout,
    "nd_rows": nd_rows_layout,
    "gapped_int32": gapped_int32_layout,
}
SOURCE_SETS = {
    "plain": ["plain"],
    "layer_view": ["layer_view"],
    "nd_rows": ["nd_rows"],
    "gapped_int32": ["gapped_int32"],
    "two": ["layer_view", "plain"],
    "three": ["gapped_int32", "nd_rows", "layer_view"],
    "four": ["plain", "gapped_int32", "layer_view", "nd_rows"],
    "four_same_twice": ["nd_rows", "plain", "plain", "nd_rows"],
}


def make_sources(names: list[str]) -> tuple[canary.RealKvSource, ...]:
    return tuple(LAYOUTS[name](seed) for seed, name in enumerate(names))


def own(sources, impl=tb) -> tuple:
    """The same sources (the same tensors) as ``impl``'s own RealKvSource."""
    return tuple(
        impl.RealKvSource(
            tensor=s.tensor,
            page_size=s.page_size,
            num_bytes_per_token=s.num_bytes_per_token,
            read_bytes=s.read_bytes,
        )
        for s in sources
    )


def reference_source(source: canary.RealKvSource) -> reference.Source:
    """A numpy view of the very bytes the source's rows cover (live memory, never a copy)."""
    tensor = source.tensor
    storage = tensor.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    element_size = tensor.element_size()
    row_bytes = math.prod(tensor.shape[1:]) * element_size
    data = np.lib.stride_tricks.as_strided(
        flat.numpy()[tensor.storage_offset() * element_size :],
        shape=(tensor.shape[0], row_bytes),
        strides=(tensor.stride(0) * element_size, 1),
        writeable=False,
    )
    return reference.Source(data, source.page_size, source.num_bytes_per_token, source.read_bytes)


def min_capacity(sources) -> int:
    return min(source.capacity for source in sources)


# ---------------------------------------------------------------------------------------------
# fingerprint


def test_pinned_hash_values():
    """The torch hash primitives reproduce CONTRACT §2's pinned values."""
    inputs = [1, 0x9E3779B97F4A7C15, 0xFFFFFFFFFFFFFFFF, 0x8000000000000000, 0xC0FFEE1234567890]
    outputs = [
        0x5692161D100B05E5,
        0xE220A8397B1DCDAF,
        0xB4D055FCF2CBBD7B,
        0x25C26EA579CEA98A,
        0xDE7FAE23A9A1B716,
    ]
    got = _ops.splitmix64(torch.tensor([_ops.as_int64_bits(v) for v in inputs]))
    assert got.tolist() == [_ops.as_int64_bits(v) for v in outputs]
    one, two, three = (torch.tensor([v]) for v in (1, 2, 3))
    assert int(_ops.splitmix64_mix3(one, two, three)) == _ops.as_int64_bits(0xA55BDF37C08724B5)
    assert int(_ops.splitmix64_mix3(one, three, two)) == _ops.as_int64_bits(0xE2771370E2E9D965)


@pytest.mark.parametrize("set_name", list(SOURCE_SETS))
@pytest.mark.parametrize("mode", ALL_MODES, ids=lambda m: m.name)
def test_fingerprint_matches_canary_and_reference(set_name, mode):
    """fingerprint equals canary's and the oracle's on strided, N-D and multi-source layouts."""
    sources = make_sources(SOURCE_SETS[set_name])
    capacity = min_capacity(sources)
    generator = torch.Generator().manual_seed(len(set_name))
    slots = torch.cat([torch.randperm(capacity, generator=generator), torch.tensor([0, 5, 5])])
    got = tb.fingerprint(own(sources), slots, mode=mode)
    assert got.dtype == torch.int64 and got.device == slots.device
    assert torch.equal(got, canary.fingerprint(sources, slots, mode=mode))
    want = reference.fingerprint([reference_source(s) for s in sources], slots.numpy(), mode)
    np.testing.assert_array_equal(got.numpy(), want, strict=True, err_msg=set_name)
    if mode != canary.RealKvHashMode.NONE:
        assert torch.unique(got).numel() == capacity  # distinct bytes give distinct hashes


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8, torch.int64])
def test_fingerprint_slot_dtypes(dtype):
    """slot_indices of any integer dtype hash like their int64 values."""
    sources = own(make_sources(["plain"]))
    slots = torch.tensor([3, 0, 31, 7])
    assert torch.equal(tb.fingerprint(sources, slots.to(dtype)), tb.fingerprint(sources, slots))


def test_bytewise_gather_equals_word_gather():
    """The byte-assembling fallback (unaligned storage, big-endian hosts) reads the same words."""
    for name, make in LAYOUTS.items():
        (source,) = own([make(7)])
        slots = torch.arange(source.capacity)
        for read_bytes in (16, int(source.read_bytes)):
            words = _ops.read_words(source, slots, read_bytes, bytewise=False)
            assert torch.equal(words, _ops.read_words(source, slots, read_bytes, bytewise=True)), (
                name
            )


def test_fingerprint_follows_live_memory_and_ignores_unread_bytes():
    """A write into the pool changes the hash of its slot only; holes and gaps change nothing."""
    pool = _random_bytes(torch.empty(16, 3, 2 * 32 + 8, dtype=torch.float16), 3)
    source = tb.RealKvSource(tensor=pool[:, 1], page_size=2, num_bytes_per_token=64, read_bytes=32)
    slots = torch.arange(source.capacity)
    before = tb.fingerprint([source], slots)
    pool_bytes = pool.view(torch.uint8)  # [16, 3, 144]
    pool_bytes[:, 0] ^= 0x5A  # the layer before: a row gap
    pool_bytes[:, 1, 32:64] ^= 0x5A  # slot 2r's bytes past read_bytes
    pool_bytes[:, 1, 128:] ^= 0x5A  # the hole past page_size * num_bytes_per_token
    assert torch.equal(tb.fingerprint([source], slots), before)
    pool_bytes[5, 1, 64 + 17] ^= 0x01  # slot 11, word 2
    after = tb.fingerprint([source], slots)
    assert torch.nonzero(after != before).flatten().tolist() == [11]
    want = reference.fingerprint([reference_source(source)], slots.numpy())
    np.testing.assert_array_equal(after.numpy(), want, strict=True)


def _error(call):
    with pytest.raises(Exception) as caught:
        call()
    return type(caught.value), str(caught.value)


def named(message: str, words) -> bool:
    """Whether ``message`` names every one of ``words`` as a whole word or number."""
    return all(re.search(rf"(?<![\w.-]){re.escape(w)}(?![\w])", message) for w in words)


# case: (exception type, the exact message where the contract gives one, else the words it must name)
FINGERPRINT_ERRORS = {
    "five_sources": (
        ValueError,
        "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5",
    ),
    "other_device": (ValueError, ("real_kv_sources[1]", "meta", "cpu")),
    "slot_too_big": (IndexError, ("32", "real_kv_sources[0]")),
    "slot_negative": (IndexError, ("-1", "real_kv_sources[0]", "32")),
    "float_slots": (ValueError, ("slot_indices",)),
    "mode_3": (ValueError, ("mode", "3")),
}


@pytest.mark.parametrize("case", list(FINGERPRINT_ERRORS))
def test_fingerprint_errors_agree_with_canary(case):
    """Every launch-time check raises CONTRACT §4's exception type in both implementations, with
    the contract's exact message where it gives one, else naming what the contract says it names."""
    plain = make_sources(["plain"])[0]
    sources, slots, mode = [plain], torch.tensor([1, 2]), canary.RealKvHashMode.ALL
    if case == "five_sources":
        sources, slots = [plain] * 5, torch.zeros(0, dtype=torch.int64)
    elif case == "other_device":
        meta = canary.RealKvSource(
            tensor=torch.empty(8, 128, dtype=torch.uint8, device="meta"),
            page_size=4,
            num_bytes_per_token=32,
            read_bytes=32,
        )
        sources = [plain, meta]
    elif case == "slot_too_big":
        slots = torch.tensor([1, 32])
    elif case == "slot_negative":
        slots, mode = torch.tensor([-1]), canary.RealKvHashMode.PARTIAL
    elif case == "float_slots":
        slots = torch.tensor([1.0])
    elif case == "mode_3":
        mode = 3
    error, message = FINGERPRINT_ERRORS[case]
    for impl in (tb, canary):
        got_type, got_message = _error(
            lambda impl=impl: impl.fingerprint(own(sources, impl), slots, mode=mode)
        )
        assert got_type is error, (impl.__name__, got_type, got_message)
        if isinstance(message, str):
            assert got_message == message, impl.__name__
        else:
            assert named(got_message, message), (impl.__name__, got_message)


def test_mode_none_and_no_sources_read_nothing():
    """Mode NONE (even with out-of-range slots) and zero sources give zeros."""
    slots = torch.tensor([0, 999, -4])
    zeros = torch.zeros(3, dtype=torch.int64)
    assert torch.equal(
        tb.fingerprint(own(make_sources(["plain"])), slots, mode=tb.RealKvHashMode.NONE), zeros
    )
    for mode in ALL_MODES:
        assert torch.equal(tb.fingerprint([], slots, mode=mode), zeros)


# ---------------------------------------------------------------------------------------------
# write and verify: the same launches on three states, compared after each one


class Trio:
    """One canary_torch context, one canary context and one reference state, kept in step."""

    def __init__(self, *, sources, mode, position_assert, ring_capacity):
        def context(impl):
            buf = torch.zeros(NUM_SLOTS, SLOT_STRIDE_BYTES, dtype=torch.uint8)
            buf[:, 32:] = TAIL_BYTE
            return impl.VerifyOrWriteContext(
                canary_buf=buf,
                kernel_kind=impl.CanaryLaunchTag(KIND),
                violation_ring=torch.zeros(ring_capacity, 8, dtype=torch.int64),
                violation_write_index=torch.zeros(1, dtype=torch.int32),
                slot_run_counter=torch.zeros(1, dtype=torch.int64),
                kernel_run_counter=torch.zeros(1, dtype=torch.int64),
                real_kv_sources=own(sources, impl),
                real_kv_hash_mode=impl.RealKvHashMode(int(mode)),
                enable_chain_position_assert=torch.tensor(
                    [int(position_assert)], dtype=torch.int32
                ),
            )

        self.torch_context = context(tb)
        self.canary_context = context(canary)
        c = self.torch_context
        self.state = reference.CanaryState(
            canary_buf=c.canary_buf.numpy().copy(),
            kernel_kind=KIND,
            violation_ring=c.violation_ring.numpy().copy(),
            violation_write_index=c.violation_write_index.numpy().copy(),
            slot_run_counter=c.slot_run_counter.numpy().copy(),
            kernel_run_counter=c.kernel_run_counter.numpy().copy(),
            real_kv_sources=tuple(reference_source(s) for s in sources),
            real_kv_hash_mode=int(mode),
            enable_chain_position_assert=c.enable_chain_position_assert.numpy().copy(),
        )

    def write(self, requests, entries, *, expected=None, capacity=None, num_valid=None):
        """``requests``: [(seed, num_entries)]; ``entries``: [(slot, token, position)]."""
        capacity = len(requests) if capacity is None else capacity
        offsets = np.zeros(capacity + 1, dtype=np.int64)
        offsets[1 : len(requests) + 1] = np.cumsum([count for _, count in requests])
        offsets[len(requests) + 1 :] = offsets[len(requests)]
        seeds = np.full(capacity, -1, dtype=np.int64)
        seeds[: len(requests)] = [seed for seed, _ in requests]
        num_valid = len(requests) if num_valid is None else num_valid
        slots, tokens, positions = (np.array(column, dtype=np.int64) for column in zip(*entries))
        arrays = {"input_ids": tokens, "positions": positions, "out_cache_loc": slots}
        assert_on = expected is not None
        want = [np.array(column, dtype=np.int64) for column in expected] if assert_on else None
        reference.write(
            self.state,
            reference.WritePlan(offsets.copy(), seeds.copy(), np.array([num_valid], np.int32)),
            **arrays,
            enable_write_input_assert=assert_on,
            expected_input_tokens=want[0] if assert_on else None,
            expected_input_positions=want[1] if assert_on else None,
        )
        for impl, context in ((tb, self.torch_context), (canary, self.canary_context)):
            plan = impl.WritePlan(
                write_offsets=torch.from_numpy(offsets.copy()),
                write_seed_slot_indices=torch.from_numpy(seeds.copy()),
                write_num_valid_reqs=torch.tensor([num_valid], dtype=torch.int32),
            )
            impl.launch_canary_write_kernel(
                context=context,
                plan=plan,
                **{name: torch.from_numpy(array.copy()) for name, array in arrays.items()},
                enable_write_input_assert=assert_on,
                expected_input_tokens=torch.from_numpy(want[0]) if assert_on else None,
                expected_input_positions=torch.from_numpy(want[1]) if assert_on else None,
            )
        self.check()

    def verify(self, entries, *, check_token=True, capacity=None, num_valid=None, enable=1):
        """``entries``: [(slot, expected_token, expected_position, prev_slot)]."""
        capacity = max(len(entries), 1) if capacity is None else capacity
        columns = [np.zeros(capacity, dtype=np.int64) for _ in range(4)]
        columns[1][:] = -1
        for index, entry in enumerate(entries):
            for column, value in zip(columns, entry):
                column[index] = value
        num_valid = len(entries) if num_valid is None else num_valid
        scalars = (np.array([num_valid], np.int32), np.array([enable], np.int32))
        reference.verify(
            self.state,
            reference.VerifyPlan(*(c.copy() for c in columns), *(s.copy() for s in scalars)),
            check_verify_expected_token=check_token,
        )
        for impl, context in ((tb, self.torch_context), (canary, self.canary_context)):
            plan = impl.VerifyPlan(
                verify_slot_indices=torch.from_numpy(columns[0].copy()),
                verify_expected_tokens=torch.from_numpy(columns[1].copy()),
                verify_expected_positions=torch.from_numpy(columns[2].copy()),
                verify_prev_slot_indices=torch.from_numpy(columns[3].copy()),
                verify_num_valid=torch.from_numpy(scalars[0].copy()),
                enable=torch.from_numpy(scalars[1].copy()),
            )
            impl.launch_canary_verify_kernel(
                context=context, plan=plan, check_verify_expected_token=check_token
            )
        self.check()

    def corrupt_canary(self, slot: int, byte: int, mask: int) -> None:
        for buf in (self.torch_context.canary_buf, self.canary_context.canary_buf):
            buf[slot, byte] ^= mask
        self.state.canary_buf[slot, byte] ^= mask

    def stored_rows(self):
        """The stored ring rows of each implementation, as numpy arrays."""
        count = min(int(self.state.violation_write_index[0]), self.state.violation_ring.shape[0])
        return (
            self.torch_context.violation_ring.numpy()[:count],
            self.canary_context.violation_ring.numpy()[:count],
            self.state.violation_ring[:count],
        )

    def check(self) -> None:
        """canary_torch equals the oracle exactly (same plan order) and canary up to row order."""
        __tracebackhide__ = True
        mine = self.torch_context
        for name in (
            "canary_buf",
            "violation_ring",
            "violation_write_index",
            "slot_run_counter",
            "kernel_run_counter",
        ):
            np.testing.assert_array_equal(
                getattr(mine, name).numpy(), getattr(self.state, name), strict=True, err_msg=name
            )
            if name != "violation_ring":
                assert torch.equal(getattr(mine, name), getattr(self.canary_context, name)), name
        ours, theirs, _ = self.stored_rows()
        as_multiset = sorted(map(tuple, ours.tolist()))
        assert as_multiset == sorted(map(tuple, theirs.tolist())), "ring rows differ from canary"
        assert (mine.canary_buf[:, 32:] == TAIL_BYTE).all(), "bytes past 32 were touched"

    def new_rows(self, since: int) -> list[tuple[int, ...]]:
        return [tuple(row) for row in self.stored_rows()[0][since:].tolist()]


def _field(trio: Trio, slot: int, field: int) -> int:
    return int(trio.torch_context.canary_buf[slot, :32].view(torch.int64)[field])


def test_write_then_verify_with_corruptions():
    """Writes, asserts, corruptions and verifies agree with canary and the oracle step by step."""
    sources = make_sources(["layer_view", "gapped_int32"])
    trio = Trio(
        sources=sources, mode=canary.RealKvHashMode.ALL, position_assert=True, ring_capacity=32
    )
    # Request 0 from the anchor (a -1 slot inside is skipped); request 1 from the anchor
    # and through slot 0; request 2 is empty; request 3 is beyond num_valid.
    trio.write(
        [(-1, 4), (-1, 2), (-1, 0), (-1, 1)],
        [(3, 101, 0), (-1, 999, 77), (5, 102, 1), (7, 103, 2), (0, 201, 0), (9, 202, 1), (4, 9, 9)],
        capacity=5,
        num_valid=3,
    )
    assert _field(trio, 4, 0) == 0  # request 3 was beyond num_valid
    # Continue both chains with input and position asserts: request 0 skips position 4,
    # request 1's token differs from what was expected.
    trio.write(
        [(7, 2), (9, 1)],
        [(11, 104, 3), (12, 105, 5), (13, 203, 2)],
        expected=([104, 105, 999], [3, 5, 2]),
    )
    rows = trio.new_rows(0)
    assert sorted(row[1] for row in rows) == [12, 13]
    assert {row[7] for row in rows} == {W_POSITION, W_TOKEN}

    chain = [
        (3, 101, 0, -1),
        (0, 7, 7, 3),  # padding: counted, never checked
        (5, 102, 1, 3),
        (7, 103, 2, 5),
        (11, 104, 3, 7),
        (12, 105, 5, 11),
        (9, 202, 1, 0),  # chain unchecked
        (13, 203, 2, 9),
    ]
    trio.verify(chain)
    assert trio.new_rows(2) == []  # a clean chain verifies clean

    trio.corrupt_canary(5, 0, 0x10)  # slot 5's token
    trio.corrupt_canary(11, 16, 0x01)  # slot 11's prev hash
    trio.corrupt_canary(13, 8, 0x80)  # slot 13's position
    sources[0].tensor.view(torch.uint8)[4, 64 + 8] ^= 0x04  # slot 9's real KV (row 4, page 1)
    trio.verify(chain)
    bits = {row[1]: row[7] for row in trio.new_rows(2)}
    assert bits == {5: 32, 7: 1, 9: 4, 11: 1, 12: 1, 13: 2}
    trio.verify(chain, check_token=False)  # no token bit, expected token reported as -1
    trio.verify(chain, num_valid=100)  # clamped to the capacity
    trio.verify(chain, num_valid=-3)  # clamped to 0: counts nothing
    trio.verify([(999, 1, 1, 999)], enable=0)  # disabled: only kernel_run_counter moves
    trio.verify(chain, capacity=12, num_valid=12)  # four trailing padding entries


def test_position_assert_wraps_and_is_off_for_anchor_seeds():
    """The successor of 2**63 - 1 is -2**63; requests from the anchor are never position-checked."""
    trio = Trio(sources=(), mode=canary.RealKvHashMode.NONE, position_assert=True, ring_capacity=8)
    trio.write([(-1, 2)], [(1, 5, 2**63 - 1), (2, 6, 40)])
    assert trio.new_rows(0) == []
    trio.write([(1, 3)], [(3, 7, -(2**63)), (4, 8, -(2**63) + 1), (5, 9, 0)])
    assert [row[6] for row in trio.new_rows(0)] == [-(2**63) + 2]  # only slot 5 breaks it


def test_ring_is_fill_once_and_counts_past_capacity():
    """Rows beyond the ring's capacity are dropped, but the index keeps counting."""
    trio = Trio(
        sources=make_sources(["plain"]),
        mode=canary.RealKvHashMode.PARTIAL,
        position_assert=True,
        ring_capacity=3,
    )
    trio.write([(-1, 3)], [(1, 1, 0), (2, 2, 1), (3, 3, 2)])
    # Two rows for each entry: a wrong token and position, and a broken position chain.
    entries = [(slot, 50 + slot, 10 * slot) for slot in (4, 5, 6, 7)]
    trio.write([(3, 4)], entries, expected=([0, 0, 0, 0], [0, 0, 0, 0]))
    assert int(trio.torch_context.violation_write_index) == 8
    first_rows = trio.new_rows(0)
    assert [(row[1], row[7]) for row in first_rows] == [(4, 24), (4, 16), (5, 24)]
    trio.verify([(slot, 0, 0, -1) for slot in (1, 2, 3, 4)])
    assert int(trio.torch_context.violation_write_index) == 12
    assert trio.new_rows(0) == first_rows  # nothing stored is overwritten


EXPECTED_REQUIRED = (
    "kv-canary: expected input tensors are required when enable_write_input_assert=True"
)
EXPECTED_NONE = (
    "kv-canary: expected input tensors must be None when enable_write_input_assert=False"
)


class _LaunchCalls:
    """Write and verify launches of either implementation, each on an empty trio of its own."""

    def __init__(self) -> None:
        empty = dict(sources=(), mode=canary.RealKvHashMode.NONE, position_assert=False)
        self.trios = {impl: Trio(**empty, ring_capacity=2) for impl in (tb, canary)}
        self.tokens = torch.tensor([1, 2])

    def context(self, impl):
        """The context of ``impl``'s trio, as that implementation's own type."""
        trio = self.trios[impl]
        return trio.torch_context if impl is tb else trio.canary_context

    def write_plan(self, impl, offsets=(0, 2, 2), seeds=(-1, -1)):
        """A write plan of ``impl`` whose one valid request writes both tokens."""
        return impl.WritePlan(
            write_offsets=torch.tensor(offsets),
            write_seed_slot_indices=torch.tensor(seeds),
            write_num_valid_reqs=torch.tensor([1], dtype=torch.int32),
        )

    def verify_plan(self, impl, slots=None, prev=(0, 0, 0, 0), num_valid=2):
        """A verify plan of ``impl``: 4 entries (slot 0 unless given), ``num_valid`` valid."""
        return impl.VerifyPlan(
            verify_slot_indices=torch.zeros(4, dtype=torch.int64) if slots is None else slots,
            verify_expected_tokens=torch.full((4,), -1, dtype=torch.int64),
            verify_expected_positions=torch.zeros(4, dtype=torch.int64),
            verify_prev_slot_indices=torch.tensor(prev),
            verify_num_valid=torch.tensor([num_valid], dtype=torch.int32),
            enable=torch.ones(1, dtype=torch.int32),
        )

    def write(self, plan=None, **overrides):
        """A call that writes the two tokens with ``plan(impl)`` and the ``overrides``."""
        plan = self.write_plan if plan is None else plan

        def call(impl):
            arguments = dict(
                context=self.context(impl),
                plan=plan(impl),
                input_ids=self.tokens,
                positions=self.tokens,
                out_cache_loc=self.tokens,
                enable_write_input_assert=False,
                expected_input_tokens=None,
                expected_input_positions=None,
            )
            arguments.update(overrides)
            impl.launch_canary_write_kernel(**arguments)

        return call

    def verify(self, plan):
        """A call that launches a verify of the plan ``plan(impl)``, expected tokens checked."""
        return lambda impl: impl.launch_canary_verify_kernel(
            context=self.context(impl), plan=plan(impl), check_verify_expected_token=True
        )


def _launch_error_cases(calls: _LaunchCalls) -> list[tuple]:
    """``(call, exception type, exact message or the words it names)`` of each launch error."""
    tokens, write, verify, write_plan = calls.tokens, calls.write, calls.verify, calls.write_plan
    verify_plan = calls.verify_plan
    return [
        (write(enable_write_input_assert=True), ValueError, EXPECTED_REQUIRED),
        (write(expected_input_tokens=tokens), ValueError, EXPECTED_NONE),
        (
            write(out_cache_loc=torch.tensor([1, NUM_SLOTS])),
            IndexError,
            ("out_cache_loc", str(NUM_SLOTS)),
        ),
        (
            write(positions=torch.tensor([1, 0, 2, 0])[::2]),
            ValueError,
            "kv-canary: positions must be contiguous",
        ),
        (write(input_ids=torch.tensor([1.0, 2.0])), ValueError, ("input_ids", "torch.float32")),
        (write(plan=lambda impl: write_plan(impl, (0, 3, 0))), ValueError, ("plan.write_offsets",)),
        (
            verify(lambda impl: verify_plan(impl, prev=(NUM_SLOTS, 0, 0, 0), num_valid=1)),
            IndexError,
            ("plan.verify_prev_slot_indices", str(NUM_SLOTS)),
        ),
        (
            verify(lambda impl: verify_plan(impl, slots=torch.zeros(8, dtype=torch.int64)[::2])),
            ValueError,
            "kv-canary: plan.verify_slot_indices must be contiguous",
        ),
    ]


def test_launch_errors_agree_with_canary():
    """Argument errors of write and verify raise the same exception type in both implementations,
    the contract's exact message where it gives one, else naming the field and the values, and change
    no state."""
    calls = _LaunchCalls()
    for call, error, message in _launch_error_cases(calls):
        for impl in (tb, canary):
            got_type, got_message = _error(lambda call=call, impl=impl: call(impl))
            assert got_type is error, (impl.__name__, got_type, got_message)
            if isinstance(message, str):
                assert got_message == message, impl.__name__
            else:
                assert named(got_message, message), (impl.__name__, got_message)
    for impl in (tb, canary):  # a launch that raises changes nothing
        assert int(calls.context(impl).kernel_run_counter) == 0


def test_no_triton_kernel_is_launched(monkeypatch):
    """fingerprint, write and verify of canary_torch run with canary's Triton kernels unreachable."""
    from canary import _runtime

    def refuse(*args, **kwargs):
        raise AssertionError("canary_torch reached a Triton kernel")

    monkeypatch.setattr(_runtime, "_kernels", refuse)
    monkeypatch.setattr(_runtime, "kernels_for", refuse)
    sources = make_sources(["plain", "nd_rows"])
    tb.fingerprint(own(sources), torch.arange(32))
    context = Trio(
        sources=sources, mode=canary.RealKvHashMode.ALL, position_assert=True, ring_capacity=4
    ).torch_context
    plan = tb.WritePlan.allocate(write_req_capacity=1, device="cpu")
    plan.write_num_valid_reqs[0] = 1
    plan.write_offsets[1] = 3
    slots = torch.tensor([4, 5, 6])
    tb.launch_canary_write_kernel(
        context=context,
        plan=plan,
        input_ids=slots,
        positions=slots,
        out_cache_loc=slots,
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )
    verify_plan = tb.VerifyPlan.allocate(verify_capacity=3, device="cpu")
    verify_plan.verify_slot_indices.copy_(slots)
    verify_plan.verify_expected_tokens.copy_(slots)
    verify_plan.verify_expected_positions.copy_(slots)
    verify_plan.verify_prev_slot_indices.copy_(torch.tensor([-1, 4, 5]))
    verify_plan.verify_num_valid[0] = 3
    tb.launch_canary_verify_kernel(
        context=context, plan=verify_plan, check_verify_expected_token=True
    )
    assert int(context.violation_write_index) == 0
    assert int(context.slot_run_counter) == 6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm device")
def test_cuda_matches_cpu():
    """On a GPU, fingerprint and a write+verify give the CPU's results."""
    sources = make_sources(["gapped_int32", "layer_view", "nd_rows"])
    slots = torch.arange(min_capacity(sources))
    sources = own(sources)
    gpu_sources = [
        tb.RealKvSource(
            tensor=torch.empty_strided(
                s.tensor.shape, s.tensor.stride(), dtype=s.tensor.dtype, device="cuda"
            ).copy_(s.tensor),
            page_size=s.page_size,
            num_bytes_per_token=s.num_bytes_per_token,
            read_bytes=s.read_bytes,
        )
        for s in sources
    ]
    for mode in ALL_MODES:
        assert torch.equal(
            tb.fingerprint(gpu_sources, slots.cuda(), mode=mode).cpu(),
            tb.fingerprint(sources, slots, mode=mode),
        )
    results = []
    for device, srcs in (("cpu", sources), ("cuda", gpu_sources)):
        context = Trio(
            sources=(), mode=canary.RealKvHashMode.NONE, position_assert=True, ring_capacity=8
        ).torch_context
        context = tb.VerifyOrWriteContext(
            **{
                **{k: getattr(context, k) for k in context.__dataclass_fields__},
                **{
                    k: getattr(context, k).to(device)
                    for k in context.__dataclass_fields__
                    if isinstance(getattr(context, k), torch.Tensor)
                },
                "real_kv_sources": tuple(srcs),
                "real_kv_hash_mode": tb.RealKvHashMode.ALL,
            }
        )
        plan = tb.WritePlan.allocate(write_req_capacity=2, device=device)
        plan.write_num_valid_reqs.fill_(2)
        plan.write_offsets.copy_(torch.tensor([0, 3, 5]))
        loc = torch.tensor([1, 2, 3, 4, -1], device=device)
        tb.launch_canary_write_kernel(
            context=context,
            plan=plan,
            input_ids=loc + 10,
            positions=loc,
            out_cache_loc=loc,
            enable_write_input_assert=True,
            expected_input_tokens=loc,
            expected_input_positions=loc,
        )
        verify_plan = tb.VerifyPlan.allocate(verify_capacity=4, device=device)
        verify_plan.verify_slot_indices.copy_(torch.tensor([1, 2, 3, 4]))
        verify_plan.verify_prev_slot_indices.copy_(torch.tensor([-1, 1, 2, -1]))
        verify_plan.verify_num_valid.fill_(4)
        tb.launch_canary_verify_kernel(
            context=context, plan=verify_plan, check_verify_expected_token=False
        )
        results.append(
            [context.canary_buf.cpu(), context.violation_ring.cpu(), context.slot_run_counter.cpu()]
        )
    for cpu_tensor, gpu_tensor in zip(*results):
        assert torch.equal(cpu_tensor, gpu_tensor)


# ---------------------------------------------------------------------------------------------
# independence

CANARY_TORCH_DIR = Path(canary_torch.__file__).parent
CANARY_TORCH_MODULES = tuple(sorted(path.name for path in CANARY_TORCH_DIR.glob("*.py")))


def imports_of(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports written with their leading dots."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            found += [base] if node.module else [f".{alias.name}" for alias in node.names]
    return found


@pytest.mark.parametrize("name", CANARY_TORCH_MODULES)
def test_canary_torch_imports_nothing_of_canary(name):
    """canary_torch's modules import only each other, never canary or Triton: its validation,
    launch checks and types are its own, so CONTRACT §3, §4 and §8 are implemented twice."""
    own_modules = {"." + n.removesuffix(".py") for n in CANARY_TORCH_MODULES} | {"."}
    for module in imports_of(CANARY_TORCH_DIR / name):
        if module.startswith("."):
            assert module in own_modules, f"canary_torch/{name} imports {module}"
        else:
            assert module.split(".")[0] not in ("canary", "triton"), (
                f"canary_torch/{name} imports {module}"
            )


def test_importing_canary_torch_imports_neither_canary_nor_triton():
    """In a fresh interpreter, ``import canary_torch`` loads no module of canary or Triton."""
    probe = (
        "import sys, canary_torch\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('canary', 'triton')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout


def test_canary_torch_types_are_its_own():
    """canary_torch's public types are not canary's, and refuse canary's objects."""
    for name in ("RealKvSource", "VerifyOrWriteContext", "VerifyPlan", "WritePlan"):
        assert getattr(tb, name) is not getattr(canary, name), name
    for name in ("RealKvHashMode", "CanaryLaunchTag", "FailReason"):
        mine, theirs = getattr(tb, name), getattr(canary, name)
        assert mine is not theirs
        assert {m.name: m.value for m in mine} == {m.name: m.value for m in theirs}, name
    for name in ("CANARY_CHAIN_ANCHOR", "CANARY_SLOT_BYTES", "MAX_REAL_KV_SOURCES"):
        assert getattr(tb, name) == getattr(canary, name), name
    with pytest.raises(TypeError, match=r"real_kv_sources\[0\] must be a RealKvSource"):
        tb.fingerprint(make_sources(["plain"]), torch.tensor([1]))


@pytest.mark.parametrize(
    ("value", "bits"),
    [(0, 0), (2**63 - 1, 2**63 - 1), (2**63, -(2**63)), (2**64 - 1, -1), (-1, -1), (2**64, 0)],
)
def test_the_serial_walk_keeps_int64_bit_patterns(value, bits):
    """The serial chain walk's conversion from u64 to int64 bits, at both ends of the sign
    bit (a chain value of exactly 2**63 is as likely as any other)."""
    from canary_torch import _ops

    assert _ops.as_int64_bits(value) == bits
