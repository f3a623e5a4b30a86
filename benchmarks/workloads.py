"""Workloads of the benchmarks: KV pools laid out as engines lay them out, slot sets, and the
write/verify launches of decode batches, prefill chunks and long sweeps.

Everything is built from a seed, so a baseline and a candidate run measure the same bytes.
Batches are described as host numpy arrays once and turned into the arguments of a torch
implementation (``canary``, ``canary_torch``) or of the numpy ``reference``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

import reference

WORD_BYTES = 8
RECORD_BYTES = 32  # token, position, prev_hash, real_kv_hash of a canary slot
CHAIN_FIELDS_BYTES = 24  # token, position, prev_hash: what continuing a chain reads
PARTIAL_READ_BYTES = 16

# (layer, 0 for K / 1 for V) of the sources a run with 1..4 sources uses: K and V of one
# layer, then of another. Layer 1 comes first so that the first source starts at a non-zero
# offset into the pool, as every layer but the first does in an engine.
SOURCE_VIEWS = ((1, 0), (1, 1), (0, 0), (0, 1))


@dataclass(frozen=True)
class PoolLayout:
    """A paged KV pool ``[num_layers, num_pages, 2 (K, V), page_size, kv_heads, head_dim]``.

    A source is one layer's K (or V): ``pool[layer, :, kv]``. Its rows are pages and its row
    stride spans both the K and the V page, so every source is a strided view into the pool,
    read through its own stride, as an engine hands its per-layer buffers to the canary.
    """

    num_pages: int
    page_size: int = 16
    kv_heads: int = 2
    head_dim: int = 128
    num_layers: int = 2
    dtype: torch.dtype = torch.bfloat16

    @property
    def bytes_per_token(self) -> int:
        return self.kv_heads * self.head_dim * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def capacity(self) -> int:
        """Slots per source: ``num_pages * page_size``."""
        return self.num_pages * self.page_size

    @property
    def pool_bytes(self) -> int:
        return self.num_layers * 2 * self.capacity * self.bytes_per_token


def make_pool(layout: PoolLayout, device, *, seed: int = 0) -> torch.Tensor:
    """The pool tensor, every byte random (zeros would hash to zero and hide nothing)."""
    shape = (
        layout.num_layers,
        layout.num_pages,
        2,
        layout.page_size,
        layout.kv_heads,
        layout.head_dim,
    )
    pool = torch.empty(shape, dtype=layout.dtype, device=device)
    generator = torch.Generator(device=pool.device).manual_seed(seed)
    pool.view(torch.uint8).random_(0, 256, generator=generator)
    return pool


def kv_sources(impl, pool: torch.Tensor, layout: PoolLayout, num_sources: int, read_bytes: int):
    """``num_sources`` (1..4) ``impl.RealKvSource`` views of ``pool``, in ``SOURCE_VIEWS`` order."""
    if not 1 <= num_sources <= len(SOURCE_VIEWS):
        raise ValueError(f"num_sources must be in 1..{len(SOURCE_VIEWS)}, got {num_sources}")
    return tuple(
        impl.RealKvSource(
            tensor=pool[layer, :, kv],
            page_size=layout.page_size,
            num_bytes_per_token=layout.bytes_per_token,
            read_bytes=read_bytes,
        )
        for layer, kv in SOURCE_VIEWS[:num_sources]
    )


def reference_sources(sources) -> tuple[reference.Source, ...]:
    """numpy views of the very bytes the (CPU) sources' rows cover: live memory, not copies."""
    twins = []
    for source in sources:
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
        twins.append(
            reference.Source(data, source.page_size, source.num_bytes_per_token, source.read_bytes)
        )
    return tuple(twins)


