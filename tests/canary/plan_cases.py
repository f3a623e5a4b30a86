"""The cases of canary's plan tests (``test_plan.py``, ``test_plan_refusals.py``): a page table
that names each slot by its place, freshly allocated plans, and one launch of the plan.

``req_to_token[r, c]`` is ``100 * r + c + 1`` unless a test says otherwise, so a planned slot
shows the row and position it was read from.
"""

from __future__ import annotations

import torch

import canary

ROW_LEN = 8


def page_table(rows: int = 5, row_len: int = ROW_LEN) -> torch.Tensor:
    table = torch.arange(row_len, dtype=torch.int32) + 1
    return (table + 100 * torch.arange(rows, dtype=torch.int32)[:, None]).contiguous()


def plans(capacity: int = 16, write_capacity: int = 6):
    """Both plans, filled with sentinels that show what a launch wrote."""
    verify = canary.VerifyPlan.allocate(verify_capacity=capacity, device="cpu")
    for name, value in (
        ("verify_slot_indices", 91),
        ("verify_expected_tokens", 92),
        ("verify_expected_positions", 93),
        ("verify_prev_slot_indices", 94),
        ("verify_num_valid", 95),
        ("enable", 96),
    ):
        getattr(verify, name).fill_(value)
    write = canary.WritePlan.allocate(write_req_capacity=write_capacity, device="cpu")
    write.write_offsets.fill_(77)
    write.write_seed_slot_indices.fill_(55)
    write.write_num_valid_reqs.fill_(66)
    return verify, write


def i64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def arguments(verify, write, **given) -> dict:
    """The launch's keywords: a batch of one real row unless told otherwise."""
    args = dict(
        verify_plan_out=verify,
        write_plan_out=write,
        req_pool_indices=i64([1]),
        prefix_lens=i64([2]),
        extend_seq_lens=i64([1]),
        req_to_token=page_table(),
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=verify.verify_slot_indices.shape[0] if verify is not None else 16,
        req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    args.update(given)
    return args


def run(capacity: int = 16, write_capacity: int = 6, **given):
    verify, write = plans(capacity, write_capacity)
    canary.launch_canary_plan_kernels(**arguments(verify, write, **given))
    return verify, write


def entries(verify, n: int) -> dict:
    """The first ``n`` entries of each entry tensor, and the two scalars."""
    return {
        "slots": verify.verify_slot_indices[:n].tolist(),
        "tokens": verify.verify_expected_tokens[:n].tolist(),
        "positions": verify.verify_expected_positions[:n].tolist(),
        "prev": verify.verify_prev_slot_indices[:n].tolist(),
        "num_valid": int(verify.verify_num_valid),
        "enable": int(verify.enable),
    }
