"""One driver for the launches an engine makes, on an implementation and on the reference
(CONTRACT §6, §7, §12, §13, §15).

A step is a :class:`strategies.engine.Forward` (the scatter of the batch's token snapshots, the
plan, verify of the verify plan, the forward's KV bytes, write of the write plan) or a
:class:`strategies.engine.Sweep` (a verify of every slot the prefix cache holds).
:class:`ReferenceSide` runs a step on the numpy reference, :class:`ImplementationSide` on an
implementation's tensors, and :func:`run_step` runs it on both and compares them after every
launch: the expected-token pool after the scatter, both plans after the plan, the world after
verify and after write. Each side keeps one page table, one full-to-SWA table and one pool, as
an engine does, and updates them in place between steps.

The rest is what every plan test shares: the plans' fields (:data:`PLAN_FIELDS`), their first
contents (:func:`first_plans`: distinct values, so an entry left alone that should be, or not,
shows), the plans as an engine leaves them before a plan launch (:func:`allocate_plans`,
:func:`reference_plans`), both plans as host arrays (:func:`plan_host`), and the comparisons of
plans and pools, worded field by field (:func:`assert_same_plans`, :func:`assert_same_pool`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance.assertions import fail, to_numpy
from conformance.write_verify_support import Snapshot, assert_same_state
from strategies.engine import Forward, Sweep

__all__ = [
    "PLAN_FIELDS",
    "VERIFY_FIELDS",
    "ImplementationSide",
    "ReferenceSide",
    "allocate_plans",
    "assert_same_plans",
    "assert_same_pool",
    "first_plans",
    "host",
    "plan_differences",
    "plan_host",
    "reference_plans",
    "run_step",
    "sweep_plan",
]

#: Every field of the two plans, as ``(plan, field)``, in the order failures name them.
PLAN_FIELDS = (
    ("verify", "verify_slot_indices"),
    ("verify", "verify_expected_tokens"),
    ("verify", "verify_expected_positions"),
    ("verify", "verify_prev_slot_indices"),
    ("verify", "verify_num_valid"),
    ("verify", "enable"),
    ("write", "write_offsets"),
    ("write", "write_seed_slot_indices"),
    ("write", "write_num_valid_reqs"),
)
#: The fields of a verify plan, the keywords of ``VerifyPlan``.
VERIFY_FIELDS = tuple(name for plan, name in PLAN_FIELDS if plan == "verify")


# ---------------------------------------------------------------------------------------------
# Plans


def first_plans(verify_capacity: int, write_req_capacity: int) -> tuple[dict, dict]:
    """Both plans' first contents: distinct non-zero values, none a value the plan could write
    by chance (large negative entries; num_valid and the flags at odd values)."""
    base = -(10**9)
    k = np.arange(verify_capacity, dtype=np.int64)
    verify = {
        "verify_slot_indices": base - 4 * k,
        "verify_expected_tokens": base - 4 * k - 1,
        "verify_expected_positions": base - 4 * k - 2,
        "verify_prev_slot_indices": base - 4 * k - 3,
        "verify_num_valid": np.array([-77], dtype=np.int32),
        "enable": np.array([5], dtype=np.int32),
    }
    write = {
        "write_offsets": 2 * base - np.arange(write_req_capacity + 1, dtype=np.int64),
        "write_seed_slot_indices": 3 * base - np.arange(write_req_capacity, dtype=np.int64),
        "write_num_valid_reqs": np.array([-99], dtype=np.int32),
    }
    return verify, write


def _fill(plan, contents: dict) -> None:
    for name, value in contents.items():
        getattr(plan, name).copy_(torch.from_numpy(np.array(value, copy=True)))


def allocate_plans(impl, device, verify_capacity: int, write_req_capacity: int):
    """The implementation's two plans as a plan launch finds them: allocated by the
    implementation, then filled with :func:`first_plans`."""
    verify_first, write_first = first_plans(verify_capacity, write_req_capacity)
    verify = impl.VerifyPlan.allocate(verify_capacity=verify_capacity, device=device)
    write = impl.WritePlan.allocate(write_req_capacity=write_req_capacity, device=device)
    _fill(verify, verify_first)
    _fill(write, write_first)
    return verify, write


def reference_plans(verify_capacity: int, write_req_capacity: int):
    """The reference's two plans, filled with :func:`first_plans`."""
    verify_first, write_first = first_plans(verify_capacity, write_req_capacity)
    return reference.VerifyPlan(**verify_first), reference.WritePlan(**write_first)


def host(value) -> np.ndarray:
    """A copy of a tensor (one transfer) or of a numpy array, on the host."""
    if isinstance(value, torch.Tensor):
        return to_numpy(value).copy()
    return np.array(value, copy=True)


