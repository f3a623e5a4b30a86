"""One driver for the launches an engine makes, on an implementation and on the reference
(CONTRACT §6, §7, §12, §13, §15).

A step is a :class:`engine_model.steps.Forward` (the scatter of the batch's token snapshots,
then per buffer group the plan and the ``HEAD`` verify and write, the forward's KV stores, then
per group the ``TAIL`` verify and write: SGLang's bracket of a forward) or a
:class:`engine_model.steps.Sweep` (per group, a verify of every slot the prefix cache holds,
under the group's ``SWEEP`` tag). :class:`ReferenceSide` runs a step on the numpy reference,
:class:`ImplementationSide` on an implementation's tensors, and :func:`run_step` runs it on both
and compares them after every launch: the expected-token pool after the scatter, a group's
plans after its plan, and the launching endpoint's world after each verify and write. Each side
keeps one world per endpoint (keyed ``(group, stage)``: its own canary buffer, sources and
counters, one ring and write index for all), one page table, one full-to-SWA table and one
pool, as an engine does, and updates them in place between steps. A world of one buffer is the
endpoint ``(FULL, TAIL)`` of a forward whose ``stages`` are ``("TAIL",)``.

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
from engine_model import Forward, GroupLaunch, Move, Sweep, SweepGroup
from engine_model.vocabulary import FULL, HEAD, STAGES, SWEEP, TAIL

__all__ = [
    "PLAN_FIELDS",
    "VERIFY_FIELDS",
    "ImplementationSide",
    "ReferenceSide",
    "allocate_plans",
    "assert_same_plans",
    "assert_same_pool",
    "first_plans",
    "graph_plans",
    "host",
    "launch_name",
    "move",
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


def sweep_plan(sweep: SweepGroup) -> dict:
    """The verify plan of a group's cache sweep: every cached slot, expected tokens unchecked
    (-1)."""
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


def graph_plans(kept: dict, forward: Forward, group: GroupLaunch, allocate):
    """The plans a step's plan launch fills: new ones from ``allocate()``, or, for a step that
    replays a captured graph, those ``kept`` from the last replay of the same batch size and
    group (SGLang allocates a forward's plans inside the graph, so each replay finds what the
    previous one left)."""
    if not forward.graph:
        return allocate()
    key = (group.group, forward.write_req_capacity, group.verify_capacity)
    if key not in kept:
        kept[key] = allocate()
    return kept[key]


def launch_name(state: reference.CanaryState) -> str:
    """The launch tag a state stamps, by name (``TAIL_K_FULL``)."""
    return reference.CanaryLaunchTag(int(state.kernel_kind)).name


def move(side, step: Move) -> None:
    """KV that moves without a forward, on one side (no kernel runs: the engine copies): a save
    copies each group's slots of its KV pool and of its head and tail canary buffers into the
    side's host copy ``step.key``; a load copies the host copy into its slots (slot ``i`` the
    KV of saved slot ``kv_from[i]`` and the records of ``records_from[i]``, none where -1)
    and consumes it."""
    for group in step.groups:
        arrays = {"kv": side.kv(group.group)}
        arrays.update({stage: side.canary_buf((group.group, stage)) for stage in STAGES})
        slots = side.slot_index(group.slots)
        if step.save:
            saved = {name: side.copy(a[slots]) for name, a in arrays.items()}
            side.host.setdefault(step.key, {})[group.group] = saved
            continue
        saved = side.host[step.key][group.group]
        for name, a in arrays.items():
            taken = group.kv_from if name == "kv" else group.records_from
            assert taken is not None
            keep = taken >= 0
            if keep.any():
                a[side.slot_index(group.slots[keep])] = saved[name][side.slot_index(taken[keep])]
    if not step.save:
        del side.host[step.key]


class ReferenceSide:
    """The reference side of a history: a ``CanaryState`` per endpoint, keyed ``(group,
    stage)`` (all sharing one ring and write index, as SGLang's endpoints share its violation
    log), and the expected-token pool (None: the engine keeps none)."""

    def __init__(self, states: dict, pool: np.ndarray | None):
        if isinstance(states, reference.CanaryState):  # one buffer: a plain world
            states = {(FULL, TAIL): states}
        self.states: dict = states
        self.pool = None if pool is None else pool.copy()
        self.graph_plans: dict = {}  # a captured graph's plans, kept from replay to replay
        self.host: dict = {}  # the host copies of KV moved without a forward (:func:`move`)

    def canary_buf(self, key) -> np.ndarray:
        return self.states[key].canary_buf

    @staticmethod
    def slot_index(slots: np.ndarray) -> np.ndarray:
        return slots

    @staticmethod
    def copy(array: np.ndarray) -> np.ndarray:
        return array.copy()

    @property
    def state(self) -> reference.CanaryState:
        """The first group's tail state (a world of one buffer: its only state)."""
        return next(s for (g, stage), s in self.states.items() if stage == TAIL)

    def kv(self, group: str) -> np.ndarray:
        """The KV bytes of a group's pool: its tail buffer's first source."""
        return self.states[(group, TAIL)].real_kv_sources[0].data

    @property
    def index(self) -> int:
        """The ring's write index."""
        return int(self.state.violation_write_index[0])

    def rows(self, since: int) -> np.ndarray:
        """The rows stored since write index ``since``."""
        ring = self.state.violation_ring
        return ring[since : min(self.index, len(ring))]

    def scatter(self, forward: Forward) -> None:
        if forward.scatter is not None:
            reference.scatter(**forward.scatter, pool_out=self.pool)

    def plan(self, forward: Forward, group: GroupLaunch):
        vp, wp = graph_plans(
            self.graph_plans, forward, group,
            lambda: reference_plans(group.verify_capacity, forward.write_req_capacity),
        )  # fmt: skip
        reference.plan(
            vp, wp, **forward.plan, **group.plan_arguments(),
            verify_capacity=group.verify_capacity, req_to_verify_expected_tokens=self.pool,
        )  # fmt: skip
        return vp, wp

    def verify(self, key, plan, *, tokens: bool = True) -> None:
        reference.verify(self.states[key], plan, check_verify_expected_token=tokens)

    def store_kv(self, group: GroupLaunch) -> None:
        if group.kv_slots.size:
            self.kv(group.group)[group.kv_slots] = group.kv_bytes

    def write(self, key, forward: Forward, group: GroupLaunch, plan) -> None:
        races = "; ".join(write_races(plan, group.out_cache_loc))
        assert not races, f"the engine model made a write with no defined result: {races}"
        reference.write(
            self.states[key], plan, **forward.write_for(key[1]), out_cache_loc=group.out_cache_loc
        )

    def launches(self, key, forward: Forward, group: GroupLaunch, plans) -> None:
        """One endpoint's verify and write of a forward."""
        vp, wp = plans
        self.verify(key, vp)
        self.write(key, forward, group, wp)

    def forward(self, forward: Forward) -> None:
        self.scatter(forward)
        plans = {}
        for g in forward.groups:
            plans[g.group] = self.plan(forward, g)
            if HEAD in forward.stages:
                self.launches((g.group, HEAD), forward, g, plans[g.group])
        for g in forward.groups:
            self.store_kv(g)
        for g in forward.groups:
            self.launches((g.group, TAIL), forward, g, plans[g.group])

    def sweep(self, group: SweepGroup) -> None:
        self.verify((group.group, SWEEP), reference.VerifyPlan(**sweep_plan(group)), tokens=False)

    def forward_or_sweep(self, step: Forward | Sweep | Move) -> None:
        """Run one step of a history (the reference alone)."""
        if isinstance(step, Move):
            move(self, step)
        elif isinstance(step, Sweep):
            for group in step.groups:
                self.sweep(group)
        else:
            self.forward(step)

    def flip(self, group: str, slot: int, byte: int) -> None:
        self.kv(group)[slot, byte] ^= 0xFF


