"""Write/verify glue of the suite (CONTRACT §5-§7): a launch's arguments for the implementation
and for the reference, launches run on both, snapshots of what a launch may change, two states
compared field by field, the reports CONTRACT §7 requires after a corruption, the golden
write/verify runners, and what was done told as a snippet that repeats it.

The fingerprint side and what both share live in :mod:`conformance.support`; how differences
are worded lives in :mod:`conformance.assertions`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import pprint
from collections.abc import Sequence

import numpy as np
import torch

import reference
import strategies as st_kv
from conformance.assertions import (
    RECORD_FIELDS,
    chosen_row_differences,
    fail,
    fail_bits_name,
    field_differences,
    from_hexu,
    hexu,
    record_differences,
    ring_row_differences,
)
from conformance.support import import_impl_lines

__all__ = [
    "Outcome",
    "Snapshot",
    "assert_same_state",
    "batch_number",
    "bit_names",
    "check_world",
    "code",
    "differences",
    "expected_reports",
    "implementation_outcome",
    "implementation_write_verify",
    "launch_row_differences",
    "launch_rows",
    "preset_records",
    "records_sha256",
    "reference_outcome",
    "reference_verify_launch",
    "reference_write_launch",
    "reference_write_verify",
    "reports_of",
    "run_verify",
    "run_write",
    "state_differences",
    "story",
    "take_damage",
    "untouched_changes",
    "verify_launch",
    "write_launch",
]

# ---------------------------------------------------------------------------------------------
# A launch's arguments: one plumbing, with torch tensors for the implementation and numpy
# arrays for the reference.


def _write_arguments(batch: st_kv.WriteBatch, plan, column) -> dict:
    ids, positions, slots = batch.token_arrays()
    expected = batch.input_assert
    return dict(
        plan=plan,
        input_ids=column(ids),
        positions=column(positions),
        out_cache_loc=column(slots),
        enable_write_input_assert=batch.input_assert,
        expected_input_tokens=column(batch.expected_tokens) if expected else None,
        expected_input_positions=column(batch.expected_positions) if expected else None,
    )


def _verify_columns(batch: st_kv.VerifyBatch) -> dict:
    return {
        "verify_slot_indices": batch.slots,
        "verify_expected_tokens": batch.expected_tokens,
        "verify_expected_positions": batch.expected_positions,
        "verify_prev_slot_indices": batch.prev_slots,
    }


def _host_column(values) -> np.ndarray:
    return np.asarray(values, dtype=np.int64).reshape(-1)


def write_launch(impl, batch: st_kv.WriteBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_write_kernel`` for ``batch`` (all but ``context``)."""
    plan = impl.WritePlan.allocate(write_req_capacity=batch.capacity, device=device)
    plan.write_offsets.copy_(torch.tensor(batch.offsets(), dtype=torch.int64))
    plan.write_seed_slot_indices.copy_(
        torch.tensor([r.seed for r in batch.requests], dtype=torch.int64)
    )
    plan.write_num_valid_reqs.fill_(batch.num_valid)
    return _write_arguments(
        batch, plan, lambda values: torch.tensor(values, dtype=torch.int64, device=device)
    )


def reference_write_launch(batch: st_kv.WriteBatch) -> dict:
    """The numpy twin of :func:`write_launch`, for ``reference.write``."""
    plan = reference.WritePlan(
        write_offsets=_host_column(batch.offsets()),
        write_seed_slot_indices=_host_column([r.seed for r in batch.requests]),
        write_num_valid_reqs=np.asarray([batch.num_valid], dtype=np.int32),
    )
    return _write_arguments(batch, plan, _host_column)


def verify_launch(impl, batch: st_kv.VerifyBatch, device) -> dict:
    """Keyword arguments of ``impl.launch_canary_verify_kernel`` for ``batch`` (all but ``context``)."""
    plan = impl.VerifyPlan.allocate(verify_capacity=batch.capacity, device=device)
    for name, values in _verify_columns(batch).items():
        getattr(plan, name).copy_(torch.tensor(values, dtype=torch.int64))
    plan.verify_num_valid.fill_(batch.num_valid)
    plan.enable.fill_(batch.enable)
    return dict(plan=plan, check_verify_expected_token=batch.check_token)


