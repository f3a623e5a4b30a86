"""Plan and scatter glue of the suite (CONTRACT §12, §13): a drawn batch made into the
implementation's tensors and the reference's arrays, both launched, their results compared
field by field, and a snippet that repeats the call.

The plans an implementation fills start with distinct non-zero contents (:func:`prefilled`), so
an entry the contract says is left alone, and is not, shows as a difference. The pipeline
(:func:`run_pipeline`) makes a drawn batch into an engine's steps and runs them through the
suite's one driver (:mod:`conformance.driver`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance.driver import (
    PLAN_FIELDS,
    ImplementationSide,
    ReferenceSide,
    allocate_plans,
    assert_same_plans,
    first_plans,
    plan_differences,
    plan_host,
    reference_plans,
    run_step,
)
from conformance.support import import_impl_lines
from engine_model import KV_BYTES, Forward, GroupLaunch
from engine_model.faults import REQ_TO_TOKEN
from engine_model.vocabulary import FULL, TAIL
from strategies.batches import EngineBatch, ScatterBatch, distinct_values

__all__ = [
    "PLAN_FIELDS",
    "first_plans",
    "PlanArgs",
    "implementation_plan",
    "plan_args",
    "plan_differences",
    "plan_snippet",
    "prefilled",
    "reference_plan",
    "scatter_snippet",
]


@dataclasses.dataclass
class PlanArgs:
    """One plan launch's arguments with the plans' first contents, all as numpy arrays."""

    batch: EngineBatch
    inputs: dict  # the launcher's keyword arguments but the two plans, numpy or None or int
    verify: dict  # field -> its first contents
    write: dict

    def tensors(self, device) -> dict:
        """The launcher's keyword arguments but the plans, as tensors on ``device``."""
        return {
            name: torch.from_numpy(value.copy()).to(device)
            if isinstance(value, np.ndarray)
            else value
            for name, value in self.inputs.items()
        }


def prefilled(batch: EngineBatch) -> tuple[dict, dict]:
    """The first contents of ``batch``'s plans (:func:`first_plans`)."""
    return first_plans(batch.verify_capacity, batch.write_req_capacity)


def plan_args(batch: EngineBatch) -> PlanArgs:
    a = batch.arrays()
    inputs = dict(
        req_pool_indices=a.req_pool_indices,
        prefix_lens=a.prefix_lens,
        extend_seq_lens=a.extend_seq_lens,
        req_to_token=a.req_to_token,
        swa_window_size=batch.swa_window,
        full_to_swa_index_mapping=a.full_to_swa_index_mapping,
        verify_capacity=batch.verify_capacity,
        req_to_verify_expected_tokens=a.req_to_verify_expected_tokens,
        req_to_verify_expected_tokens_valid_lens=a.req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=batch.offset,
    )
    verify, write = prefilled(batch)
    return PlanArgs(batch, inputs, verify, write)


def implementation_plans(impl, args: PlanArgs, device):
    """The implementation's two plans for ``args``' batch, as a plan launch finds them
    (:func:`conformance.driver.allocate_plans`)."""
    return allocate_plans(impl, device, args.batch.verify_capacity, args.batch.write_req_capacity)


def implementation_plan(impl, args: PlanArgs, device) -> dict:
    """Launch the implementation's plan kernel; its plans afterwards, as host arrays."""
    verify, write = implementation_plans(impl, args, device)
    impl.launch_canary_plan_kernels(
        verify_plan_out=verify, write_plan_out=write, **args.tensors(device)
    )
    return plan_host(verify, write)


def reference_plan(args: PlanArgs) -> dict:
    """The reference's plans for ``args``, as host arrays keyed like :func:`plan_host`."""
    verify, write = reference_plans(args.batch.verify_capacity, args.batch.write_req_capacity)
    reference.plan(verify, write, **args.inputs)
    return plan_host(verify, write)