class ImplementationSide:
    """The implementation side of a history, on ``device``: a materialized world per endpoint,
    keyed as the reference's states (sharing one ring and write index), the implementation's
    context over each, and the page table, the full-to-SWA table (None: no window) and the
    expected-token pool (None: none) as tensors updated in place."""

    def __init__(self, impl, device, worlds, *, pool, table, lut):
        if isinstance(worlds, st_kv.MaterializedWorld):  # one buffer: a plain world
            worlds = {(FULL, TAIL): worlds}
        self.impl, self.device, self.worlds = impl, device, worlds
        self.graph_plans: dict = {}  # a captured graph's plans, kept from replay to replay
        self.contexts = {key: made.context(impl) for key, made in worlds.items()}
        self.host: dict = {}  # the host copies of KV moved without a forward (:func:`move`)
        self.pool = self.tensor(pool)
        self.table = self.tensor(table)
        self.lut = self.tensor(lut)

    @property
    def made(self) -> st_kv.MaterializedWorld:
        """The first group's tail world (a world of one buffer: its only world)."""
        return next(w for (g, stage), w in self.worlds.items() if stage == TAIL)

    def kv(self, group: str) -> torch.Tensor:
        return self.worlds[(group, TAIL)].sources[0].tensor

    def canary_buf(self, key) -> torch.Tensor:
        return self.worlds[key].canary_buf

    def slot_index(self, slots: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.asarray(slots, dtype=np.int64)).to(self.device)

    @staticmethod
    def copy(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.clone()

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

    def plan(self, forward: Forward, group: GroupLaunch):
        vp, wp = graph_plans(
            self.graph_plans, forward, group,
            lambda: allocate_plans(
                self.impl, self.device, group.verify_capacity, forward.write_req_capacity
            ),
        )  # fmt: skip
        args = self._arguments({**forward.plan, **group.plan_arguments()})
        self.table.copy_(torch.from_numpy(forward.plan["req_to_token"]))
        args["req_to_token"] = self.table
        if group.full_to_swa_index_mapping is not None:
            assert self.lut is not None
            self.lut.copy_(torch.from_numpy(group.full_to_swa_index_mapping))
            args["full_to_swa_index_mapping"] = self.lut
        self.impl.launch_canary_plan_kernels(
            verify_plan_out=vp, write_plan_out=wp, **args,
            verify_capacity=group.verify_capacity, req_to_verify_expected_tokens=self.pool,
        )  # fmt: skip
        return vp, wp

    def verify(self, key, plan, *, tokens: bool = True) -> None:
        self.impl.launch_canary_verify_kernel(
            context=self.contexts[key], plan=plan, check_verify_expected_token=tokens
        )

    def store_kv(self, group: GroupLaunch) -> None:
        if group.kv_slots.size:
            self.kv(group.group)[self.tensor(group.kv_slots)] = self.tensor(group.kv_bytes)

    def write(self, key, forward: Forward, group: GroupLaunch, plan) -> None:
        self.impl.launch_canary_write_kernel(
            context=self.contexts[key], plan=plan,
            **self._arguments({**forward.write_for(key[1]), "out_cache_loc": group.out_cache_loc}),
        )  # fmt: skip

    def sweep(self, group: SweepGroup) -> None:
        plan = self.impl.VerifyPlan.allocate(
            verify_capacity=group.slots.shape[0], device=self.device
        )
        _fill(plan, sweep_plan(group))
        self.verify((group.group, SWEEP), plan, tokens=False)

    def flip(self, group: str, slot: int, byte: int) -> None:
        self.kv(group)[slot, byte] ^= 0xFF


def run_step(
    impl: ImplementationSide,
    oracle: ReferenceSide,
    step: Forward | Sweep | Move,
    *,
    what: Callable[[str], str],
    config: str,
) -> None:
    """One step on both sides, compared after every launch: the pool after the scatter, each
    group's plans after its plan, and each endpoint's world after each verify and write, in the
    order an engine launches them (per group the plan and the ``HEAD`` launches, the forward's
    KV stores, then per group the ``TAIL`` launches). ``what(launch)`` names the point of a
    comparison for its failure message."""
    __tracebackhide__ = True
    if isinstance(step, Move):  # no launch: the engine copies, on both sides alike
        move(impl, step)
        move(oracle, step)
        return

    def same(key, launch: str, since: int) -> None:
        state = oracle.states[key]
        assert_same_state(
            Snapshot.of_world(impl.worlds[key]), Snapshot.of_state(state),
            index_before=since, what=what(f"{launch_name(state)} {launch}"), config=config,
            state=state,
        )  # fmt: skip

    if isinstance(step, Sweep):
        for group in step.groups:
            since = oracle.index
            impl.sweep(group)
            oracle.sweep(group)
            same((group.group, SWEEP), "verify of the cache sweep", since)
        return
    if step.scatter is not None:
        impl.scatter(step)
        oracle.scatter(step)
        assert_same_pool(to_numpy(impl.pool), oracle.pool, what=what("scatter"), config=config)

    def launches(group: GroupLaunch, stage: str, plans) -> None:
        key = (group.group, stage)
        ivp, iwp, ovp, owp = plans
        since = oracle.index
        impl.verify(key, ivp)
        oracle.verify(key, ovp)
        same(key, "verify", since)
        since = oracle.index
        impl.write(key, step, group, iwp)
        oracle.write(key, step, group, owp)
        same(key, "write", since)

    plans = {}
    for group in step.groups:
        ivp, iwp = impl.plan(step, group)
        ovp, owp = oracle.plan(step, group)
        assert_same_plans(
            plan_host(ivp, iwp), plan_host(ovp, owp),
            what=what(f"plan of group {group.group}"), config=config,
        )  # fmt: skip
        plans[group.group] = (ivp, iwp, ovp, owp)
        if HEAD in step.stages:
            launches(group, HEAD, plans[group.group])
    for group in step.groups:  # the forward stores its KV
        impl.store_kv(group)
        oracle.store_kv(group)
    for group in step.groups:
        launches(group, TAIL, plans[group.group])