def plan_host(verify, write) -> dict:
    """Both plans' fields (the implementation's tensors or the reference's arrays) as host
    arrays, keyed ``(plan, field)``."""
    plans = {"verify": verify, "write": write}
    return {key: host(getattr(plans[key[0]], key[1])) for key in PLAN_FIELDS}


def plan_differences(got: dict, want: dict, *, limit: int = 6) -> list[str]:
    """One line per differing entry of each field (at most ``limit`` a field), dtype and shape
    included: ``verify_prev_slot_indices[3] got 17, want -1``."""
    lines = []
    for key in PLAN_FIELDS:
        g, w = got[key], want[key]
        name = key[1]
        if g.dtype != w.dtype or g.shape != w.shape:
            lines.append(f"{name}: got {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}")
            continue
        where = np.flatnonzero(g != w)
        for i in where[:limit]:
            lines.append(f"{name}[{i}] got {int(g[i])}, want {int(w[i])}")
        if where.size > limit:
            lines.append(f"{name}: {where.size - limit} more entries differ")
    return lines


def assert_same_plans(got: dict, want: dict, *, what: str, config: str, repro: str = "") -> None:
    """Both plans (host arrays, :func:`plan_host`) equal the reference's, or fail naming every
    differing entry."""
    __tracebackhide__ = True
    lines = plan_differences(got, want)
    if lines:
        fail(
            f"{what}: the plans differ from the reference (CONTRACT §12):\n  " + "\n  ".join(lines),
            config=config,
            repro=repro,
        )


def sweep_plan(sweep: Sweep) -> dict:
    """The verify plan of a cache sweep: every cached slot, expected tokens unchecked (-1)."""
    n = sweep.slots.shape[0]
    return {
        "verify_slot_indices": sweep.slots.copy(),
        "verify_expected_tokens": np.full(n, -1, dtype=np.int64),
        "verify_expected_positions": sweep.positions.copy(),
        "verify_prev_slot_indices": sweep.prev_slots.copy(),
        "verify_num_valid": np.array([n], dtype=np.int32),
        "enable": np.array([1], dtype=np.int32),
    }


# ---------------------------------------------------------------------------------------------
# The expected-token pool


def assert_same_pool(got: np.ndarray, want: np.ndarray, *, what: str, config: str, repro: str = ""):
    """The expected-token pool after a scatter equals the reference's, or fail naming its dtype
    and shape, or the entries that differ."""
    __tracebackhide__ = True
    wrong = np.argwhere(got != want) if got.shape == want.shape else None
    if wrong is None or got.dtype != want.dtype:
        problem = (
            f"pool_out became {got.dtype} {list(got.shape)}, want {want.dtype} {list(want.shape)}"
        )
    elif wrong.size:
        cells = ", ".join(
            f"pool_out[{r}, {c}] got {got[r, c]}, want {want[r, c]}" for r, c in wrong[:6]
        )
        problem = f"{len(wrong)} pool entries differ from the reference: {cells}"
    else:
        return
    fail(f"{what}: {problem} (CONTRACT §13)", config=config, repro=repro)


# ---------------------------------------------------------------------------------------------
# The two sides


def write_races(plan, out_cache_loc: np.ndarray) -> list[str]:
    """Why a write launch has no defined result (CONTRACT §6: on a GPU its requests race), as
    lines, or none: a slot two entries write, or a request's seed slot that another request
    of the launch writes. Requests that write nothing read nothing that matters."""
    offsets = np.asarray(plan.write_offsets, dtype=np.int64)
    seeds = np.asarray(plan.write_seed_slot_indices, dtype=np.int64)
    active = max(0, min(int(plan.write_num_valid_reqs[0]), seeds.shape[0]))
    owner: dict[int, int] = {}
    problems = []
    for req in range(active):
        for slot in np.asarray(out_cache_loc[offsets[req] : offsets[req + 1]]).tolist():
            if slot < 0:
                continue
            if slot in owner:
                problems.append(f"slot {slot} written by requests {owner[slot]} and {req}")
            owner.setdefault(slot, req)
    for req in range(active):
        seed = int(seeds[req])
        if seed >= 0 and offsets[req + 1] > offsets[req] and owner.get(seed, req) != req:
            problems.append(
                f"request {req} seeds from slot {seed}, which request {owner[seed]} writes"
            )
    return problems


