"""On overflow the plan still writes its first ``verify_capacity`` entries (``enable`` and
``verify_num_valid`` are right): breaks CONTRACT §12 item 4 (an overflowing plan writes no
entry; the entry tensors keep what they held). Kept safe: the entries are made in scratch
tensors of the batch's size and only the first ``verify_capacity`` are copied."""

import canary.plan
from strength.known_bad._mutate import export, patch_function

patch_function(
    canary.plan,
    "_launch_entries_kernel",
    (
        "    planned = checked.total if checked.total <= checked.verify_capacity else 0\n",
        "    planned = checked.total\n"
        "    scratch = [torch.empty(max(planned, 1), dtype=torch.int64, device=device) for _ in range(4)]\n",
    ),
    (
        "        verify_plan_out.enable,\n"
        "        verify_plan_out.verify_slot_indices,\n"
        "        verify_plan_out.verify_expected_tokens,\n"
        "        verify_plan_out.verify_expected_positions,\n"
        "        verify_plan_out.verify_prev_slot_indices,\n",
        "        torch.ones_like(verify_plan_out.enable),\n        *scratch,\n",
    ),
    (
        "        num_warps=PLAN_ENTRIES_NUM_WARPS,\n    )\n",
        "        num_warps=PLAN_ENTRIES_NUM_WARPS,\n    )\n"
        "    kept = min(planned, checked.verify_capacity)\n"
        "    for out, made in zip((verify_plan_out.verify_slot_indices, verify_plan_out.verify_expected_tokens,"
        " verify_plan_out.verify_expected_positions, verify_plan_out.verify_prev_slot_indices), scratch):\n"
        "        out[:kept] = made[:kept]\n",
    ),
)

export(globals())