def reference_verify_launch(batch: st_kv.VerifyBatch) -> dict:
    """The numpy twin of :func:`verify_launch`, for ``reference.verify``."""
    plan = reference.VerifyPlan(
        **{name: _host_column(values) for name, values in _verify_columns(batch).items()},
        verify_num_valid=np.asarray([batch.num_valid], dtype=np.int32),
        enable=np.asarray([batch.enable], dtype=np.int32),
    )
    return dict(plan=plan, check_verify_expected_token=batch.check_token)


# ---------------------------------------------------------------------------------------------
# States: what a launch may change, and how two states differ.


def launch_rows(ring: np.ndarray, since: int, until: int) -> np.ndarray:
    """The ring rows stored while the write index went from ``since`` to ``until``, sorted:
    their order inside a launch is unspecified (CONTRACT §5), so only their multiset counts."""
    stored = ring[min(since, len(ring)) : min(until, len(ring))]
    return stored[np.lexsort(stored.T[::-1])] if len(stored) else stored


@dataclasses.dataclass
class Snapshot:
    """The observable state of a world: what the contract says a launch may change."""

    canary_buf: np.ndarray
    ring: np.ndarray
    write_index: int
    slot_run_counter: int
    kernel_run_counter: int
    # the reference's ``(index, row)`` of each violation past the ring (``CanaryState``)
    past_capacity: tuple = ()

    @classmethod
    def of_world(cls, world: st_kv.MaterializedWorld) -> Snapshot:
        return cls(
            canary_buf=world.canary_buf.cpu().numpy().copy(),
            ring=world.violation_ring.cpu().numpy().copy(),
            write_index=int(world.violation_write_index.item()),
            slot_run_counter=int(world.slot_run_counter.item()),
            kernel_run_counter=int(world.kernel_run_counter.item()),
        )

    @classmethod
    def of_state(cls, state: reference.CanaryState) -> Snapshot:
        return cls(
            canary_buf=state.canary_buf.copy(),
            ring=state.violation_ring.copy(),
            write_index=int(state.violation_write_index[0]),
            slot_run_counter=int(state.slot_run_counter[0]),
            kernel_run_counter=int(state.kernel_run_counter[0]),
            past_capacity=tuple(state.past_capacity),
        )

    def records(self) -> np.ndarray:
        """The four int64 fields of every slot, ``[num_slots, 4]``."""
        return np.ascontiguousarray(self.canary_buf[:, :32]).view("<i8").reshape(-1, 4)

    def new_rows(self, since: int) -> np.ndarray:
        """Rows stored since write index ``since``, sorted (order in a launch is unspecified)."""
        return launch_rows(self.ring, since, self.write_index)


def untouched_changes(got: Snapshot, want: Snapshot, *, start: int, end: int) -> list[str]:
    """What differs where no launch may write: bytes past the 32 record bytes of a slot, and
    ring rows outside the rows the launches stored (write indices ``start`` to ``end``)."""
    problems = []
    tails = np.flatnonzero((got.canary_buf[:, 32:] != want.canary_buf[:, 32:]).any(axis=1))
    if tails.size:
        problems.append(f"canary_buf bytes past 32 changed in slots {tails.tolist()}")
    capacity = len(want.ring)
    lo = min(start, capacity)
    hi = max(lo, min(end, capacity))
    outside = np.r_[0:lo, hi:capacity]
    moved = outside[(got.ring[outside] != want.ring[outside]).any(axis=1)]
    if moved.size:
        problems.append(
            f"ring rows {moved.tolist()} changed, outside the rows [{lo}, {hi}) the launches "
            "stored (a wrap or a stray store)"
        )
    return problems


def state_differences(got: Snapshot, want: Snapshot, *, since: int) -> list[str]:
    """Every difference between two states whose launches started at write index ``since``:
    index and counters, canary records field by field, the rows stored since (as a multiset)
    and anything changed where no launch may write."""
    problems = []
    for name, label in (
        ("write_index", "violation_write_index"),
        ("slot_run_counter", "slot_run_counter"),
        ("kernel_run_counter", "kernel_run_counter"),
    ):
        if getattr(got, name) != getattr(want, name):
            problems.append(f"{label} got {getattr(got, name)}, want {getattr(want, name)}")
    problems += untouched_changes(got, want, start=since, end=want.write_index)
    problems += record_differences(got.records(), want.records())
    problems += launch_row_differences(got, want, since=since)
    return problems