class ReferenceSide:
    """The reference side of a history: a ``CanaryState``, the expected-token pool (None: the
    engine keeps none) and the KV bytes of its first source."""

    def __init__(self, state: reference.CanaryState, pool: np.ndarray | None):
        self.state = state
        self.pool = None if pool is None else pool.copy()

    @property
    def kv(self) -> np.ndarray:
        return self.state.real_kv_sources[0].data

    @property
    def index(self) -> int:
        """The ring's write index."""
        return int(self.state.violation_write_index[0])

    def rows(self, since: int) -> np.ndarray:
        """The rows stored since write index ``since``."""
        return self.state.violation_ring[since : min(self.index, len(self.state.violation_ring))]

    def scatter(self, forward: Forward) -> None:
        if forward.scatter is not None:
            reference.scatter(**forward.scatter, pool_out=self.pool)

    def plan(self, forward: Forward):
        vp, wp = reference_plans(forward.verify_capacity, forward.write_req_capacity)
        reference.plan(
            vp, wp, **forward.plan, verify_capacity=forward.verify_capacity,
            req_to_verify_expected_tokens=self.pool,
        )  # fmt: skip
        return vp, wp

    def verify(self, plan, *, tokens: bool = True) -> None:
        reference.verify(self.state, plan, check_verify_expected_token=tokens)

    def store_kv(self, forward: Forward) -> None:
        if forward.kv_slots.size:
            self.kv[forward.kv_slots] = forward.kv_bytes

    def write(self, forward: Forward, plan) -> None:
        races = "; ".join(write_races(plan, forward.write["out_cache_loc"]))
        assert not races, f"the engine model made a write with no defined result: {races}"
        reference.write(self.state, plan, **forward.write)

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


class ImplementationSide:
    """The implementation side of a history, on ``device``: a materialized world, the
    implementation's context over it, and the page table, the full-to-SWA table (None: no
    window) and the expected-token pool (None: none) as tensors updated in place."""

    def __init__(
        self, impl, device, made: st_kv.MaterializedWorld, *, pool, table, lut
    ):  # fmt: skip
        self.impl, self.device, self.made = impl, device, made
        self.context = made.context(impl)
        self.kv = made.sources[0].tensor
        self.pool = self.tensor(pool)
        self.table = self.tensor(table)
        self.lut = self.tensor(lut)

    def tensor(self, array):
        """A tensor of its own (never sharing the caller's array) on the device."""
        if array is None:
            return None
        return torch.from_numpy(np.array(array, copy=True)).to(self.device)

    def _arguments(self, arrays: dict) -> dict:
        return {k: self.tensor(v) if isinstance(v, np.ndarray) else v for k, v in arrays.items()}

    def scatter(self, forward: Forward) -> None:
        if forward.scatter is not None:
            self.impl.launch_scatter_req_token_ids_kernel(
                **self._arguments(forward.scatter), pool_out=self.pool
            )

    def plan(self, forward: Forward):
        vp, wp = allocate_plans(
            self.impl, self.device, forward.verify_capacity, forward.write_req_capacity
        )
        args = self._arguments(forward.plan)
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

    def verify(self, plan, *, tokens: bool = True) -> None:
        self.impl.launch_canary_verify_kernel(
            context=self.context, plan=plan, check_verify_expected_token=tokens
        )

    def store_kv(self, forward: Forward) -> None:
        if forward.kv_slots.size:
            self.kv[self.tensor(forward.kv_slots)] = self.tensor(forward.kv_bytes)

    def write(self, forward: Forward, plan) -> None:
        self.impl.launch_canary_write_kernel(
            context=self.context, plan=plan, **self._arguments(forward.write)
        )

    def sweep(self, sweep: Sweep) -> None:
        plan = self.impl.VerifyPlan.allocate(
            verify_capacity=sweep.slots.shape[0], device=self.device
        )
        _fill(plan, sweep_plan(sweep))
        self.verify(plan, tokens=False)

    def flip(self, slot: int, byte: int) -> None:
        self.kv[slot, byte] ^= 0xFF


def run_step(
    impl: ImplementationSide,
    oracle: ReferenceSide,
    step: Forward | Sweep,
    *,
    what: Callable[[str], str],
    config: str,
) -> None:
    """One step on both sides, compared after every launch: the pool after the scatter, both
    plans after the plan, and the world after verify and after write. ``what(launch)`` names
    the point of a comparison for its failure message."""
    __tracebackhide__ = True

    def same(launch: str, since: int) -> None:
        assert_same_state(
            Snapshot.of_world(impl.made), Snapshot.of_state(oracle.state),
            index_before=since, what=what(launch), config=config, state=oracle.state,
        )  # fmt: skip

    if isinstance(step, Sweep):
        since = oracle.index
        impl.sweep(step)
        oracle.sweep(step)
        same("the verify of the cache sweep", since)
        return
    if step.scatter is not None:
        impl.scatter(step)
        oracle.scatter(step)
        assert_same_pool(to_numpy(impl.pool), oracle.pool, what=what("scatter"), config=config)
    ivp, iwp = impl.plan(step)
    ovp, owp = oracle.plan(step)
    assert_same_plans(plan_host(ivp, iwp), plan_host(ovp, owp), what=what("plan"), config=config)
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
