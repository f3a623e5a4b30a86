"""Write/verify glue of the suite (CONTRACT §5-§7): run a launch on the implementation and on
the reference, snapshot what a launch may change, compare two states field by field, and tell
what was done as a snippet that repeats it.

The fingerprint side and what both share live in :mod:`conformance.support`; how differences
are worded lives in :mod:`conformance.assertions`.
"""

from __future__ import annotations

import dataclasses
import pprint

import numpy as np

import reference
import strategies as st_kv
from conformance.assertions import fail, record_differences, ring_row_differences
from conformance.support import import_impl_lines

__all__ = [
    "Snapshot",
    "assert_same_state",
    "batch_number",
    "bit_names",
    "check_world",
    "code",
    "reports_of",
    "run_verify",
    "run_write",
    "story",
    "take_damage",
]


@dataclasses.dataclass
class Snapshot:
    """The observable state of a world: what the contract says a launch may change."""

    canary_buf: np.ndarray
    ring: np.ndarray
    write_index: int
    slot_run_counter: int
    kernel_run_counter: int

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
        )

    def new_rows(self, since: int) -> np.ndarray:
        """Rows stored since write index ``since``, sorted (order in a launch is unspecified)."""
        stored = self.ring[min(since, len(self.ring)) : min(self.write_index, len(self.ring))]
        return stored[np.lexsort(stored.T[::-1])] if len(stored) else stored