def launch_row_differences(got: Snapshot, want: Snapshot, *, since: int) -> list[str]:
    """What differs between the rows the launches stored since write index ``since``: as a
    multiset, or, where their violations ran past the ring, as a choice of as many of them
    (:func:`chosen_row_differences`)."""
    past = [row for index, row in want.past_capacity if since <= index < want.write_index]
    if not past:
        return ring_row_differences(got.new_rows(since), want.new_rows(since))
    return chosen_row_differences(got.new_rows(since), want.new_rows(since), past)


def assert_same_state(
    got: Snapshot,
    want: Snapshot,
    *,
    index_before: int,
    what: str,
    config: str,
    repro: str = "",
    state: reference.CanaryState | None = None,
):
    """Two states agree: buffer bytes, ring rows (as a multiset within the launch), index, counters.

    A difference is named field by field: ``slot 3: prev_hash got 0x..., want 0x...``,
    ``ring row 0 (slot 7): expected_token got 0, want -1``. Where they agree, the reference
    ``state`` that ``want`` was taken of (if given) takes the ring of ``got``: the order of a
    launch's rows, and which of them a full ring keeps, are the implementation's to choose, and
    the next comparison checks that rows outside its launch stay as the implementation left them.
    """
    __tracebackhide__ = True
    problems = state_differences(got, want, since=index_before)
    if problems:
        fail(f"{what}:\n  " + "\n  ".join(problems), config=config, repro=repro)
    if state is not None:
        state.violation_ring[...] = got.ring


def assert_world_holds(impl, device, made, state, *, index_before: int, what: str, config: str):
    """The implementation's world ``made`` holds what the reference ``state`` holds
    (:func:`assert_same_state` of their snapshots), with the story of ``made`` as the snippet."""
    __tracebackhide__ = True
    assert_same_state(
        Snapshot.of_world(made),
        Snapshot.of_state(state),
        index_before=index_before,
        what=what,
        config=config,
        repro=story(impl, device, made),
        state=state,
    )


def launch_and_compare(launch, impl, device, made, batch, state, *, what: str, config: str) -> int:
    """Run ``launch`` (:func:`run_write` or :func:`run_verify`) of ``batch`` on the
    implementation's world ``made`` and on the reference ``state``, then assert that both hold
    the same; returns the write index from before the launch."""
    __tracebackhide__ = True
    index_before = int(made.violation_write_index.item())
    launch(impl, made, batch, device, state)
    assert_world_holds(
        impl, device, made, state, index_before=index_before, what=what, config=config
    )
    return index_before


def reports_of(snapshot: Snapshot, since: int) -> dict[int, int]:
    """``{slot: FailReason bits}`` of the rows stored since write index ``since`` (one verify);
    a slot reported twice fails."""
    reports: dict[int, int] = {}
    for row in snapshot.new_rows(since):
        slot, bits = int(row[1]), int(row[7])
        if slot in reports:
            fail(
                f"slot {slot} was reported twice in one verify: {snapshot.new_rows(since).tolist()}"
            )
        reports[slot] = bits
    return reports


def bit_names(reports: dict[int, int]) -> str:
    """``{slot: bits}`` with the bits by name: ``{3: CHAIN|REAL_KV, 5: TOKEN}``."""
    return "{" + ", ".join(f"{s}: {fail_bits_name(b)}" for s, b in sorted(reports.items())) + "}"


def expected_reports(chains: tuple[st_kv.Chain, ...], corruption, **options) -> dict[int, int]:
    """The ``{slot: FailReason bits}`` that verifying :func:`strategies.plan_for_chains` over
    ``chains`` must report after ``corruption``: the reference's corruption oracle
    (:func:`reference.corruption_reports`, which says what ``options`` are) on that plan."""
    return reference.corruption_reports(st_kv.plan_for_chains(chains), corruption, **options)


# ---------------------------------------------------------------------------------------------
# Launches on the implementation and the reference, and the story of what was done.


def code(name: str, value) -> str:
    """``name = value`` with the value's repr wrapped to keep lines under 100 columns."""
    return f"{name} = " + pprint.pformat(value, width=90, sort_dicts=False).replace(
        "\n", "\n" + " " * (len(name) + 3)
    )


def batch_number(world) -> int:
    """How many launches ``world`` has seen before this one (its log's launch entries)."""
    return sum(1 for entry in world.log if entry.startswith("batch = "))


