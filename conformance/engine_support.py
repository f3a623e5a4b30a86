"""Engine histories run on an implementation and on the reference (CONTRACT §6, §7, §12, §13).

:class:`OracleRun` runs the launches of a :class:`strategies.engine.Engine` on the numpy
reference: the scatter into the expected-token pool, the plan, verify, the forward's KV bytes
and write, and the cache sweep, in the order an engine makes them. :class:`ImplRun` runs the
same launches on an implementation's tensors, and :func:`run_step` runs one step on both and
compares them after every launch. :func:`due_reports` says which reports a fault must have
caused by the end of :data:`SETTLE`, a short run of steps after it.

Both runs start from one world: a canary slot per slot of the pool (SWA slots under a window),
one flat source of 32 KV bytes per slot, a ring wide enough for every report of a history, the
chain position assert on, and the write's input assert on with the token oracle's tokens.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance.assertions import fail, to_numpy
from conformance.plan_support import PLAN_FIELDS, first_plans, plan_differences
from conformance.write_verify_support import Snapshot, assert_same_state
from strategies.engine import KV_BYTES, READ_BYTES, Engine, Fault, Forward, Sweep

__all__ = [
    "RING_CAPACITY",
    "SETTLE",
    "ImplRun",
    "OracleRun",
    "due_reports",
    "inject_and_settle",
    "oracle_world",
    "run_step",
    "warm_up",
]

#: Rows of the violation ring: more than any history of the suite reports.
RING_CAPACITY = 512
#: The steps run right after a fault: a fresh request of one page is admitted and everyone
#: prefills (a token each), decodes, prefills and decodes again, then the cache is swept, so
#: that every running request is verified after any page was reused.
SETTLE = ("admit", "prefill", "decode", "prefill", "decode", "sweep")
#: FailReason bits.
CHAIN, POSITION, REAL_KV, WRITE_TOKEN, TOKEN = 1, 2, 4, 8, 32


def sweep_plan(sweep: Sweep) -> dict:
    n = sweep.slots.shape[0]
    return {
        "verify_slot_indices": sweep.slots.copy(),
        "verify_expected_tokens": np.full(n, -1, dtype=np.int64),
        "verify_expected_positions": sweep.positions.copy(),
        "verify_prev_slot_indices": sweep.prev_slots.copy(),
        "verify_num_valid": np.array([n], dtype=np.int32),
        "enable": np.array([1], dtype=np.int32),
    }


def oracle_world(engine: Engine) -> reference.CanaryState:
    """The reference's world for ``engine``, made from its seed alone (no torch): random
    non-zero canary bytes and KV bytes, an empty ring of random rows, counters at random values."""
    c = engine.config
    rng = np.random.default_rng(c.seed + 1)
    kv = rng.integers(1, 256, (c.num_slots, KV_BYTES)).astype(np.uint8)
    return reference.CanaryState(
        canary_buf=rng.integers(1, 256, (c.num_slots, 32)).astype(np.uint8),
        kernel_kind=0,
        violation_ring=rng.integers(1, 2**62, (RING_CAPACITY, 8)).astype(np.int64),
        violation_write_index=np.zeros(1, dtype=np.int32),
        slot_run_counter=np.zeros(1, dtype=np.int64),
        kernel_run_counter=np.zeros(1, dtype=np.int64),
        real_kv_sources=(reference.Source(kv, 1, KV_BYTES, KV_BYTES),),
        real_kv_hash_mode=c.mode,
        enable_chain_position_assert=np.ones(1, dtype=np.int32),
    )


class OracleRun:
    """The reference side of a history: a ``CanaryState``, the expected-token pool and the KV."""

    def __init__(self, engine: Engine, state: reference.CanaryState | None = None):
        self.state = oracle_world(engine) if state is None else state
        self.pool = engine.pool.copy()

    @property
    def kv(self) -> np.ndarray:
        return self.state.real_kv_sources[0].data

    @property
    def index(self) -> int:
        return int(self.state.violation_write_index[0])

    def scatter(self, forward: Forward) -> None:
        if forward.scatter is not None:
            reference.scatter(**forward.scatter, pool_out=self.pool)

    def plan(self, forward: Forward):
        verify, write = first_plans(forward.verify_capacity, forward.write_req_capacity)
        vp, wp = reference.VerifyPlan(**verify), reference.WritePlan(**write)
        reference.plan(
            vp, wp, **forward.plan, verify_capacity=forward.verify_capacity,
            req_to_verify_expected_tokens=self.pool,
        )  # fmt: skip
        return vp, wp

    def verify(self, plan, *, tokens: bool = True) -> None:
        reference.verify(self.state, plan, check_verify_expected_token=tokens)

    def store_kv(self, forward: Forward) -> None:
        self.kv[forward.kv_slots] = forward.kv_bytes

    def write(self, forward: Forward, plan) -> None:
        reference.write(self.state, plan, **forward.write, enable_write_input_assert=True)

    def forward(self, forward: Forward) -> None:
        self.scatter(forward)
        vp, wp = self.plan(forward)
        self.verify(vp)
        self.store_kv(forward)
        self.write(forward, wp)

    def sweep(self, sweep: Sweep) -> None:
        self.verify(reference.VerifyPlan(**sweep_plan(sweep)), tokens=False)

    def forward_or_sweep(self, step: Forward | Sweep) -> None:
        """Run one step of a history (the reference alone)."""
        if isinstance(step, Sweep):
            self.sweep(step)
        else:
            self.forward(step)

    def flip(self, slot: int, byte: int) -> None:
        self.kv[slot, byte] ^= 0xFF

    def rows(self, since: int) -> np.ndarray:
        """The rows stored since write index ``since``."""
        return self.state.violation_ring[since : min(self.index, RING_CAPACITY)]


def _tensor(array, device):
    """A tensor of its own (never sharing the engine's arrays) on ``device``."""
    return None if array is None else torch.from_numpy(np.array(array, copy=True)).to(device)


class ImplRun:
    """The implementation side of a history, on ``device``: the world of :func:`oracle_world`
    as tensors, the implementation's context over it, and the expected-token pool."""

    def __init__(self, impl, device, engine: Engine, state: reference.CanaryState):
        self.impl, self.device = impl, device
        c = engine.config
        world = st_kv.world(
            sources=(st_kv.layout(rows=c.num_slots, num_bytes_per_token=KV_BYTES),),
            mode=c.mode,
            num_slots=c.num_slots,
            ring_capacity=RING_CAPACITY,
            chain_assert=1,
            seed=c.seed,
        )
        self.made = made = st_kv.materialize_world(world, device)
        # the same first contents as the reference's
        made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
        made.violation_ring.copy_(torch.from_numpy(state.violation_ring))
        made.violation_write_index.zero_()
        made.slot_run_counter.zero_()
        made.kernel_run_counter.zero_()
        self.kv = made.sources[0].tensor
        self.kv.copy_(torch.from_numpy(state.real_kv_sources[0].data))
        self.context = made.context(impl)
        # an engine keeps one page table, one SWA table and one pool, updated in place
        self.pool = _tensor(engine.pool, device)
        self.table = _tensor(engine.req_to_token, device)
        self.lut = _tensor(engine.lut, device)

    def plan(self, forward: Forward):
        verify, write = first_plans(forward.verify_capacity, forward.write_req_capacity)
        vp = self.impl.VerifyPlan.allocate(
            verify_capacity=forward.verify_capacity, device=self.device
        )
        wp = self.impl.WritePlan.allocate(
            write_req_capacity=forward.write_req_capacity, device=self.device
        )
        for plan, first in ((vp, verify), (wp, write)):
            for name, value in first.items():
                getattr(plan, name).copy_(torch.from_numpy(value))
        args = {
            k: _tensor(v, self.device) if isinstance(v, np.ndarray) else v
            for k, v in forward.plan.items()
        }
        self.table.copy_(torch.from_numpy(forward.plan["req_to_token"]))
        args["req_to_token"] = self.table
        if self.lut is not None:
            self.lut.copy_(torch.from_numpy(forward.plan["full_to_swa_index_mapping"]))
            args["full_to_swa_index_mapping"] = self.lut
        self.impl.launch_canary_plan_kernels(
            verify_plan_out=vp, write_plan_out=wp, **args,
            verify_capacity=forward.verify_capacity, req_to_verify_expected_tokens=self.pool,
        )  # fmt: skip
        return vp, wp

    def scatter(self, forward: Forward) -> None:
        if forward.scatter is not None:
            self.impl.launch_scatter_req_token_ids_kernel(
                **{k: _tensor(v, self.device) for k, v in forward.scatter.items()},
                pool_out=self.pool,
            )

    def verify(self, plan, *, tokens: bool = True) -> None:
        self.impl.launch_canary_verify_kernel(
            context=self.context, plan=plan, check_verify_expected_token=tokens
        )

    def store_kv(self, forward: Forward) -> None:
        if forward.kv_slots.size:
            self.kv[_tensor(forward.kv_slots, self.device)] = _tensor(forward.kv_bytes, self.device)

    def write(self, forward: Forward, plan) -> None:
        self.impl.launch_canary_write_kernel(
            context=self.context, plan=plan,
            **{k: _tensor(v, self.device) for k, v in forward.write.items()},
            enable_write_input_assert=True,
        )  # fmt: skip

    def sweep(self, sweep: Sweep):
        n = sweep.slots.shape[0]
        plan = self.impl.VerifyPlan.allocate(verify_capacity=n, device=self.device)
        for name, value in sweep_plan(sweep).items():
            getattr(plan, name).copy_(torch.from_numpy(value))
        self.verify(plan, tokens=False)

    def flip(self, slot: int, byte: int) -> None:
        self.kv[slot, byte] ^= 0xFF


def _plan_host(vp, wp, host) -> dict:
    plans = {"verify": vp, "write": wp}
    return {key: host(getattr(plans[key[0]], key[1])) for key in PLAN_FIELDS}


def run_step(impl: ImplRun, oracle: OracleRun, step: Forward | Sweep, *, what: str, config: str):
    """One step of a history on both sides, compared after every launch: the pool after the
    scatter, both plans after the plan, and the world after verify and after write."""
    __tracebackhide__ = True

    def same(launch: str, since: int) -> None:
        assert_same_state(
            Snapshot.of_world(impl.made), Snapshot.of_state(oracle.state),
            index_before=since, what=f"{what}, {launch}", config=config,
        )  # fmt: skip

    if isinstance(step, Sweep):
        since = oracle.index
        impl.sweep(step)
        oracle.sweep(step)
        same("the verify of the cache sweep", since)
        return
    impl.scatter(step)
    oracle.scatter(step)
    got = to_numpy(impl.pool)
    if (got != oracle.pool).any():
        bad = np.argwhere(got != oracle.pool)[:4].tolist()
        fail(f"{what}, scatter: the pool differs at {bad} (CONTRACT §13)", config=config)
    ivp, iwp = impl.plan(step)
    ovp, owp = oracle.plan(step)
    lines = plan_differences(
        _plan_host(ivp, iwp, lambda t: to_numpy(t).copy()),
        _plan_host(ovp, owp, lambda a: np.asarray(a).copy()),
    )
    if lines:
        fail(
            f"{what}, plan: the plans differ (CONTRACT §12):\n  " + "\n  ".join(lines),
            config=config,
        )
    since = oracle.index
    impl.verify(ivp)
    oracle.verify(ovp)
    same("verify", since)
    impl.store_kv(step)
    oracle.store_kv(step)
    since = oracle.index
    impl.write(step, iwp)
    oracle.write(step, owp)
    same("write", since)


@dataclass(frozen=True)
class Due:
    """A report a fault must cause: a ring row naming ``slot`` whose bits hold ``bits``
    (``exact``: are exactly ``bits``)."""

    slot: int
    bits: int
    exact: bool = False


def _record(state: reference.CanaryState, slot: int) -> np.ndarray:
    return np.ascontiguousarray(state.canary_buf[slot, :32]).view("<i8")


def due_reports(engine: Engine, fault: Fault, oracle: OracleRun) -> tuple[list[Due], bool] | None:
    """What ``fault`` must cause by the end of :data:`SETTLE`, judged when it is made:
    ``(reports, silent)``: every :class:`Due` must be among the rows stored, and with ``silent``
    no row at all may be (the fault is one no mode-independent check can see: a KV byte the
    hash mode does not read, or a slot whose record equals the one it replaced). None: nothing
    is promised (the fault may leave the sliding window before it is verified)."""
    mode = engine.config.mode
    if fault.flip is not None:
        slot, byte = fault.flip
        if byte >= READ_BYTES[mode]:
            return [], True
        return [Due(slot, REAL_KV)], False
    if fault.kind == "next_token_swap":
        return [], False  # the slots are known once written: see due_after_settle
    if engine.config.swa_window:
        return None
    if fault.kind == "freed_while_referenced":
        return [], False
    # req_to_token, page_swap: the first changed entry of each row now names another slot
    dues = []
    for rid, pos in fault.entries:
        req = engine.running[rid]
        new = int(engine.req_to_token[req.row, pos])
        old = engine.full_slot(req, pos)
        a, b = _record(oracle.state, old), _record(oracle.state, new)
        bits = (CHAIN if a[2] != b[2] else 0) | (POSITION if a[1] != b[1] else 0)
        bits |= TOKEN if a[0] != b[0] else 0
        if bits:
            dues.append(Due(new, bits, exact=True))
    return dues, not dues


def due_after_settle(engine: Engine, fault: Fault) -> list[Due]:
    """Reports known only once the settle ran: the written slots of a swapped token, any slot
    of a page freed while in use (without a sliding window)."""
    if fault.kind == "next_token_swap":
        return [Due(slot, WRITE_TOKEN) for slot in engine.slots_of(fault.entries)]
    if fault.kind == "freed_while_referenced" and not engine.config.swa_window:
        return [Due(-1, CHAIN | POSITION | TOKEN)]
    return []


def missing(dues: list[Due], rows: np.ndarray, fault: Fault) -> list[str]:
    """The dues no row of ``rows`` meets, as lines."""
    out = []
    for due in dues:
        if due.slot == -1:  # any slot of the fault's, any of the bits
            ok = any(int(r[1]) in fault.slots and int(r[7]) & due.bits for r in rows)
        elif due.exact:
            ok = any(int(r[1]) == due.slot and int(r[7]) == due.bits for r in rows)
        else:
            ok = any(int(r[1]) == due.slot and int(r[7]) & due.bits == due.bits for r in rows)
        if not ok:
            out.append(f"no report at slot {due.slot} with bits {due.bits} ({fault.what})")
    return out


def warm_up(engine: Engine, run) -> None:
    """A short history that leaves running requests (one sharing a cached prefix), a cached
    prefix no request uses and freshly sampled tokens: every fault class has a place."""
    c = engine.config
    for _ in range(3):
        engine.admit(c.context_len // 4 + 1, share=0)
    for step in (engine.prefill(c.context_len), engine.decode(1)):
        if step is not None:
            run(step)
    engine.finish(0)  # its prefix is cached, and shared by the next request
    engine.admit(2, share=1)
    for step in (engine.prefill(c.context_len), engine.decode(0)):
        if step is not None:
            run(step)
    engine.finish(0)  # its prefix is cached, and no request uses it


def inject_and_settle(
    engine: Engine, oracle: OracleRun, kind: str, pick: int, byte: int, run, flip=None
):
    """Make a fault of ``kind`` (``flip(slot, byte)`` changes the implementation's KV too), run
    :data:`SETTLE` through ``run``, and judge the reports: ``(fault, problems, first)`` with
    ``first`` the number of steps after the fault until the first report (None: none), or None
    when the engine has no place for the fault or too few free pages to settle."""
    if not engine.free_rows or len(engine.free_pages) < 2 * len(engine.running) + 1:
        return None
    fault = engine.fault(kind, pick, byte)
    if fault is None:
        return None
    due = due_reports(engine, fault, oracle)
    if fault.flip is not None:
        oracle.flip(*fault.flip)
        if flip is not None:
            flip(*fault.flip)
    since = oracle.index
    steps = [0, None]

    def counted(step):
        run(step)
        steps[0] += 1
        if steps[1] is None and oracle.index != since:
            steps[1] = steps[0]

    settle(engine, counted)
    if due is None:
        return fault, [], steps[1]
    dues, silent = due
    dues = dues + due_after_settle(engine, fault)
    if fault.flip is not None and engine.lut is not None and fault.flip[0] not in engine.lut:
        return fault, [], steps[1]  # the slot left the window before a verify could see it
    problems = missing(dues, oracle.rows(since), fault)
    if silent and oracle.index != since:
        problems.append(
            f"{oracle.index - since} reports, none due: mode {engine.config.mode} cannot see "
            f"{fault.what}"
        )
    return fault, problems, steps[1]


def settle(engine: Engine, run) -> None:
    """Run :data:`SETTLE` through ``run(step)``."""
    c = engine.config
    for name in SETTLE:
        if name == "admit":
            engine.admit(c.page_size + c.offset, share=0)
            continue
        step = {
            "prefill": lambda: engine.prefill(1),
            "decode": lambda: engine.decode(0),
            "sweep": engine.sweep,
        }[name]()
        if step is not None:
            run(step)


def copy_state(state: reference.CanaryState) -> reference.CanaryState:
    return copy.deepcopy(state)