def story(impl, device, made: st_kv.MaterializedWorld) -> str:
    """The calls made on ``made`` so far, as a snippet that repeats them, has the reference
    repeat them too, and asserts after each launch that both hold the same state; pasted into
    a Python shell at the repository's root, it fails where the test failed."""
    lines = [
        *import_impl_lines(impl.__name__, device),
        "from strategies import *",
        "from conformance.write_verify_support import check_world, take_damage",
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


def code(name: str, value) -> str:
    """``name = value`` with the value's repr wrapped to keep lines under 100 columns."""
    return f"{name} = " + pprint.pformat(value, width=90, sort_dicts=False).replace(
        "\n", "\n" + " " * (len(name) + 3)
    )


def assert_same_state(
    got: Snapshot, want: Snapshot, *, index_before: int, what: str, config: str, repro: str = ""
):
    """Two states agree: buffer bytes, ring rows (as a multiset within the launch), index, counters.

    A difference is named field by field: ``slot 3: prev_hash got 0x..., want 0x...``,
    ``ring row 0 (slot 7): expected_token got 0, want -1``.
    """
    __tracebackhide__ = True
    problems = []
    for name in ("write_index", "slot_run_counter", "kernel_run_counter"):
        if getattr(got, name) != getattr(want, name):
            problems.append(f"{name} got {getattr(got, name)}, want {getattr(want, name)}")
    if not np.array_equal(got.canary_buf[:, 32:], want.canary_buf[:, 32:]):
        slots = np.flatnonzero((got.canary_buf[:, 32:] != want.canary_buf[:, 32:]).any(axis=1))
        problems.append(f"canary_buf bytes past 32 changed in slots {slots.tolist()}")
    records = [np.ascontiguousarray(s.canary_buf[:, :32]).view("<i8") for s in (got, want)]
    problems += record_differences(*records)
    cap = len(want.ring)
    start, end = min(index_before, cap), min(want.write_index, cap)
    untouched = np.r_[0:start, end:cap]
    stray = untouched[(got.ring[untouched] != want.ring[untouched]).any(axis=1)]
    if stray.size:
        problems.append(
            f"ring rows {stray.tolist()} changed, outside this launch's rows [{start}, {end}) "
            "(a wrapping or stray store)"
        )
    problems += ring_row_differences(got.new_rows(index_before), want.new_rows(index_before))
    if problems:
        fail(f"{what}:\n  " + "\n  ".join(problems), config=config, repro=repro)


def run_write(impl, world, batch, device, state=None):
    """Write ``batch`` with the implementation and (if given) the reference state."""
    world.log.append(
        "\n".join(
            [
                code("batch", batch),
                "impl.launch_canary_write_kernel(context=made.context(impl), "
                "**write_launch(impl, batch, device))",
                "reference.write(state, **reference_write_launch(batch))",
                f'check_world(made, state, "after launch {batch_number(world)} (write)")',
            ]
        )
    )
    impl.launch_canary_write_kernel(
        context=world.context(impl), **st_kv.write_launch(impl, batch, device)
    )
    if state is not None:
        reference.write(state, **st_kv.reference_write_launch(batch))


def run_verify(impl, world, batch, device, state=None):
    """Verify ``batch`` with the implementation and (if given) the reference state."""
    world.log.append(
        "\n".join(
            [
                code("batch", batch),
                "impl.launch_canary_verify_kernel(context=made.context(impl), "
                "**verify_launch(impl, batch, device))",
                "reference.verify(state, **reference_verify_launch(batch))",
                f'check_world(made, state, "after launch {batch_number(world)} (verify)")',
            ]
        )
    )
    impl.launch_canary_verify_kernel(
        context=world.context(impl), **st_kv.verify_launch(impl, batch, device)
    )
    if state is not None:
        reference.verify(state, **st_kv.reference_verify_launch(batch))


def batch_number(world) -> int:
    """How many launches ``world`` has seen before this one (its log's launch entries)."""
    return sum(1 for entry in world.log if entry.startswith("batch = "))


def reports_of(snapshot: Snapshot, since: int) -> dict[int, int]:
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
    names = {1: "CHAIN", 2: "POSITION", 4: "REAL_KV", 8: "W_TOKEN", 16: "W_POSITION", 32: "TOKEN"}
    return (
        "{"
        + ", ".join(
            f"{slot}: " + "|".join(n for b, n in names.items() if bits & b)
            for slot, bits in sorted(reports.items())
        )
        + "}"
    )


# Helpers the reproduction snippets call (see story).


def check_world(made, state, what: str) -> None:
    """The implementation's world ``made`` holds what the reference ``state`` holds: records,
    write index, counters and ring rows (compared as a multiset: row order inside a launch is
    unspecified). Raises an AssertionError naming each differing field."""
    got = made.reference_state()
    problems = []
    for name in ("violation_write_index", "slot_run_counter", "kernel_run_counter"):
        g, w = int(getattr(got, name)[0]), int(getattr(state, name)[0])
        if g != w:
            problems.append(f"{name} got {g}, want {w}")
    if not np.array_equal(got.canary_buf[:, 32:], state.canary_buf[:, 32:]):
        problems.append("canary_buf bytes past the 32 record bytes changed")
    records = [np.ascontiguousarray(s.canary_buf[:, :32]).view("<i8") for s in (got, state)]
    problems += record_differences(*records)
    # rows each side stored (below its own write index), as a multiset; the rest untouched
    cap = len(state.violation_ring)
    got_end = min(int(got.violation_write_index[0]), cap)
    want_end = min(int(state.violation_write_index[0]), cap)
    problems += ring_row_differences(got.violation_ring[:got_end], state.violation_ring[:want_end])
    rest = max(got_end, want_end)
    stray = np.flatnonzero((got.violation_ring[rest:] != state.violation_ring[rest:]).any(axis=1))
    if stray.size:
        problems.append(f"ring rows {(stray + rest).tolist()} changed past the stored rows")
    assert not problems, f"{what}:\n  " + "\n  ".join(problems)


def take_damage(made, state) -> None:
    """Give the reference ``state`` the damage a corruption did to ``made``: its canary
    records and KV bytes as they are now (ring and counters are untouched by corruptions)."""
    fresh = made.reference_state()
    state.canary_buf = fresh.canary_buf
    state.real_kv_sources = fresh.real_kv_sources