def _run(kind: str, impl, world, batch, device, state) -> None:
    """One ``kind`` launch ("write" or "verify") of ``batch``, logged for :func:`story`."""
    world.log.append(
        "\n".join(
            [
                code("batch", batch),
                f"impl.launch_canary_{kind}_kernel(context=made.context(impl), "
                f"**{kind}_launch(impl, batch, device))",
                f"reference.{kind}(state, **reference_{kind}_launch(batch))",
                f'check_world(made, state, "after launch {batch_number(world)} ({kind})")',
            ]
        )
    )
    launch = (
        impl.launch_canary_write_kernel if kind == "write" else impl.launch_canary_verify_kernel
    )
    arguments = write_launch if kind == "write" else verify_launch
    launch(context=world.context(impl), **arguments(impl, batch, device))
    if state is not None:
        twin = reference_write_launch if kind == "write" else reference_verify_launch
        getattr(reference, kind)(state, **twin(batch))


def run_write(impl, world, batch, device, state=None):
    """Write ``batch`` with the implementation and (if given) the reference state."""
    _run("write", impl, world, batch, device, state)


def run_verify(impl, world, batch, device, state=None):
    """Verify ``batch`` with the implementation and (if given) the reference state."""
    _run("verify", impl, world, batch, device, state)


def story(impl, device, made: st_kv.MaterializedWorld) -> str:
    """The calls made on ``made`` so far, as a snippet that repeats them, has the reference
    repeat them too, and asserts after each launch that both hold the same state; pasted into
    a Python shell at the repository's root, it fails where the test failed."""
    lines = [
        *import_impl_lines(impl.__name__, device),
        "from strategies import *",
        "from conformance.write_verify_support import (",
        "    check_world, reference_verify_launch, reference_write_launch, take_damage,",
        "    verify_launch, write_launch,",
        ")",
    ]
    for entry in made.log:
        if entry.startswith("made = materialize_world("):
            lines += code("world", made.world).splitlines()
            lines += ["made = materialize_world(world, device)", "state = made.reference_state()"]
        elif entry.startswith("apply_corruption("):
            lines += [entry, "take_damage(made, state)  # the reference sees the same damage"]
        else:
            lines += entry.splitlines()
    return "\n".join("    " + line for line in lines)


# Helpers the reproduction snippets call.


def check_world(made, state, what: str) -> None:
    """The implementation's world ``made`` holds what the reference ``state`` holds: records,
    write index, counters and ring rows (compared as a multiset: row order inside a launch is
    unspecified). Raises an AssertionError naming each differing field."""
    problems = state_differences(Snapshot.of_world(made), Snapshot.of_state(state), since=0)
    assert not problems, f"{what}:\n  " + "\n  ".join(problems)


def take_damage(made, state) -> None:
    """Give the reference ``state`` the damage a corruption did to ``made``: its canary
    records and KV bytes as they are now (ring and counters are untouched by corruptions)."""
    fresh = made.reference_state()
    state.canary_buf = fresh.canary_buf
    state.real_kv_sources = fresh.real_kv_sources


# ---------------------------------------------------------------------------------------------
# Golden write/verify scenarios (conformance/golden/write_verify.json, scale.json): the final
# state in the stored form, on the reference and on the implementation, and how two of them
# differ. Steps are ``(op, description)``: ``write`` and ``verify`` launches, a ``corrupt``ion,
# and ``preset``, a write batch the reference writes into a scratch copy of the state, of
# which only the canary records are given to the world (the implementation never runs it:
# its ring, write index and counters stay as they were).


def records_sha256(records: np.ndarray) -> str:
    """The sha256 (hex) of records ``[num_slots, 4]`` as little-endian int64, row by row."""
    return hashlib.sha256(np.ascontiguousarray(records, dtype="<i8").tobytes()).hexdigest()


def _observed(
    final: Snapshot, index_start: int, index_after: Sequence[int], *, digest: bool = False
) -> dict:
    """``final`` as the files store it: records (u64 hex, or with ``digest`` only their
    :func:`records_sha256`) and the rows each launch stored (sorted within the launch) as u64
    hex, the write index after every step, both counters."""
    pieces, before = [final.ring[:0]], index_start
    for after in index_after:
        pieces.append(launch_rows(final.ring, before, after))
        before = after
    records = final.records()
    stored = (
        {"records_sha256": records_sha256(records)}
        if digest
        else {"records": [[hexu(v) for v in record] for record in records]}
    )
    end = index_after[-1] if index_after else index_start
    past = [row for index, row in final.past_capacity if index_start <= index < end]
    if past:  # the reference's violations past the ring: the choice is open (CONTRACT §5)
        stored["ring_rows_past_capacity"] = [[hexu(v) for v in row] for row in sorted(past)]
    return {
        **stored,
        "ring_rows": [[hexu(v) for v in row] for row in np.concatenate(pieces)],
        "write_index_after_step": [int(i) for i in index_after],
        "write_index": int(index_after[-1]) if index_after else int(index_start),
        "slot_run_counter": int(final.slot_run_counter),
        "kernel_run_counter": int(final.kernel_run_counter),
    }