def describe_batch(batch: EngineBatch) -> str:
    """A batch for failure messages: its rows and the options of the step."""
    rows = ", ".join(
        f"{r.kind}(row {r.pool_row}, prefix {r.prefix}, extend {r.extend}"
        + (f", valid {r.valid_len})" if batch.pool else ")")
        for r in batch.rows[:12]
    )
    more = f" and {batch.bs - 12} more" if batch.bs > 12 else ""
    window = (
        f"SWA window {batch.swa_window} ({batch.swa_table} table)" if batch.swa_window else "no SWA"
    )
    pool = f"expected-token pool, offset {batch.offset}" if batch.pool else "no expected-token pool"
    return (
        f"batch of {batch.bs}: {rows}{more}\n"
        f"       {batch.table} table of {batch.pool_rows} rows x {batch.context_len}, page {batch.page_size}, "
        f"{window}, {pool}, verify_capacity {batch.verify_capacity} (needs {batch.total_verify()}), "
        f"write_req_capacity {batch.write_req_capacity}"
    )


def plan_snippet(impl_name: str, device, batch: EngineBatch) -> str:
    """Code that rebuilds ``batch``, runs the implementation's plan and the reference's, and
    asserts that every field agrees (paste it at the repository root)."""
    lines = import_impl_lines(impl_name, device)
    lines += [
        "import strategies.batches as b",
        "from conformance.plan_support import plan_args, implementation_plan, reference_plan, plan_differences",
        f"batch = b.{batch!r}",
        "args = plan_args(batch)",
        "got, want = implementation_plan(impl, args, device), reference_plan(args)",
        "assert not plan_differences(got, want), plan_differences(got, want)",
    ]
    return "\n".join(lines)


def assert_plans_equal(got: dict, want: dict, *, call: str, batch: EngineBatch, repro: str) -> None:
    __tracebackhide__ = True
    assert_same_plans(got, want, what=call, config=describe_batch(batch), repro=repro)


# ---------------------------------------------------------------------------------------------
# The scatter


def scatter_tensors(batch: ScatterBatch, device) -> dict:
    flat, offsets, rows, pool = batch.arrays()
    return dict(
        flat_in=torch.from_numpy(flat).to(device),
        offsets=torch.from_numpy(offsets).to(device),
        req_pool_indices=torch.from_numpy(rows).to(device),
        pool_out=torch.from_numpy(pool).to(device),
    )


def reference_scatter(batch: ScatterBatch) -> np.ndarray:
    flat, offsets, rows, pool = batch.arrays()
    reference.scatter(flat_in=flat, offsets=offsets, req_pool_indices=rows, pool_out=pool)
    return pool


