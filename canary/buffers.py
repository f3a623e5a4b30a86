"""The canary's launch context and plans (CONTRACT §5)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .constants import CanaryLaunchTag, RealKvHashMode
from .source import RealKvSource, is_int


def _check_capacity(name: str, value: object) -> int:
    if not is_int(value):
        raise TypeError(f"kv-canary: {name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"kv-canary: {name} must be > 0, got {value}")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class VerifyOrWriteContext:
    """Everything a write or verify launch reads and updates besides its plan."""

    canary_buf: torch.Tensor  # uint8 [num_slots, slot_stride_bytes]
    kernel_kind: CanaryLaunchTag  # stamped into every violation row
    violation_ring: torch.Tensor  # int64 [ring_capacity, 8]
    violation_write_index: torch.Tensor  # int32 [1], counts past the capacity
    slot_run_counter: torch.Tensor  # int64 [1]
    kernel_run_counter: torch.Tensor  # int64 [1]
    real_kv_sources: tuple[RealKvSource, ...]
    real_kv_hash_mode: RealKvHashMode
    enable_chain_position_assert: torch.Tensor  # int32 [1]


@dataclass(frozen=True, kw_only=True)
class VerifyPlan:
    """Entries to verify: slot, expected token (-1 = unchecked), position and predecessor."""

    verify_slot_indices: torch.Tensor  # int64 [cap]
    verify_expected_tokens: torch.Tensor  # int64 [cap]
    verify_expected_positions: torch.Tensor  # int64 [cap]
    verify_prev_slot_indices: torch.Tensor  # int64 [cap]: < 0 anchor, 0 unchecked
    verify_num_valid: torch.Tensor  # int32 [1]
    enable: torch.Tensor  # int32 [1]

    @classmethod
    def allocate(cls, *, verify_capacity: int, device: torch.device | str) -> VerifyPlan:
        """An empty, enabled plan: every entry is padding (slot 0) until filled in."""
        cap = _check_capacity("verify_capacity", verify_capacity)
        return cls(
            verify_slot_indices=torch.zeros(cap, dtype=torch.int64, device=device),
            verify_expected_tokens=torch.full((cap,), -1, dtype=torch.int64, device=device),
            verify_expected_positions=torch.zeros(cap, dtype=torch.int64, device=device),
            verify_prev_slot_indices=torch.zeros(cap, dtype=torch.int64, device=device),
            verify_num_valid=torch.zeros(1, dtype=torch.int32, device=device),
            enable=torch.ones(1, dtype=torch.int32, device=device),
        )


@dataclass(frozen=True, kw_only=True)
class WritePlan:
    """Requests to write: entry ranges into the token arrays and the slot each chain continues."""

    write_offsets: torch.Tensor  # int64 [cap + 1], exclusive prefix sums
    write_seed_slot_indices: torch.Tensor  # int64 [cap], -1 = start at the anchor
    write_num_valid_reqs: torch.Tensor  # int32 [1]

    @classmethod
    def allocate(cls, *, write_req_capacity: int, device: torch.device | str) -> WritePlan:
        """An empty plan: no valid request, every seed at the anchor."""
        cap = _check_capacity("write_req_capacity", write_req_capacity)
        return cls(
            write_offsets=torch.zeros(cap + 1, dtype=torch.int64, device=device),
            write_seed_slot_indices=torch.full((cap,), -1, dtype=torch.int64, device=device),
            write_num_valid_reqs=torch.zeros(1, dtype=torch.int32, device=device),
        )
