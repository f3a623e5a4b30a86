"""The KV canary in plain torch: a second, independent implementation of the contract
(docs/CONTRACT.md).

It serves devices Triton has no backend for and is the fast path on the CPU, where ``canary``
runs its kernels in Triton's interpreter. It shares no code with ``canary``: its constants,
enums, ``RealKvSource`` and its validation, plans and launch checks are its own
(``canary_torch._contract``, written from docs/CONTRACT.md), and it hashes, addresses, chains
and reports with its own torch code (``canary_torch._ops``), and plans and scatters with its
own (``canary_torch._plan``, ``canary_torch._scatter``); nothing here launches a Triton
kernel. It is a package of its own: importing it imports neither ``canary`` nor Triton
(``tests/canary_torch/test_backend.py`` checks both).

Use it with the conformance suite as ``--canary-impl canary_torch``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch

from . import _ops as ops
from . import _plan, _scatter
from ._contract import (
    CANARY_CHAIN_ANCHOR,
    CANARY_FIELDS_PER_SLOT,
    CANARY_SLOT_BYTES,
    FIELD_POSITION,
    FIELD_PREV_HASH,
    FIELD_REAL_KV_HASH,
    FIELD_TOKEN,
    MAX_REAL_KV_SOURCES,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELDS,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
    RealKvSource,
    VerifyOrWriteContext,
    VerifyPlan,
    WritePlan,
    fingerprint_args,
    verify_launch,
    write_launch,
)
from ._plan import REQ_POOL_IDX_PADDING

__version__ = "0.1.0"

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "MAX_REAL_KV_SOURCES",
    "REQ_POOL_IDX_PADDING",
    "TOKEN_TO_KV_SLOT_PADDING",
    "VIOLATION_FIELDS",
    "CanaryLaunchTag",
    "FailReason",
    "RealKvHashMode",
    "RealKvSource",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "WritePlan",
    "fingerprint",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_scatter_req_token_ids_kernel",
]


_WRITE_TOKEN = int(FailReason.WRITE_TOKEN_MISMATCH)
_WRITE_POSITION = int(FailReason.WRITE_POSITION_MISMATCH)
_VERIFY_CHAIN = int(FailReason.VERIFY_CHAIN_HASH_MISMATCH)
_VERIFY_POSITION = int(FailReason.VERIFY_POSITION_MISMATCH)
_VERIFY_REAL_KV = int(FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
_VERIFY_TOKEN = int(FailReason.VERIFY_TOKEN_MISMATCH)


def fingerprint(
    sources: Sequence[RealKvSource],
    slot_indices: torch.Tensor,
    *,
    mode: RealKvHashMode | int = RealKvHashMode.ALL,
) -> torch.Tensor:
    """The real-KV hash of each slot in ``slot_indices``, as int64 on its device (CONTRACT §4).

    Each source's window is gathered for all slots at once and folded word by word, all
    slots in parallel. Mode NONE, or no sources, gives zeros and reads nothing.
    """
    sources, slots, mode = fingerprint_args(sources, slot_indices, mode)
    return ops.fingerprint_slots(sources, slots, mode)


def _fields(context: VerifyOrWriteContext) -> torch.Tensor:
    """The four int64 fields of every canary slot: a writable view ``[num_slots, 4]``."""
    return context.canary_buf.view(torch.int64)[:, :CANARY_FIELDS_PER_SLOT]


def _chain_after(fields: torch.Tensor) -> torch.Tensor:
    """The chain value that follows slots whose stored fields are ``fields`` ``[n, 4]``."""
    return ops.splitmix64_mix3(
        fields[:, FIELD_PREV_HASH], fields[:, FIELD_TOKEN], fields[:, FIELD_POSITION]
    )


def _violation_rows(kind: int, *columns: torch.Tensor) -> torch.Tensor:
    """Rows ``[n, 8]``: the kernel kind followed by seven int64 columns."""
    first = torch.full_like(columns[0], kind)
    return torch.stack([first, *columns], dim=1)


def launch_canary_verify_kernel(
    *, context: VerifyOrWriteContext, plan: VerifyPlan, check_verify_expected_token: bool
) -> None:
    """Verify the canary records named by ``plan``; violations go to the context's ring (CONTRACT §7).

    All entries are checked at once; rows reach the ring in plan order.
    """
    checked_launch = verify_launch(context, plan, check_verify_expected_token)
    mode, sources = checked_launch.context.mode, checked_launch.context.sources
    enabled, active = checked_launch.enabled, checked_launch.active
    slots = plan.verify_slot_indices
    # Slot 0 is the padding slot: counted below, but never checked, so its KV is never read.
    checked = torch.nonzero(slots[:active] != TOKEN_TO_KV_SLOT_PADDING).flatten()

    # Checks are over: from here on the launch only mutates state.
    context.kernel_run_counter.add_(1)
    if not enabled:
        return
    context.slot_run_counter.add_(active)
    if checked.numel() == 0:
        return

    fields = _fields(context)
    slot = slots[checked]
    prev = plan.verify_prev_slot_indices[checked]
    stored = fields[slot]
    stored_token = stored[:, FIELD_TOKEN]
    stored_pos = stored[:, FIELD_POSITION]
    stored_prev_hash = stored[:, FIELD_PREV_HASH]

    # prev < 0: the chain head, which follows the anchor; prev == 0: the chain is unchecked;
    # any other prev: the chain value that follows that slot's stored record.
    chain_checked = prev != 0
    expected_chain = _chain_after(fields[prev.clamp(min=0)])
    expected_chain = torch.where(prev < 0, ops.ANCHOR_HASH, expected_chain)
    expected_chain = torch.where(chain_checked, expected_chain, stored_prev_hash)

    bits = torch.where(chain_checked & (stored_prev_hash != expected_chain), _VERIFY_CHAIN, 0)
    if check_verify_expected_token:
        expected_token = plan.verify_expected_tokens[checked]
        token_wrong = (expected_token != -1) & (stored_token != expected_token)
        bits |= torch.where(token_wrong, _VERIFY_TOKEN, 0)
    else:
        expected_token = torch.full_like(slot, -1)
    expected_pos = plan.verify_expected_positions[checked]
    bits |= torch.where(stored_pos != expected_pos, _VERIFY_POSITION, 0)
    current_real_kv = ops.fingerprint_slots(sources, slot, mode)
    bits |= torch.where(stored[:, FIELD_REAL_KV_HASH] != current_real_kv, _VERIFY_REAL_KV, 0)

    rows = _violation_rows(
        int(context.kernel_kind),
        slot,
        stored_pos,
        stored_token,
        expected_token,
        stored_prev_hash,
        expected_chain,
        bits,
    )
    ops.append_violations(context.violation_ring, context.violation_write_index, rows[bits != 0])


def launch_canary_write_kernel(
    *,
    context: VerifyOrWriteContext,
    plan: WritePlan,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    out_cache_loc: torch.Tensor,
    enable_write_input_assert: bool,
    expected_input_tokens: torch.Tensor | None,
    expected_input_positions: torch.Tensor | None,
) -> None:
    """Write the canary records of ``plan``'s requests, continuing each chain (CONTRACT §6).

    Each request's chain is sequential, so the chain is walked one entry index at a time,
    every request at once (one step per entry of the longest request); fingerprints, asserts
    and stores are computed for all entries at once. Rows reach the ring in plan order.
    """
    checked = write_launch(
        context,
        plan,
        input_ids,
        positions,
        out_cache_loc,
        enable_write_input_assert,
        expected_input_tokens,
        expected_input_positions,
    )
    device, mode, sources = checked.context.device, checked.context.mode, checked.context.sources
    active, first, last = checked.active, checked.first, checked.last
    seeds, offsets, loc = plan.write_seed_slot_indices, plan.write_offsets, out_cache_loc

    # Checks are over: from here on the launch only mutates state.
    context.kernel_run_counter.add_(1)
    # Entries with a negative slot are skipped entirely: kept entries are all that matter.
    kept = torch.nonzero(loc[first:last] >= 0).flatten() + first  # ascending entry indices
    num_kept = kept.numel()
    if num_kept == 0:
        return
    slot = loc[kept].to(torch.int64)
    token = input_ids[kept].to(torch.int64)
    pos = positions[kept].to(torch.int64)
    real_kv = ops.fingerprint_slots(sources, slot, mode)
    request, first_kept, kept_per_request, is_request_head = _requests_of_kept(
        offsets, kept, active, device
    )

    fields = _fields(context)
    seeded, seed_fields, chain_start = _chain_starts(fields, seeds[:active])
    running = _walk_chains(chain_start, first_kept, kept_per_request, token, pos)

    written = (slot, pos, token, running)
    input_rows, input_failed = _input_assert_rows(
        context,
        written,
        kept,
        device,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    position_rows, position_failed = _position_assert_rows(
        context,
        written,
        input_rows,
        device,
        request=request,
        is_request_head=is_request_head,
        seeded=seeded,
        seed_fields=seed_fields,
    )

    fields[slot] = torch.stack([token, pos, running, real_kv], dim=1)
    context.slot_run_counter.add_(num_kept)

    # Plan order: by entry, an entry's input row before its position row.
    rows = torch.stack([input_rows, position_rows], dim=1).reshape(-1, VIOLATION_FIELDS)
    failed = torch.stack([input_failed, position_failed], dim=1).reshape(-1)
    ops.append_violations(context.violation_ring, context.violation_write_index, rows[failed])


def _requests_of_kept(
    offsets: torch.Tensor, kept: torch.Tensor, active: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For the ``kept`` entries (ascending) of a write plan's ``active`` requests: each one's
    request, each request's first kept entry and count of them, and which entries head one."""
    num_kept = kept.numel()
    # Request of each kept entry: the first request whose range ends after it (empty ranges
    # end where they start, so they never claim an entry).
    ends = offsets[1 : active + 1]
    request = torch.searchsorted(ends, kept, right=True)
    kept_per_request = torch.bincount(request, minlength=active)
    first_kept = torch.cumsum(kept_per_request, 0) - kept_per_request
    is_request_head = torch.arange(num_kept, device=device) == first_kept[request]
    return request, first_kept, kept_per_request, is_request_head


