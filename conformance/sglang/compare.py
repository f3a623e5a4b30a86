"""SGLang's runtime code against the engine model, forward by forward and sweep by sweep: its
``PlanInput`` (:func:`compare_plan_inputs`), its token oracle manager's expected inputs
(:func:`expected_inputs`) and its sweep plan over the model's cache walk
(:func:`compare_sweep`). Each returns the differing entries as lines (none: equal)."""

from __future__ import annotations

import numpy as np
import torch

from conformance.sglang import loading
from conformance.sglang.standins import forward_batch, int64_tensor, swept_cache
from engine_model import Engine, Forward
from engine_model.vocabulary import FULL, ORACLE_MODES, SWA

__all__ = [
    "PLAN_INPUT_FIELDS",
    "VOCAB",
    "compare_plan_inputs",
    "compare_sweep",
    "expected_inputs",
]

#: The vocabulary of the token oracle the leg gives SGLang's ``TokenOracleManager``.
VOCAB = 2**31 - 1
#: The plan inputs compared: SGLang's ``PlanInput`` field, the engine model's plan keyword.
PLAN_INPUT_FIELDS = (
    ("req_pool_indices", "req_pool_indices"),
    ("prefix_lens", "prefix_lens"),
    ("extend_seq_lens", "extend_seq_lens"),
    ("req_to_verify_expected_tokens_valid_lens", "req_to_verify_expected_tokens_valid_lens"),
)
#: The entries of each differing field a comparison names.
SHOWN = 4


def _differing(name: str, got: np.ndarray, want: np.ndarray) -> list[str]:
    """The first :data:`SHOWN` entries where SGLang's ``got`` differs from the model's."""
    return [
        f"{name}[{i}]: SGLang {int(got[i])}, the engine model {int(want[i])}"
        for i in np.flatnonzero(got != want)[:SHOWN]
    ]


def compare_plan_inputs(forward: Forward) -> list[str] | None:
    """SGLang's ``PlanInput`` for ``forward`` against the engine model's plan inputs: the
    differing entries as lines (none: equal), or None for a forward SGLang never makes."""
    batch = forward_batch(forward)
    if batch is None:
        return None
    bs = int(batch.req_pool_indices.shape[0])
    plan_input = loading.runtime().plan_input.PlanInput
    sglang = plan_input.allocate(bs_capacity=bs, device=torch.device("cpu"))
    sglang.fill_from_forward_batch(forward_batch=batch)
    lines = []
    for theirs, ours in PLAN_INPUT_FIELDS:
        want = np.asarray(forward.plan[ours], dtype=np.int64)
        lines += _differing(theirs, getattr(sglang, theirs).numpy(), want)
    return lines


def expected_inputs(forward: Forward) -> list[str] | None:
    """SGLang's ``TokenOracleManager.fill_expected_inputs`` for ``forward`` against the engine
    model's choice of expected inputs: the token oracle's in the modes of
    :data:`engine_model.vocabulary.ORACLE_MODES`, the input ids in the others. The differing
    entries as lines, or None for a forward SGLang never makes or one whose input assert is
    off."""
    batch = forward_batch(forward)
    if batch is None or forward.write["expected_input_tokens"] is None:
        return None
    mods = loading.token_oracle_modules()
    n = int(batch.input_ids.shape[0])
    out = mods.expected_inputs.ExpectedInputs.allocate(capacity=n, device=torch.device("cpu"))
    token_oracle = mods.token_oracle.HashOracle(vocab_size=VOCAB)
    mods.oracle_manager.TokenOracleManager(oracle=token_oracle).fill_expected_inputs(
        forward_batch=batch, expected_inputs_out=out
    )
    rids = batch.rids_int[torch.from_numpy(forward.token_rows)]
    from_oracle = token_oracle.expected_tokens(generalized_req_ids=rids, positions=batch.positions)
    uses_token_oracle = forward.mode in ORACLE_MODES
    want = from_oracle if uses_token_oracle else batch.input_ids
    source = "the token oracle's" if uses_token_oracle else "the input ids"
    lines = []
    got_tokens, got_positions = out.tokens[:n].to(torch.int64), out.positions[:n]
    for i in torch.nonzero(got_tokens != want.to(torch.int64)).flatten()[:SHOWN].tolist():
        lines.append(f"token {i}: SGLang {int(got_tokens[i])}, {source} {int(want[i])}")
    if not torch.equal(got_positions.to(torch.int64), batch.positions):
        lines.append("positions: SGLang's differ from the forward's")
    return lines


def compare_sweep(engine: Engine, sweep) -> list[str]:
    """SGLang's ``build_verify_plan_radix_sweep`` over the engine model's cache walk (its
    ``FULL`` group's entries), per buffer group, against the engine model's sweep: the
    differing entries as lines. What is compared is SGLang's assembly of the plan and its
    translation of the walk into the ``SWA`` group's slots (evicted slots 0, the anchor kept);
    the walk itself is the stand-in's."""
    cache = swept_cache(int64_tensor(engine.req_to_token), sweep)
    lines = []
    for group in sweep.groups:
        window = engine.config.swa_window if group.group == SWA else 0
        lut = None if engine.lut is None or group.group == FULL else int64_tensor(engine.lut)
        plan = loading.sweep_builder().build_verify_plan_radix_sweep(
            radix_cache=cache, swa_window_size=window, full_to_swa_index_mapping=lut
        )
        n = int(plan.verify_num_valid.reshape(-1)[0])
        if n != group.slots.shape[0] or int(plan.enable.reshape(-1)[0]) != 1:
            lines.append(f"{group.group}: {n} entries enabled={int(plan.enable.reshape(-1)[0])}")
            continue
        for theirs, ours in (
            ("verify_slot_indices", group.slots),
            ("verify_expected_positions", group.positions),
            ("verify_prev_slot_indices", group.prev_slots),
        ):
            got = getattr(plan, theirs)[:n].numpy()
            lines += _differing(f"{group.group} {theirs}", got, ours)
    return lines