def scatter_snippet(impl_name: str, device, batch: ScatterBatch) -> str:
    lines = import_impl_lines(impl_name, device)
    lines += [
        "import strategies.batches as b",
        "from conformance.plan_support import scatter_tensors, reference_scatter",
        f"batch = b.{batch!r}",
        "t = scatter_tensors(batch, device)",
        "impl.launch_scatter_req_token_ids_kernel(**t)",
        "assert (t['pool_out'].cpu().numpy() == reference_scatter(batch)).all()",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The pipeline: scatter, plan, verify and write over an engine's steps, on the implementation
# and on the reference, with the states compared after every launch.


@dataclasses.dataclass(frozen=True)
class TableChange:
    """``req_to_token[row, position]`` set to the slot of ``(other_row, other_position)``
    between two steps of the pipeline: the engine model's ``req_to_token`` fault class
    (:data:`engine_model.faults.REQ_TO_TOKEN`) at a place the test draws from a batch, which has
    no engine model to pick it."""

    row: int
    position: int
    other_row: int
    other_position: int

    def apply(self, table: np.ndarray) -> None:
        """Make the change to ``table``, in place."""
        slot = table[self.other_row, self.other_position]
        REQ_TO_TOKEN.change(table, self.row, self.position, slot)


def pipeline_steps(batch: EngineBatch) -> list[tuple[np.ndarray, np.ndarray]]:
    """The steps of the pipeline, as ``(prefix_lens, extend_seq_lens)``: the prefill of every
    live row's prefix, the batch's own step, then a decode of every row that has room. Padding
    rows keep their stale values in every step."""
    a = batch.arrays()
    live = a.req_pool_indices != reference.REQ_POOL_IDX_PADDING
    prefix, extend = a.prefix_lens.copy(), a.extend_seq_lens.copy()
    first = (np.where(live, 0, prefix), np.where(live, prefix, extend))
    after = prefix + np.maximum(extend, 0)
    room = after < batch.context_len
    last = (np.where(live, after, prefix), np.where(live, room.astype(np.int64), extend))
    return [first, (prefix, extend), last]


def token_table(batch: EngineBatch) -> np.ndarray:
    """The token of each position of each pool row, one past the row for the EAGLE offset:
    distinct and non-zero. The KV of position ``pos`` holds token ``pos + offset``."""
    rng = np.random.default_rng(batch.seed + 2)
    tokens = distinct_values(rng, batch.pool_rows * (batch.context_len + 1))
    return tokens.reshape(batch.pool_rows, batch.context_len + 1)


def scatter_inputs(batch: EngineBatch) -> dict:
    """The scatter that fills the expected-token pool: each live row's first ``valid_len``
    tokens (what an engine snapshots as the prompt and the output so far)."""
    a = batch.arrays()
    tokens = token_table(batch)
    live = [i for i, row in enumerate(batch.rows) if row.kind != "padding"]
    rows = a.req_pool_indices[live]
    lengths = a.req_to_verify_expected_tokens_valid_lens[live]
    flat = np.concatenate(
        [tokens[rp, :n] for rp, n in zip(rows, lengths)] + [np.zeros(0, np.int64)]
    )
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return dict(
        flat_in=flat.astype(np.int64), offsets=offsets, req_pool_indices=rows.astype(np.int64)
    )


def write_arrays(batch: EngineBatch, table: np.ndarray, lut, prefix, extend) -> tuple:
    """``(input_ids, positions, out_cache_loc)`` of a step, in the order of its write plan."""
    a = batch.arrays()
    tokens = token_table(batch)
    ids, positions, slots = [], [], []
    for r, rp in enumerate(a.req_pool_indices):
        if rp == reference.REQ_POOL_IDX_PADDING or extend[r] <= 0:
            continue
        pos = np.arange(prefix[r], prefix[r] + extend[r], dtype=np.int64)
        ids.append(tokens[rp, pos + batch.offset])
        positions.append(pos)
        full = table[rp, pos].astype(np.int64)
        slots.append(full if lut is None else reference.translate(full, lut))
    if not ids:
        return (np.zeros(0, np.int64),) * 3
    return np.concatenate(ids), np.concatenate(positions), np.concatenate(slots)


def evicted_before(batch: EngineBatch, table: np.ndarray, lut: np.ndarray, prefix) -> np.ndarray:
    """``lut`` with the SWA slot of every position before a live row's window evicted (0)."""
    a = batch.arrays()
    lut = lut.copy()
    starts = reference.window_starts(prefix, batch.swa_window)
    for r, rp in enumerate(a.req_pool_indices):
        if rp != reference.REQ_POOL_IDX_PADDING and starts[r] > 0:
            lut[table[rp, : starts[r]].astype(np.int64)] = 0
    return lut


def pipeline_world(batch: EngineBatch):
    """The canary world of a pipeline: one slot per slot the table names (SWA slots under a
    table), every slot's KV bytes distinct and read in mode ALL, the chain position assert on,
    and a ring wide enough for every report a changed page-table entry causes."""
    return st_kv.world(
        num_slots=batch.num_slots,
        mode=int(reference.RealKvHashMode.ALL),
        ring_capacity=64,
        chain_assert=1,
    )


def pipeline_forwards(batch: EngineBatch, change: TableChange | None = None) -> list[Forward]:
    """The steps of :func:`pipeline_steps` as an engine's forwards: the scatter in the first,
    then each step's plan (a verify capacity that holds all its entries: an overflow would
    silence the verify) and its write, without the input assert and with no KV written.
    ``change`` is made to the page table before the last step, and under an ``evicted`` SWA
    table a slot is evicted once it left the window: before the last step, not while written."""
    a = batch.arrays()
    table = a.req_to_token.copy()
    lut = a.full_to_swa_index_mapping
    if batch.swa_table == "evicted":
        lut = dataclasses.replace(batch, swa_table="permuted").arrays().full_to_swa_index_mapping
    inputs = plan_args(batch).inputs
    del inputs["verify_capacity"], inputs["req_to_verify_expected_tokens"]  # the step's own
    forwards = []
    for step, (prefix, extend) in enumerate(pipeline_steps(batch)):
        if step == 2 and change is not None:
            change.apply(table)
        if step == 2 and batch.swa_table == "evicted":
            lut = evicted_before(batch, table, lut, prefix)
        need = reference.plan_entries(
            req_pool_indices=a.req_pool_indices, prefix_lens=prefix, req_to_token=table,
            swa_window_size=batch.swa_window, full_to_swa_index_mapping=None,
            req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        ).slots.shape[0]  # fmt: skip
        plan = dict(inputs, prefix_lens=prefix, extend_seq_lens=extend, req_to_token=table.copy())
        window = plan.pop("swa_window_size")
        plan.pop("full_to_swa_index_mapping")
        ids, positions, slots = write_arrays(batch, table, lut, prefix, extend)
        # without the input assert: no expected inputs
        write = dict(input_ids=ids, positions=positions, enable_write_input_assert=False)
        write.update(dict.fromkeys(("expected_input_tokens", "expected_input_positions")))
        group = GroupLaunch(
            group=FULL,
            swa_window_size=window,
            full_to_swa_index_mapping=None if lut is None else lut.copy(),
            verify_capacity=max(1, need),
            out_cache_loc=slots,
            kv_slots=np.zeros(0, np.int64),
            kv_bytes=np.zeros((0, KV_BYTES), np.uint8),
        )
        forwards.append(
            Forward(
                kind=("prefill", "step", "decode")[step],
                scatter=scatter_inputs(batch)
                if step == 0 and a.req_to_verify_expected_tokens is not None
                else None,
                plan=plan,
                write_req_capacity=batch.write_req_capacity,
                write=write,
                groups=(group,),
                stages=(TAIL,),
            )
        )
    return forwards


def run_pipeline(impl, device, batch: EngineBatch, *, change: TableChange | None = None, what):
    """Scatter, then per step of :func:`pipeline_steps`: plan, verify and write, on the
    implementation and on the reference (:func:`conformance.driver.run_step`), the states
    compared after every launch with ``what(step, launch)`` naming the point. ``change`` is made
    to the page table after the second step. Returns the reference state and the write index
    before the last step."""
    __tracebackhide__ = True
    forwards = pipeline_forwards(batch, change)
    made = st_kv.materialize_world(pipeline_world(batch), device)
    a = batch.arrays()
    pool = a.req_to_verify_expected_tokens
    oracle = ReferenceSide(made.reference_state(), pool)
    first = forwards[0]
    implementation = ImplementationSide(
        impl, device, made, pool=pool, table=first.plan["req_to_token"],
        lut=first.groups[0].full_to_swa_index_mapping,
    )  # fmt: skip
    config = describe_batch(batch)
    index_before_last = 0
    for step, forward in enumerate(forwards):
        if step == 2:
            index_before_last = oracle.index
        run_step(
            implementation, oracle, forward,
            what=lambda launch, step=step: what(step, launch), config=config,
        )  # fmt: skip
    return oracle.state, index_before_last