def _chain_starts(
    fields: torch.Tensor, request_seeds: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per request of a write with kept entries: whether it has a seed slot, that slot's
    stored fields (slot 0's for none) and the chain value its first entry continues."""
    seeded = request_seeds >= 0
    # A kept entry passed the bounds check, so slot 0 exists to stand in for anchor seeds.
    seed_fields = fields[request_seeds.clamp(min=0)]
    chain_start = torch.where(seeded, _chain_after(seed_fields), ops.ANCHOR_HASH)
    return seeded, seed_fields, chain_start


def _input_assert_rows(
    context: VerifyOrWriteContext,
    written: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    kept: torch.Tensor,
    device: torch.device,
    *,
    enable_write_input_assert: bool,
    expected_input_tokens: torch.Tensor | None,
    expected_input_positions: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The write input assert's row of each kept entry and whether it failed; ``written`` is
    ``(slot, pos, token, running)`` of the kept entries."""
    slot, pos, token, running = written
    num_kept = slot.numel()
    if enable_write_input_assert:
        # write_launch refused a None expected tensor when the assert is on
        want_token = cast(torch.Tensor, expected_input_tokens)[kept].to(torch.int64)
        want_pos = cast(torch.Tensor, expected_input_positions)[kept].to(torch.int64)
        input_bits = torch.where(token != want_token, _WRITE_TOKEN, 0)
        input_bits |= torch.where(pos != want_pos, _WRITE_POSITION, 0)
        input_rows = _violation_rows(
            int(context.kernel_kind), slot, pos, token, want_token, running, want_pos, input_bits
        )
        input_failed = input_bits != 0
    else:
        input_rows = torch.zeros((num_kept, VIOLATION_FIELDS), dtype=torch.int64, device=device)
        input_failed = torch.zeros(num_kept, dtype=torch.bool, device=device)
    return input_rows, input_failed


def _position_assert_rows(
    context: VerifyOrWriteContext,
    written: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    input_rows: torch.Tensor,
    device: torch.device,
    *,
    request: torch.Tensor,
    is_request_head: torch.Tensor,
    seeded: torch.Tensor,
    seed_fields: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain position assert's row of each kept entry and whether it failed (never without
    the assert, nor for the entries of an unseeded request); ``request`` is each entry's, and
    ``seeded`` and ``seed_fields`` each request's."""
    slot, pos, token, running = written
    num_kept = slot.numel()
    position_failed = torch.zeros(num_kept, dtype=torch.bool, device=device)
    position_rows = input_rows
    if int(context.enable_chain_position_assert.item()) != 0:
        # The predecessor of a request's first kept entry is its seed; of any other, the
        # previous kept entry of the same request. int64 addition wraps like the device's.
        prev_pos = torch.roll(pos, 1)
        prev_pos = torch.where(is_request_head, seed_fields[request, FIELD_POSITION], prev_pos)
        successor = prev_pos + 1
        position_failed = seeded[request] & (pos != successor)
        position_rows = _violation_rows(
            int(context.kernel_kind),
            slot,
            pos,
            token,
            token,
            running,
            successor,
            torch.full_like(slot, _WRITE_POSITION),
        )
    return position_rows, position_failed


def _walk_chains(
    chain_start: torch.Tensor,
    first_kept: torch.Tensor,
    kept_per_request: torch.Tensor,
    token: torch.Tensor,
    pos: torch.Tensor,
) -> torch.Tensor:
    """The chain value before each kept entry, requests advancing side by side.

    Step ``j`` handles the ``j``-th kept entry of every request that has one; requests are
    ordered longest first so that those still running are a prefix. Once a single request
    still runs (the tail of a long prefill, say), it is finished with Python integers: a
    tensor op per step would cost more than the step itself.
    """
    running = torch.empty_like(token)
    order = torch.argsort(kept_per_request, descending=True, stable=True)
    lengths = kept_per_request[order].tolist()
    starts = first_kept[order]
    chain = chain_start[order]
    still_running = len(lengths)
    for step in range(lengths[0] if lengths else 0):
        while lengths[still_running - 1] <= step:
            still_running -= 1
        if still_running <= _SERIAL_REQUESTS:
            _finish_serially(running, chain, starts, lengths, step, still_running, token, pos)
            break
        entries = starts[:still_running] + step
        current = chain[:still_running]
        running[entries] = current
        chain[:still_running] = ops.splitmix64_mix3(current, token[entries], pos[entries])
    return running


_SERIAL_REQUESTS = 1  # when only this many requests still run, they are walked one by one


def _finish_serially(running, chain, starts, lengths, step, still_running, token, pos) -> None:
    """Walk the remaining entries (from ``step`` on) of the first ``still_running`` requests."""
    tokens, positions = token.tolist(), pos.tolist()
    entries: list[int] = []
    values: list[int] = []
    for request in range(still_running):
        value = int(chain[request])
        start = int(starts[request])
        for k in range(step, lengths[request]):
            entry = start + k
            entries.append(entry)
            values.append(ops.as_int64_bits(value))
            value = ops.splitmix64_mix3_int(value, tokens[entry], positions[entry])
    index = torch.tensor(entries, dtype=torch.int64, device=running.device)
    running[index] = torch.tensor(values, dtype=torch.int64, device=running.device)


def launch_canary_plan_kernels(
    *,
    verify_plan_out: VerifyPlan,
    write_plan_out: WritePlan,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    req_to_token: torch.Tensor,
    swa_window_size: int,
    full_to_swa_index_mapping: torch.Tensor | None,
    verify_capacity: int,
    req_to_verify_expected_tokens: torch.Tensor | None,
    req_to_verify_expected_tokens_valid_lens: torch.Tensor | None,
    kv_token_id_vs_position_offset: int,
) -> None:
    """Fill both plans in place from an engine's batch (CONTRACT §12).

    Every check (P1 to P13) is made before anything is written; the verify entries of all
    rows are made at once, and are not written when they overflow the verify plan.
    """
    launch = _plan.plan_launch(
        verify_plan_out=verify_plan_out,
        write_plan_out=write_plan_out,
        req_pool_indices=req_pool_indices,
        prefix_lens=prefix_lens,
        extend_seq_lens=extend_seq_lens,
        req_to_token=req_to_token,
        swa_window_size=swa_window_size,
        full_to_swa_index_mapping=full_to_swa_index_mapping,
        verify_capacity=verify_capacity,
        req_to_verify_expected_tokens=req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=kv_token_id_vs_position_offset,
    )
    # Checks are over: from here on the launch only writes the plans.
    _plan.fill_plans(launch)


def launch_scatter_req_token_ids_kernel(
    *,
    flat_in: torch.Tensor,
    offsets: torch.Tensor,
    req_pool_indices: torch.Tensor,
    pool_out: torch.Tensor,
) -> None:
    """Copy each request's tokens into its row of the expected-token pool (CONTRACT §13).

    Every check (S1 to S11) is made before anything is written; then all tokens are stored
    at once, cut to their low 32 bits, those past a row's end dropped.
    """
    launch = _scatter.scatter_launch(
        flat_in=flat_in, offsets=offsets, req_pool_indices=req_pool_indices, pool_out=pool_out
    )
    _scatter.scatter(launch)