@dataclasses.dataclass
class Outcome:
    """Where a scenario's steps left a world: its final snapshot, the write index before the
    first step and after each, and (on the implementation) what changed where no launch may
    write."""

    final: Snapshot
    index_start: int
    index_after: list[int]
    stray: list[str] = dataclasses.field(default_factory=list)

    def stored(self) -> dict:
        """The stored form of ``write_verify.json``: every record as u64 hex."""
        return _observed(self.final, self.index_start, self.index_after)

    def digested(self) -> dict:
        """The stored form of ``scale.json``: the records as their sha256 only."""
        return _observed(self.final, self.index_start, self.index_after, digest=True)


#: Records flipped in a long verify launch: entries spread evenly over it.
SPREAD_FAULTS = 9


def flip_spread_records(canary_buf: np.ndarray, slots: np.ndarray) -> set[int]:
    """Flip a bit of the real-KV hash of the records of :data:`SPREAD_FAULTS` entries of a
    verify launch whose checked entries name ``slots`` (in entry order), spread evenly from
    its first entry to its last: the verify of each reports it at that entry in a mode that
    reads KV (a flipped token or position is seen by the chain check of the next entry, and the
    last entry has none), so a verify that stops reading before the end misses the last ones.
    Returns the flipped slots (distinct; slot 0 is never checked and never picked)."""
    entries = [k for k, slot in enumerate(np.asarray(slots).tolist()) if slot != 0]
    picked = (
        sorted(
            {
                entries[round(i * (len(entries) - 1) / (SPREAD_FAULTS - 1))]
                for i in range(SPREAD_FAULTS)
            }
        )
        if entries
        else []
    )
    records = canary_buf[:, : reference.CANARY_SLOT_BYTES].view("<i8")
    flipped: set[int] = set()
    for n, entry in enumerate(picked):
        slot = int(slots[entry])
        if slot in flipped:
            continue
        records[slot, reference.CanaryField.REAL_KV_HASH] ^= 1 << (3 + 7 * n)
        flipped.add(slot)
    return flipped


def reported_slots(state: reference.CanaryState, since: int) -> set[int]:
    """The slots of every violation the reference reported since its write index was
    ``since``: the rows its ring stored and the rows past its capacity (``past_capacity``),
    so that a ring full before the launch still shows what the launch found."""
    now = int(state.violation_write_index[0])
    capacity = state.violation_ring.shape[0]
    field = reference.ViolationField.SLOT_IDX
    stored = state.violation_ring[max(since, 0) : max(min(now, capacity), 0), field]
    past = {row[field] for index, row in state.past_capacity if since <= index < now}
    return set(stored.tolist()) | past


def preset_records(state: reference.CanaryState, batch: st_kv.WriteBatch) -> np.ndarray:
    """The canary buffer the reference's write of ``batch`` leaves, written into a scratch
    copy of ``state`` (``state`` itself, its ring and its counters stay untouched)."""
    scratch = dataclasses.replace(
        state,
        canary_buf=state.canary_buf.copy(),
        violation_ring=state.violation_ring.copy(),
        violation_write_index=state.violation_write_index.copy(),
        past_capacity=list(state.past_capacity),
        slot_run_counter=state.slot_run_counter.copy(),
        kernel_run_counter=state.kernel_run_counter.copy(),
        enable_chain_position_assert=state.enable_chain_position_assert.copy(),
    )
    reference.write(scratch, **reference_write_launch(batch))
    return scratch.canary_buf


def reference_outcome(world: st_kv.CanaryWorld, steps) -> Outcome:
    """Where the reference's run of ``steps`` (``(op, description)`` pairs) leaves ``world``."""
    made = st_kv.materialize_world(world, "cpu")
    state = made.reference_state()
    index_start = int(state.violation_write_index[0])
    index_after = []
    for op, step in steps:
        if op == "write":
            reference.write(state, **reference_write_launch(step))
        elif op == "verify":
            reference.verify(state, **reference_verify_launch(step))
        elif op == "preset":
            state.canary_buf = preset_records(state, step)
        elif op == "corrupt":
            # Corruptions act on tensors: give the world the reference's records, damage it,
            # and take the damaged records and KV bytes back.
            made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
            st_kv.apply_corruption(made, step)
            take_damage(made, state)
        else:
            raise ValueError(f"unknown step {op!r}")
        index_after.append(int(state.violation_write_index[0]))
    return Outcome(Snapshot.of_state(state), index_start, index_after)


