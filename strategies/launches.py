"""Write/verify worlds and plans made real (temporary home; joins strategies.materialize)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

import reference
from strategies.chains import CanaryWorld, Corruption, VerifyBatch, WriteBatch
from strategies.materialize import MaterializedSource, materialize

# ---------------------------------------------------------------------------------------
# Write/verify worlds and plans (strategies.chains) made real.


@dataclass
class MaterializedWorld:
    """A :class:`strategies.chains.CanaryWorld` made real on a device.

    Tensors follow SPEC §5: ``canary_buf`` uint8 ``[num_slots, slot_stride_bytes]``,
    ``violation_ring`` int64 ``[ring_capacity, 8]``, ``violation_write_index`` int32 ``[1]``,
    the two run counters int64 ``[1]``, ``enable_chain_position_assert`` int32 ``[1]``. Their
    first contents are random and non-zero (the write index is the world's ``ring_start``).
    """

    world: CanaryWorld
    sources: tuple[MaterializedSource, ...]
    canary_buf: torch.Tensor
    violation_ring: torch.Tensor
    violation_write_index: torch.Tensor
    slot_run_counter: torch.Tensor
    kernel_run_counter: torch.Tensor
    enable_chain_position_assert: torch.Tensor

    def context(self, impl):
        """``impl.VerifyOrWriteContext`` over these tensors, with sources built by ``impl``."""
        return impl.VerifyOrWriteContext(
            canary_buf=self.canary_buf,
            kernel_kind=impl.CanaryLaunchTag(self.world.kernel_kind),
            violation_ring=self.violation_ring,
            violation_write_index=self.violation_write_index,
            slot_run_counter=self.slot_run_counter,
            kernel_run_counter=self.kernel_run_counter,
            real_kv_sources=tuple(m.build(impl) for m in self.sources),
            real_kv_hash_mode=impl.RealKvHashMode(self.world.mode),
            enable_chain_position_assert=self.enable_chain_position_assert,
        )

    def reference_state(self) -> reference.CanaryState:
        """A numpy ``reference.CanaryState`` holding host copies of everything, taken now."""
        return reference.CanaryState(
            canary_buf=_host(self.canary_buf),
            kernel_kind=self.world.kernel_kind,
            violation_ring=_host(self.violation_ring),
            violation_write_index=_host(self.violation_write_index),
            slot_run_counter=_host(self.slot_run_counter),
            kernel_run_counter=_host(self.kernel_run_counter),
            real_kv_sources=tuple(m.reference_source() for m in self.sources),
            real_kv_hash_mode=self.world.mode,
            enable_chain_position_assert=_host(self.enable_chain_position_assert),
        )

    def records(self) -> np.ndarray:
        """The four int64 fields of every slot, ``[num_slots, 4]``, from the buffer as it is now."""
        return np.ascontiguousarray(_host(self.canary_buf)[:, :32]).view("<i8").reshape(-1, 4)


def _host(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def materialize_world(world: CanaryWorld, device) -> MaterializedWorld:
    """Allocate and fill everything ``world`` describes on ``device``."""
    rng = np.random.default_rng(world.seed)
    sources = tuple(materialize(layout, device) for layout in world.sources)
    buf = rng.integers(1, 256, (world.num_slots, world.slot_stride_bytes), dtype=np.uint8)
    ring = rng.integers(1, 2**62, (world.ring_capacity, 8), dtype=np.int64)

    def tensor(array, dtype):
        return torch.tensor(np.asarray(array), dtype=dtype, device=device)

    return MaterializedWorld(
        world=world,
        sources=sources,
        canary_buf=tensor(buf, torch.uint8),
        violation_ring=tensor(ring, torch.int64).reshape(world.ring_capacity, 8),
        violation_write_index=tensor([world.ring_start], torch.int32),
        slot_run_counter=tensor([rng.integers(0, 1000)], torch.int64),
        kernel_run_counter=tensor([rng.integers(0, 1000)], torch.int64),
        enable_chain_position_assert=tensor([world.chain_assert], torch.int32),
    )


def write_launch(impl, batch: WriteBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_write_kernel`` for ``batch`` (all but ``context``)."""
    ids, positions, slots = batch.token_arrays()
    plan = impl.WritePlan.allocate(write_req_capacity=batch.capacity, device=device)
    plan.write_offsets.copy_(torch.tensor(batch.offsets(), dtype=torch.int64))
    plan.write_seed_slot_indices.copy_(
        torch.tensor([r.seed for r in batch.requests], dtype=torch.int64)
    )
    plan.write_num_valid_reqs.fill_(batch.num_valid)

    def column(values):
        return torch.tensor(values, dtype=torch.int64, device=device)

    return dict(
        plan=plan,
        input_ids=column(ids),
        positions=column(positions),
        out_cache_loc=column(slots),
        enable_write_input_assert=batch.input_assert,
        expected_input_tokens=column(batch.expected_tokens) if batch.input_assert else None,
        expected_input_positions=column(batch.expected_positions) if batch.input_assert else None,
    )


def reference_write_launch(batch: WriteBatch) -> dict:
    """The numpy twin of :func:`write_launch`, for ``reference.write``."""
    ids, positions, slots = batch.token_arrays()
    plan = reference.WritePlan(
        write_offsets=np.asarray(batch.offsets(), dtype=np.int64),
        write_seed_slot_indices=np.asarray([r.seed for r in batch.requests], dtype=np.int64),
        write_num_valid_reqs=np.asarray([batch.num_valid], dtype=np.int32),
    )

    def column(values):
        return np.asarray(values, dtype=np.int64).reshape(-1)

    return dict(
        plan=plan,
        input_ids=column(ids),
        positions=column(positions),
        out_cache_loc=column(slots),
        enable_write_input_assert=batch.input_assert,
        expected_input_tokens=column(batch.expected_tokens) if batch.input_assert else None,
        expected_input_positions=column(batch.expected_positions) if batch.input_assert else None,
    )


def verify_launch(impl, batch: VerifyBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_verify_kernel`` for ``batch`` (all but ``context``)."""
    plan = impl.VerifyPlan.allocate(verify_capacity=batch.capacity, device=device)
    for name, values in (
        ("verify_slot_indices", batch.slots),
        ("verify_expected_tokens", batch.expected_tokens),
        ("verify_expected_positions", batch.expected_positions),
        ("verify_prev_slot_indices", batch.prev_slots),
    ):
        getattr(plan, name).copy_(torch.tensor(values, dtype=torch.int64))
    plan.verify_num_valid.fill_(batch.num_valid)
    plan.enable.fill_(batch.enable)
    return dict(plan=plan, check_verify_expected_token=batch.check_token)


def reference_verify_launch(batch: VerifyBatch) -> dict:
    """The numpy twin of :func:`verify_launch`, for ``reference.verify``."""

    def column(values):
        return np.asarray(values, dtype=np.int64).reshape(-1)

    plan = reference.VerifyPlan(
        verify_slot_indices=column(batch.slots),
        verify_expected_tokens=column(batch.expected_tokens),
        verify_expected_positions=column(batch.expected_positions),
        verify_prev_slot_indices=column(batch.prev_slots),
        verify_num_valid=np.asarray([batch.num_valid], dtype=np.int32),
        enable=np.asarray([batch.enable], dtype=np.int32),
    )
    return dict(plan=plan, check_verify_expected_token=batch.check_token)


def apply_corruption(world: MaterializedWorld, corruption: Corruption) -> None:
    """Make ``corruption`` happen to ``world``'s live tensors."""
    kind = corruption.kind
    if kind == "field":
        fields = world.canary_buf[corruption.slot, :32].view(torch.int64)
        mask = torch.tensor(1, dtype=torch.int64).bitwise_left_shift(corruption.bit)
        fields[corruption.field] ^= mask.to(fields.device)
    elif kind in ("kv_inside", "kv_outside"):
        world.sources[corruption.source].backing[corruption.offset] ^= corruption.value
    elif kind == "page_swap":
        tensor = world.sources[corruption.source].tensor
        a, b = tensor[corruption.slot].clone(), tensor[corruption.other].clone()
        tensor[corruption.slot].copy_(b)
        tensor[corruption.other].copy_(a)
    elif kind == "stale":
        world.canary_buf[corruption.slot, :32] = world.canary_buf[corruption.other, :32]
    else:
        raise ValueError(f"unknown corruption {kind!r}")
