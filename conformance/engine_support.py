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

from dataclasses import dataclass

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance import driver
from conformance.driver import ImplementationSide, ReferenceSide
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


def oracle_world(engine: Engine) -> reference.CanaryState:
    """The reference's world for ``engine``, made from its seed alone (no torch): random
    non-zero canary bytes and KV bytes, an empty ring of random rows, counters at random values."""
    c = engine.config
    rng = np.random.default_rng(c.seed + 1)
    kv = rng.integers(1, 256, (c.num_slots, KV_BYTES)).astype(np.uint8)
    return reference.CanaryState(
        canary_buf=rng.integers(1, 256, (c.num_slots, reference.CANARY_SLOT_BYTES)).astype(
            np.uint8
        ),
        kernel_kind=reference.CanaryLaunchTag.HEAD_K_FULL,
        violation_ring=rng.integers(1, 2**62, (RING_CAPACITY, reference.VIOLATION_FIELDS)).astype(
            np.int64
        ),
        violation_write_index=np.zeros(1, dtype=np.int32),
        slot_run_counter=np.zeros(1, dtype=np.int64),
        kernel_run_counter=np.zeros(1, dtype=np.int64),
        real_kv_sources=(reference.Source(kv, 1, KV_BYTES, KV_BYTES),),
        real_kv_hash_mode=c.mode,
        enable_chain_position_assert=np.ones(1, dtype=np.int32),
    )


class OracleRun(ReferenceSide):
    """The reference side of an engine's history: the world of :func:`oracle_world` and the
    engine's expected-token pool."""

    def __init__(self, engine: Engine, state: reference.CanaryState | None = None):
        super().__init__(oracle_world(engine) if state is None else state, engine.pool)


class ImplRun(ImplementationSide):
    """The implementation side of an engine's history, on ``device``: the world of
    :func:`oracle_world` as tensors, and the engine's page table, SWA table and pool."""

    def __init__(self, impl, device, engine: Engine, state: reference.CanaryState):
        c = engine.config
        world = st_kv.world(
            sources=(st_kv.layout(rows=c.num_slots, num_bytes_per_token=KV_BYTES),),
            mode=c.mode,
            num_slots=c.num_slots,
            ring_capacity=RING_CAPACITY,
            chain_assert=1,
            seed=c.seed,
        )
        made = st_kv.materialize_world(world, device)
        # the same first contents as the reference's
        made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
        made.violation_ring.copy_(torch.from_numpy(state.violation_ring))
        made.violation_write_index.zero_()
        made.slot_run_counter.zero_()
        made.kernel_run_counter.zero_()
        made.sources[0].tensor.copy_(torch.from_numpy(state.real_kv_sources[0].data))
        super().__init__(
            impl, device, made, pool=engine.pool, table=engine.req_to_token, lut=engine.lut
        )


def run_step(impl: ImplRun, oracle: OracleRun, step: Forward | Sweep, *, what: str, config: str):
    """One step of a history on both sides, compared after every launch
    (:func:`conformance.driver.run_step`); ``what`` names the step in failure messages."""
    __tracebackhide__ = True
    driver.run_step(impl, oracle, step, what=lambda launch: f"{what}, {launch}", config=config)


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