def read_bytes_per_source(sources, mode) -> list[int]:
    """Bytes each source's window holds in ``mode`` (16 in PARTIAL, ``read_bytes`` in ALL)."""
    mode = int(mode)
    if mode == int(reference.RealKvHashMode.NONE):
        return [0 for _ in sources]
    if mode == int(reference.RealKvHashMode.PARTIAL):
        return [PARTIAL_READ_BYTES for _ in sources]
    return [int(source.read_bytes) for source in sources]


def page_scattered_slots(num_slots: int, layout: PoolLayout, *, seed: int) -> np.ndarray:
    """``num_slots`` slots filling whole pages picked at random, in page order, as int64.

    This is what a sweep over live requests looks like: consecutive slots inside a page,
    pages scattered over the pool. Page 0 (whose slot 0 is the padding slot) is never used.
    """
    pages_needed = -(-num_slots // layout.page_size)
    if pages_needed > layout.num_pages - 1:
        raise ValueError(f"{num_slots} slots need {pages_needed} pages; the pool has fewer")
    rng = np.random.default_rng(seed)
    pages = rng.permutation(layout.num_pages - 1)[:pages_needed] + 1
    in_page = np.arange(layout.page_size, dtype=np.int64)
    slots = (pages[:, None].astype(np.int64) * layout.page_size + in_page[None, :]).reshape(-1)
    return slots[:num_slots]


# ---------------------------------------------------------------------------------------------
# the pure-Python fold: one slot at a time, as a hash is computed without vectorisation

_U64 = (1 << 64) - 1


def _python_splitmix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _U64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def per_slot_fingerprint(
    sources: Sequence[reference.Source], slots: Iterable[int], read_bytes: Sequence[int]
) -> list[int]:
    """CONTRACT §4's hash of each slot as a u64 Python int, one slot and one word at a time."""
    hashes = []
    for slot in slots:
        combined = 0
        for source, window_bytes in zip(sources, read_bytes):
            row, in_page = divmod(slot, source.page_size)
            start = in_page * source.num_bytes_per_token
            window = source.data[row, start : start + window_bytes].tobytes()
            acc = 0
            for offset in range(0, window_bytes, WORD_BYTES):
                word = int.from_bytes(window[offset : offset + WORD_BYTES], "little")
                acc = _python_splitmix64(acc ^ word)
            combined = _python_splitmix64(combined ^ acc)
        hashes.append(combined)
    return hashes


# ---------------------------------------------------------------------------------------------
# write and verify batches


@dataclass(frozen=True)
class WriteBatch:
    """One write launch, as host arrays (CONTRACT §6): requests, their seeds and their entries."""

    offsets: np.ndarray  # int64 [num_requests + 1]: entry range of each request
    seeds: np.ndarray  # int64 [num_requests]: slot each chain continues, -1 = anchor
    slots: np.ndarray  # int64 [num_entries]: out_cache_loc
    tokens: np.ndarray  # int64 [num_entries]
    positions: np.ndarray  # int64 [num_entries]

    @property
    def num_requests(self) -> int:
        return self.seeds.shape[0]

    @property
    def num_entries(self) -> int:
        return self.slots.shape[0]


@dataclass(frozen=True)
class VerifyBatch:
    """One verify launch, as host arrays (CONTRACT §7)."""

    slots: np.ndarray  # int64 [num_entries]
    expected_tokens: np.ndarray  # int64 [num_entries]
    expected_positions: np.ndarray  # int64 [num_entries]
    prev_slots: np.ndarray  # int64 [num_entries]: -1 = chain head, else predecessor slot

    @property
    def num_entries(self) -> int:
        return self.slots.shape[0]


@dataclass(frozen=True)
class Scenario:
    """A launch an engine runs: the records it starts from, its write and its verify.

    ``setup`` writes the records that ``write`` continues (each request's last prefix
    token); ``verify`` checks what ``write`` (or, without one, ``setup``) wrote. Replaying
    ``write`` stores the same records again, so every timed round does the same work.
    """

    name: str
    setup: WriteBatch
    write: WriteBatch | None
    verify: VerifyBatch

    @property
    def max_slot(self) -> int:
        batches = [self.setup.slots, self.verify.slots]
        if self.write is not None:
            batches.append(self.write.slots)
        return int(max(batch.max() for batch in batches))


class _PageAllocator:
    """Hands out the pool's pages in a random order, page 0 (the padding slot's) never."""

    def __init__(self, layout: PoolLayout, rng: np.random.Generator):
        self._pages = rng.permutation(layout.num_pages - 1) + 1
        self._next = 0
        self._page_size = layout.page_size

    def sequence_slots(self, first_position: int, count: int) -> np.ndarray:
        """Slots of positions ``first_position .. +count`` of a fresh request's page table."""
        first_page = first_position // self._page_size
        last_page = (first_position + count - 1) // self._page_size
        needed = last_page - first_page + 1
        if self._next + needed > self._pages.shape[0]:
            raise ValueError("the pool has too few pages for this scenario")
        table = self._pages[self._next : self._next + needed].astype(np.int64)
        self._next += needed
        positions = np.arange(first_position, first_position + count, dtype=np.int64)
        return table[positions // self._page_size - first_page] * self._page_size + (
            positions % self._page_size
        )


def _batch(per_request: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> WriteBatch:
    """A write batch from ``(seed, slots, tokens, positions)`` per request."""
    lengths = [len(slots) for _, slots, _, _ in per_request]
    return WriteBatch(
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        seeds=np.array([seed for seed, _, _, _ in per_request], dtype=np.int64),
        slots=np.concatenate([slots for _, slots, _, _ in per_request]).astype(np.int64),
        tokens=np.concatenate([tokens for _, _, tokens, _ in per_request]).astype(np.int64),
        positions=np.concatenate([pos for _, _, _, pos in per_request]).astype(np.int64),
    )


def continuation(
    name: str,
    layout: PoolLayout,
    *,
    num_requests: int,
    new_tokens: int,
    min_prefix: int,
    max_prefix: int,
    seed: int,
) -> Scenario:
    """``num_requests`` requests with a prefix of ``min_prefix..max_prefix`` tokens already
    cached, each adding ``new_tokens`` tokens that continue its chain from the prefix's last
    token: a decode batch (``new_tokens=1``) or a prefill chunk.
    """
    rng = np.random.default_rng(seed)
    pages = _PageAllocator(layout, rng)
    setup, write, verify = [], [], []
    for _ in range(num_requests):
        prefix = int(rng.integers(min_prefix, max_prefix + 1))
        slots = pages.sequence_slots(prefix - 1, new_tokens + 1)
        positions = np.arange(prefix - 1, prefix + new_tokens, dtype=np.int64)
        tokens = rng.integers(0, 256_000, size=new_tokens + 1, dtype=np.int64)
        setup.append((-1, slots[:1], tokens[:1], positions[:1]))
        write.append((int(slots[0]), slots[1:], tokens[1:], positions[1:]))
        verify.append((slots[1:], tokens[1:], positions[1:], slots[:-1]))
    return Scenario(
        name=name,
        setup=_batch(setup),
        write=_batch(write),
        verify=VerifyBatch(*(np.concatenate(column) for column in zip(*verify))),
    )


def sweep(name: str, layout: PoolLayout, *, num_requests: int, length: int, seed: int) -> Scenario:
    """``num_requests`` sequences of ``length`` tokens from position 0, all checked at once:
    a periodic sweep over the cached contexts. There is no timed write."""
    rng = np.random.default_rng(seed)
    pages = _PageAllocator(layout, rng)
    setup, verify = [], []
    for _ in range(num_requests):
        slots = pages.sequence_slots(0, length)
        positions = np.arange(length, dtype=np.int64)
        tokens = rng.integers(0, 256_000, size=length, dtype=np.int64)
        setup.append((-1, slots, tokens, positions))
        prev = np.concatenate([[-1], slots[:-1]]).astype(np.int64)
        verify.append((slots, tokens, positions, prev))
    return Scenario(
        name=name,
        setup=_batch(setup),
        write=None,
        verify=VerifyBatch(*(np.concatenate(column) for column in zip(*verify))),
    )


def decode(layout: PoolLayout, num_requests: int, *, seed: int = 0) -> Scenario:
    """A decode step: one token per request, prefixes of 1K..32K tokens."""
    return continuation(
        f"decode-{num_requests}",
        layout,
        num_requests=num_requests,
        new_tokens=1,
        min_prefix=1024,
        max_prefix=32768,
        seed=seed,
    )


def prefill(layout: PoolLayout, num_requests: int, chunk_tokens: int, *, seed: int = 0):
    """A prefill chunk of ``num_requests * chunk_tokens`` tokens continuing earlier chunks."""
    return continuation(
        f"prefill-{num_requests}x{chunk_tokens}",
        layout,
        num_requests=num_requests,
        new_tokens=chunk_tokens,
        min_prefix=1,
        max_prefix=16384,
        seed=seed,
    )


# ---------------------------------------------------------------------------------------------
# torch implementations (canary, canary_torch) and the numpy reference


def make_context(impl, sources, mode, *, num_slots: int, device, ring_capacity: int = 1024):
    """A fresh ``impl.VerifyOrWriteContext``: empty canary buffer and ring, chain assert on."""
    return impl.VerifyOrWriteContext(
        canary_buf=torch.zeros((num_slots, RECORD_BYTES), dtype=torch.uint8, device=device),
        kernel_kind=impl.CanaryLaunchTag.HEAD_K_FULL,
        violation_ring=torch.zeros((ring_capacity, 8), dtype=torch.int64, device=device),
        violation_write_index=torch.zeros(1, dtype=torch.int32, device=device),
        slot_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64, device=device),
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=impl.RealKvHashMode(int(mode)),
        enable_chain_position_assert=torch.ones(1, dtype=torch.int32, device=device),
    )


def write_arguments(impl, batch: WriteBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_write_kernel`` (all but the context)."""
    plan = impl.WritePlan.allocate(write_req_capacity=max(1, batch.num_requests), device=device)
    plan.write_offsets.copy_(torch.from_numpy(batch.offsets))
    plan.write_seed_slot_indices.copy_(torch.from_numpy(batch.seeds))
    plan.write_num_valid_reqs.fill_(batch.num_requests)
    return dict(
        plan=plan,
        input_ids=torch.from_numpy(batch.tokens).to(device),
        positions=torch.from_numpy(batch.positions).to(device),
        out_cache_loc=torch.from_numpy(batch.slots).to(device),
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )


def verify_arguments(impl, batch: VerifyBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_verify_kernel`` (all but the context)."""
    plan = impl.VerifyPlan.allocate(verify_capacity=max(1, batch.num_entries), device=device)
    plan.verify_slot_indices.copy_(torch.from_numpy(batch.slots))
    plan.verify_expected_tokens.copy_(torch.from_numpy(batch.expected_tokens))
    plan.verify_expected_positions.copy_(torch.from_numpy(batch.expected_positions))
    plan.verify_prev_slot_indices.copy_(torch.from_numpy(batch.prev_slots))
    plan.verify_num_valid.fill_(batch.num_entries)
    return dict(plan=plan, check_verify_expected_token=True)


def reference_state(sources, mode, *, num_slots: int, ring_capacity: int = 1024):
    """The numpy twin of :func:`make_context` over ``reference.Source`` sources."""
    return reference.CanaryState.allocate(
        num_slots=num_slots,
        ring_capacity=ring_capacity,
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=int(mode),
        enable_chain_position_assert=True,
    )


def reference_write_arguments(batch: WriteBatch) -> tuple[reference.WritePlan, dict]:
    plan = reference.WritePlan.allocate(write_req_capacity=max(1, batch.num_requests))
    plan.write_offsets[:] = batch.offsets
    plan.write_seed_slot_indices[:] = batch.seeds
    plan.write_num_valid_reqs[:] = batch.num_requests
    return plan, dict(
        input_ids=batch.tokens,
        positions=batch.positions,
        out_cache_loc=batch.slots,
        enable_write_input_assert=False,
        expected_input_tokens=None,
        expected_input_positions=None,
    )


def reference_verify_plan(batch: VerifyBatch) -> reference.VerifyPlan:
    plan = reference.VerifyPlan.allocate(verify_capacity=max(1, batch.num_entries))
    plan.verify_slot_indices[:] = batch.slots
    plan.verify_expected_tokens[:] = batch.expected_tokens
    plan.verify_expected_positions[:] = batch.expected_positions
    plan.verify_prev_slot_indices[:] = batch.prev_slots
    plan.verify_num_valid[:] = batch.num_entries
    return plan


# ---------------------------------------------------------------------------------------------
# bytes each launch must read: the numerator of every bandwidth figure


def fingerprint_bytes_read(num_slots: int, window_bytes: Sequence[int]) -> int:
    """Every source's window of every slot: the bytes hashed (slot indices not counted)."""
    return num_slots * sum(window_bytes)


def write_bytes_read(batch: WriteBatch, window_bytes: Sequence[int]) -> int:
    """Offsets, seeds and the seed records' chain fields per request; slot, token, position
    and the KV windows per entry (input assert off: no expected arrays)."""
    per_request = 2 * WORD_BYTES + CHAIN_FIELDS_BYTES
    per_entry = 3 * WORD_BYTES + sum(window_bytes)
    return WORD_BYTES + batch.num_requests * per_request + batch.num_entries * per_entry


def verify_bytes_read(batch: VerifyBatch, window_bytes: Sequence[int]) -> int:
    """Plan columns, the stored record and the KV windows per checked entry, plus the chain
    fields of each predecessor slot (expected tokens checked)."""
    checked = batch.slots != 0
    with_prev = checked & (batch.prev_slots > 0)
    per_entry = 4 * WORD_BYTES + RECORD_BYTES + sum(window_bytes)
    return int(checked.sum()) * per_entry + int(with_prev.sum()) * CHAIN_FIELDS_BYTES


def engine_scenarios(*, sweep_requests: int, sweep_length: int) -> dict:
    """The write/verify scenarios of the kind engines run, by name: decode batches of 1, 64
    and 1024 requests, prefill chunks of 4096 tokens (1 x 4096, 8 x 512), and one sweep of
    ``sweep_requests`` x ``sweep_length`` entries (verify only)."""
    name = f"sweep-{sweep_requests}x{sweep_length}"
    return {
        "decode-1": lambda layout: decode(layout, 1, seed=1),
        "decode-64": lambda layout: decode(layout, 64, seed=2),
        "decode-1024": lambda layout: decode(layout, 1024, seed=3),
        "prefill-1x4096": lambda layout: prefill(layout, 1, 4096, seed=4),
        "prefill-8x512": lambda layout: prefill(layout, 8, 512, seed=5),
        name: lambda layout: sweep(
            name, layout, num_requests=sweep_requests, length=sweep_length, seed=6
        ),
    }


def scale_scenarios() -> dict:
    """The launches of the suite's engine-scale tests, by name: a prefill of one request of
    8192 tokens and a sweep of 33 sequences of 1000 tokens (33,000 entries, verify only).
    Seeds follow :func:`engine_scenarios`' so no two scenarios share one."""
    return {
        "prefill-1x8192": lambda layout: prefill(layout, 1, 8192, seed=7),
        "sweep-33x1000": lambda layout: sweep(
            "sweep-33x1000", layout, num_requests=33, length=1000, seed=8
        ),
    }