def reference_write_verify(world: st_kv.CanaryWorld, steps) -> dict:
    """The final state the reference reaches after ``steps`` (``(op, description)`` pairs),
    in the stored form of ``write_verify.json``."""
    return reference_outcome(world, steps).stored()


def implementation_outcome(impl, world: st_kv.CanaryWorld, steps, device) -> Outcome:
    """Where ``impl``'s run of ``steps`` leaves ``world`` on ``device``; its ``stray`` lists
    what changed that no launch may touch and the files do not store: bytes past the 32 record
    bytes of a slot, and ring rows outside the range the launches stored."""
    made = st_kv.materialize_world(world, device)
    before = Snapshot.of_world(made)
    index_after = []
    for op, step in steps:
        if op == "write":
            run_write(impl, made, step, device)
        elif op == "verify":
            run_verify(impl, made, step, device)
        elif op == "preset":
            records = preset_records(made.reference_state(), step)
            made.canary_buf.copy_(torch.from_numpy(records))
        elif op == "corrupt":
            st_kv.apply_corruption(made, step)
        else:
            raise ValueError(f"unknown step {op!r}")
        index_after.append(int(made.violation_write_index.item()))
    final = Snapshot.of_world(made)
    end = index_after[-1] if index_after else before.write_index
    stray = untouched_changes(final, before, start=before.write_index, end=end)
    return Outcome(final, before.write_index, index_after, stray)


def implementation_write_verify(
    impl, world: st_kv.CanaryWorld, steps, device
) -> tuple[dict, list[str]]:
    """What ``impl`` leaves on ``device`` after ``steps``, in the stored form of
    ``write_verify.json``, and the :attr:`Outcome.stray` changes."""
    outcome = implementation_outcome(impl, world, steps, device)
    return outcome.stored(), outcome.stray


def differences(got: dict, want: dict, ops: Sequence[str], *, limit: int = 12) -> list[str]:
    """What differs between two stored-form final states of a scenario whose steps are
    ``ops``, one line per difference, each field by name (``slot 3: prev_hash got 0x...,
    want 0x...``, ``ring row 0 (slot 7): expected_token got 0, want -1``), launch tags and
    violation bits by name, every line under 100 columns. Records are compared slot by slot
    where both states hold them, and by their ``records_sha256`` where both hold that."""
    problems = []
    for k, (g, w) in enumerate(
        zip(got["write_index_after_step"], want["write_index_after_step"], strict=True)
    ):
        if g != w:
            problems.append(f"write index after step {k} ({ops[k]}) got {g}, want {w}")
    for name in ("slot_run_counter", "kernel_run_counter"):
        if got[name] != want[name]:
            problems.append(f"{name} got {got[name]}, want {want[name]}")
    if "records_sha256" in got and "records_sha256" in want:
        if got["records_sha256"] != want["records_sha256"]:
            problems.append(
                f"records_sha256 got {got['records_sha256'][:16]}..., "
                f"want {want['records_sha256'][:16]}..."
            )
    for slot, (g, w) in enumerate(
        zip(got.get("records", ()), want.get("records", ()), strict=True)
    ):
        if g == w:
            continue
        g_values = [from_hexu(v) for v in g]
        w_values = [from_hexu(v) for v in w]
        for line in field_differences(RECORD_FIELDS, g_values, w_values):
            problems.append(f"slot {slot}: {line}")
    got_rows = [[from_hexu(v) for v in row] for row in got["ring_rows"]]
    want_rows = [[from_hexu(v) for v in row] for row in want["ring_rows"]]
    past = [[from_hexu(v) for v in row] for row in want.get("ring_rows_past_capacity", ())]
    if past:
        problems += chosen_row_differences(got_rows, want_rows, past, limit=limit)
    else:
        if len(got_rows) != len(want_rows):
            problems.append(f"{len(got_rows)} ring rows stored, want {len(want_rows)}")
        problems += ring_row_differences(got_rows, want_rows, limit=limit)
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems
