"""The golden write/verify scenarios (``write_verify.json``), listed by hand: no Hypothesis draws.

Each is a dict with a stable ``id``, a one-line ``what``, a :class:`~strategies.CanaryWorld`
and its steps (``write``: a :class:`~strategies.WriteBatch`, ``corrupt``: a
:class:`~strategies.Corruption`, ``verify``: a :class:`~strategies.VerifyBatch`), each launch
defined by CONTRACT §6; :mod:`conformance.golden` adds the reference's final state and stores it.

One more op serves large worlds (``scale.json``, :mod:`conformance.golden.scale_scenarios`):
``preset``, a :class:`~strategies.WriteBatch` that the *reference* writes into a scratch copy
of the state, of which only the resulting canary records are given to the world, on the
reference's side and on the implementation's alike (``conformance.write_verify_support``).
The implementation never runs that write, and its ring, write index and counters stay as they
were: it lays down tens of thousands of chained records for a verify without the
implementation's write, which is slow under Triton's CPU interpreter.
"""

from __future__ import annotations

import dataclasses

import strategies as st_kv
from strategies import CanaryWorld, Corruption, SourceLayout, VerifyBatch, WriteBatch, WriteRequest
from strategies.chains import INT64_MAX, INT64_MIN

__all__ = ["check_steps", "write_verify_scenarios"]

# Every kind of byte no slot reads: a hole in each row, a gap between rows, bytes before the
# view and after it.
_PADDING = dict(hole_bytes=16, gap_bytes=16, offset_bytes=16, tail_bytes=3)
_KV = st_kv.layout(
    dtype="float16", rows=3, page_size=4, num_bytes_per_token=32, seed=200, **_PADDING
)


def _world(**changes) -> CanaryWorld:
    """The world of a scenario, :func:`strategies.world` with one source (``_KV``), 12 slots
    and a ring of 8 unless ``changes`` say otherwise."""
    return st_kv.world(**{"sources": (_KV,), "num_slots": 12, "ring_capacity": 8, **changes})


def _request(seed, slots, *, first_position=0, tokens=None, positions=None) -> WriteRequest:
    """Positions count up from ``first_position`` and tokens follow the slots, unless given."""
    if positions is None:
        positions = [first_position + i for i in range(len(slots))]
    if tokens is None:
        tokens = [1000 + 37 * slot for slot in slots]
    return WriteRequest(seed, tuple(slots), tuple(tokens), tuple(positions))


def _write(*requests, num_valid=None, padding=(), leading=(), mismatches=None) -> WriteBatch:
    """A write batch; ``mismatches`` ({entry: 'token'|'position'|'both'}) turns the input assert on."""
    batch = WriteBatch(
        tuple(requests),
        len(requests) if num_valid is None else num_valid,
        tuple(padding),
        False,
        (),
        (),
        tuple(leading),
    )
    if mismatches is None:
        return batch
    ids, positions, _ = batch.token_arrays()
    expected_tokens = [
        t ^ 1 if mismatches.get(i) in ("token", "both") else t for i, t in enumerate(ids)
    ]
    expected_positions = [
        p ^ 2 if mismatches.get(i) in ("position", "both") else p for i, p in enumerate(positions)
    ]
    return dataclasses.replace(
        batch,
        input_assert=True,
        expected_tokens=tuple(expected_tokens),
        expected_positions=tuple(expected_positions),
    )


def _verify(entries, *, num_valid=None, enable=1, check_token=True) -> VerifyBatch:
    """A verify batch from ``(slot, expected token, expected position, prev slot)`` entries."""
    columns = [tuple(column) for column in zip(*entries, strict=True)]
    return VerifyBatch(
        *columns,
        num_valid=len(entries) if num_valid is None else num_valid,
        enable=enable,
        check_token=check_token,
    )


def _exact(*batches: WriteBatch, **changes) -> VerifyBatch:
    """The plan that verifies the chains ``batches`` wrote, clean right after the writes."""
    chains = ()
    for batch in batches:
        chains += st_kv.chains_written(batch)
    return _verify(st_kv.plan_for_chains(chains), **changes)


def _window_byte(layout: SourceLayout, slot: int, byte: int) -> int:
    return int(st_kv.slot_window_starts(layout)[slot]) + byte


def check_steps(world: CanaryWorld, steps) -> None:
    """Keep hand-written launches defined (CONTRACT §6): no slot written twice, none a seed (a
    ``preset`` write too: the reference runs it)."""
    for op, step in steps:
        if op not in ("write", "preset"):
            continue
        _, _, slots = step.token_arrays()
        written = [s for s in slots if s >= 0]
        seeds = {r.seed for r in step.requests if r.seed >= 0}
        if len(set(written)) != len(written) or seeds & set(written):
            raise ValueError(f"undefined write launch {step!r}")
        if any(s >= world.num_slots for s in written) or any(s >= world.num_slots for s in seeds):
            raise ValueError(f"slot out of range in {step!r}")


#: The op of each kind of step written by hand (``preset`` serves the scale scenarios only).
_OPS = {WriteBatch: "write", Corruption: "corrupt", VerifyBatch: "verify"}


def _scenario(vid: str, what: str, world: CanaryWorld, steps) -> dict:
    check_steps(world, steps)
    return {
        "id": vid,
        "what": what,
        "world": world,
        "steps": [{op: step} for op, step in steps],
    }


def write_verify_scenarios() -> list[dict]:
    """The write/verify scenarios, without their final states, in file order."""
    out = []

    def add(vid, what, world, *steps):
        """A scenario of ``steps``, each named by its kind: a write, a corruption or a verify."""
        out.append(_scenario(vid, what, world, [(_OPS[type(step)], step) for step in steps]))

    # Clean runs.
    w = _write(_request(-1, (3, 5, 7, 2), tokens=(11, 2**40 + 1, INT64_MIN, -1)))
    add(
        "wv-anchor-chain-clean",
        "one chain from the anchor, then its exact verify: no report",
        _world(),
        w,
        _exact(w),
    )
    w1 = _write(_request(-1, (1, 4), first_position=10), _request(-1, (6,)))
    w2 = _write(
        _request(4, (8, 9), first_position=12),
        _request(6, (10,), first_position=1),
        _request(-1, (11,), first_position=5),
    )
    add(
        "wv-seeded-continuation-clean",
        "two chains continued from their tails in a second launch, one new: no report",
        _world(seed=2),
        w1,
        w2,
        _exact(w1, w2),
    )

    # Write asserts.
    add(
        "wv-input-assert-mismatches",
        "input assert: one clean entry, then token, position and both mismatching",
        _world(seed=3, kernel_kind=1),
        _write(_request(-1, (2, 3, 4, 5)), mismatches={1: "token", 2: "position", 3: "both"}),
    )
    w1 = _write(_request(-1, (2, 3), first_position=100))
    add(
        "wv-input-and-position-assert",
        "a seeded entry failing its input assert and its chain position assert: two rows",
        _world(seed=4, kernel_kind=2),
        w1,
        _write(_request(3, (5, 6), positions=(103, 104)), mismatches={0: "position"}),
    )
    w1 = _write(_request(-1, (2, 3), first_position=100))
    jumps = _request(3, (5, -1, 6, 7, 8), positions=(103, 999, 103, 104, 50))
    for vid, chain_assert, what in (
        (
            "wv-position-assert-jumps",
            1,
            "seeded positions jump, repeat and fall back; -1 entries skip",
        ),
        ("wv-position-assert-off", 0, "the same jumps with enable_chain_position_assert 0: no row"),
        (
            "wv-position-assert-enable-7",
            7,
            "the same jumps with enable_chain_position_assert 7: on",
        ),
        (
            "wv-position-assert-enable-minus-1",
            -1,
            "the same jumps with enable_chain_position_assert -1: on (any value but 0)",
        ),
    ):
        add(
            vid,
            what,
            _world(seed=5, chain_assert=chain_assert),
            w1,
            _write(jumps),
        )
    add(
        "wv-position-assert-anchor-is-off",
        "a request from the anchor never checks positions, whatever they are",
        _world(seed=6),
        _write(_request(-1, (1, 2, 3), positions=(5, 5, -7))),
    )
    w1 = _write(_request(-1, (1, 2), positions=(INT64_MAX - 1, INT64_MAX)))
    w2 = _write(
        _request(2, (3, 4), positions=(INT64_MIN, INT64_MIN + 1)),
        _request(2, (5,), positions=(0,)),
    )
    add(
        "wv-position-wrap",
        "the successor of 2**63-1 is -2**63; a fork at 0 expects -2**63; then a clean verify",
        _world(seed=7),
        w1,
        w2,
        _exact(w1, w2),
    )

    # The ring.
    w = _write(_request(-1, (1, 2, 3, 4, 5, 6), first_position=20))
    bad = _exact(w)
    bad = dataclasses.replace(bad, expected_positions=tuple(p ^ 1 for p in bad.expected_positions))
    for vid, what, world in (
        (
            "wv-ring-overflow",
            "six violations into a 3-row ring at index 1: two stored, the index counts to 7",
            _world(seed=8, ring_capacity=3, ring_start=1),
        ),
        (
            "wv-ring-full",
            "a full ring (index == capacity): nothing stored, the index still counts",
            _world(seed=9, ring_capacity=4, ring_start=4),
        ),
        (
            "wv-ring-past-capacity",
            "an index already past the capacity keeps counting",
            _world(seed=10, ring_capacity=4, ring_start=7),
        ),
        (
            "wv-ring-negative-start",
            "a write index driven to -2: the indices below 0 store nothing and keep counting",
            _world(seed=35, ring_capacity=4, ring_start=-2),
        ),
    ):
        add(vid, what, world, w, bad)
    two_bad = _exact(w)
    two_bad = dataclasses.replace(
        two_bad,
        expected_positions=tuple(
            p ^ 1 if i < 2 else p for i, p in enumerate(two_bad.expected_positions)
        ),
    )
    add(
        "wv-ring-negative-start-partial",
        "a write index at -1 and two violations: index -1 stores nothing (the ring's last row "
        "stays as it was), index 0 stores its row",
        _world(seed=40, ring_capacity=4, ring_start=-1),
        w,
        two_bad,
    )
    add(
        "wv-ring-capacity-0",
        "a ring of no rows: write assert violations are only counted",
        _world(seed=11, ring_capacity=0),
        _write(_request(-1, (2, 3, 4)), mismatches={0: "both", 2: "token"}),
    )

    # num_valid, enable, padding.
    add(
        "wv-write-num-valid-above-capacity",
        "write_num_valid_reqs 4 of capacity 2 clamps to 2",
        _world(seed=12),
        _write(_request(-1, (1, 2)), _request(-1, (3,)), num_valid=4),
    )
    add(
        "wv-write-num-valid-negative",
        "write_num_valid_reqs -1: nothing written or asserted, only the launch counted",
        _world(seed=13),
        _write(_request(-1, (1, 2)), _request(-1, (3,)), num_valid=-1, mismatches={0: "token"}),
    )
    add(
        "wv-write-num-valid-partial-and-padding",
        "1 of 3 requests valid, then padding entries no request covers: never written",
        _world(seed=14),
        _write(
            _request(-1, (1, 2)),
            _request(-1, (3, 4)),
            _request(-1, (5,)),
            num_valid=1,
            padding=((6, 77, 0), (7, 78, 0)),
            mismatches={2: "token", 5: "both"},
        ),
    )
    w1 = _write(
        _request(-1, (1, -1, 2, -1), positions=(0, 50, 1, 60)),
        _request(-1, ()),
        _request(-1, (-1, -1)),
    )
    w2 = _write(_request(2, (-1, 3, 4), positions=(70, 2, 3)))
    add(
        "wv-write-skipped-and-empty-requests",
        "-1 entries neither write nor advance the chain or prev position; empty requests skip",
        _world(seed=15),
        w1,
        w2,
        _exact(w1, w2),
    )
    # a one-slot write lays down the seed a request of ``w`` continues, then ``w`` is verified
    for vid, what, seed, w in (
        (
            "wv-write-empty-last-request",
            "the last request is empty: it writes nothing, and reads no entry (its start is the "
            "end of the arrays)",
            37,
            _write(_request(-1, (1, 2)), _request(4, (5, 6)), _request(-1, ())),
        ),
        (
            "wv-write-offsets-start-past-0",
            "write_offsets starts at 2: the two entries before the first request are never "
            "written, checked or counted",
            38,
            _write(
                _request(-1, (3, 4)),
                _request(1, (5,), first_position=9),
                leading=((6, 66, 0), (7, 67, 1)),
                mismatches={0: "both", 2: "token"},
            ),
        ),
    ):
        seeds = [r.seed for r in w.requests if r.seed >= 0]
        add(vid, what, _world(seed=seed), _write(_request(-1, seeds)), w, _exact(w))
    w = _write(_request(-1, (1, 2, 3), first_position=40))
    entries = st_kv.plan_for_chains(st_kv.chains_written(w))
    wrong = [(s, t, p ^ 4, prev) for s, t, p, prev in entries]
    add(
        "wv-verify-num-valid-clamp",
        "verify_num_valid 9 of 3 entries clamps to 3; -2 verifies nothing",
        _world(seed=16),
        w,
        _verify(wrong, num_valid=9),
        _verify(wrong, num_valid=-2),
    )
    add(
        "wv-verify-disabled",
        "enable 0: only kernel_run_counter moves, even with slots no buffer has",
        _world(seed=17),
        w,
        _verify([(99, 5, 7, 2**40), (-3, 5, 7, 12), (1, 5, 7, -9)], num_valid=3, enable=0),
    )
    add(
        "wv-verify-enable-2",
        "enable 2 runs like 1",
        _world(seed=18),
        w,
        _verify(wrong, enable=2),
    )
    w = _write(_request(-1, (0, 3, 4), first_position=8))
    e = st_kv.plan_for_chains(st_kv.chains_written(w))
    add(
        "wv-slot-0-padding",
        "slot 0 is written like any slot; verify skips it (counted) and prev 0 checks no chain",
        _world(seed=19),
        w,
        _verify(
            [
                (0, 123, 999, -1),
                e[1],
                (e[2][0], e[2][1], e[2][2] ^ 1, e[2][3]),
                (0, -1, 0, 0),
                (0, -1, 0, 0),
            ]
        ),
    )
    w = _write(_request(-1, (2, 3), first_position=5))
    e = st_kv.plan_for_chains(st_kv.chains_written(w))
    add(
        "wv-verify-one-checked-entry-reports",
        "the plan's one checked entry (the others are padding) has a wrong position: reported",
        _world(seed=39),
        w,
        _verify([(0, -1, 0, 0), (e[1][0], e[1][1], e[1][2] ^ 1, e[1][3]), (0, -1, 0, 0)]),
    )

    # Verify plans.
    w = _write(_request(-1, (2, 3, 4, 5), first_position=30))
    e = st_kv.plan_for_chains(st_kv.chains_written(w))
    add(
        "wv-verify-prev-slot-variants",
        "prev -1 and -2 expect the anchor, prev 0 is unchecked, after a prev_hash bit flip",
        _world(seed=20),
        w,
        Corruption("field", slot=3, field=2, bit=5),
        _verify([(2, *e[0][1:3], -1), e[1], (4, *e[2][1:3], 0), e[3]]),
        _verify([(2, *e[0][1:3], -2), (3, *e[1][1:3], 0), e[2], (5, *e[3][1:3], 0)]),
    )
    tokens_plan = [
        (e[0][0], e[0][1] ^ 4, *e[0][2:]),
        (e[1][0], -1, *e[1][2:]),
        (e[2][0], e[2][1] ^ 4, e[2][2] ^ 8, e[2][3]),
        e[3],
    ]
    for vid, check, what in (
        ("wv-verify-token-check-on", True, "wrong expected tokens reported; -1 never checked"),
        ("wv-verify-token-check-off", False, "the same plan with the token check off"),
    ):
        add(
            vid,
            what,
            _world(seed=21, kernel_kind=5),
            w,
            _verify(tokens_plan, check_token=check),
        )
    add(
        "wv-verify-token-check-negative",
        "expected tokens -2 and INT64_MIN are checked like any other; only -1 means unchecked",
        _world(seed=36, kernel_kind=5),
        w,
        _verify([(e[0][0], -2, *e[0][2:]), (e[1][0], INT64_MIN, *e[1][2:]), *e[2:]]),
    )
    w = _write(
        _request(-1, (1, 2, 3), tokens=(INT64_MIN, INT64_MAX, 0), first_position=-3),
        _request(-1, (4, 5), tokens=(-1, 2**62)),
    )
    add(
        "wv-extreme-tokens",
        "tokens at the int64 edges, -1 and 0 round-trip and verify clean",
        _world(seed=22),
        w,
        _exact(w),
    )

    # Corruptions of two written chains.
    two_chains = _write(
        _request(-1, (1, 2, 3), first_position=7),
        _request(-1, (5, 6, 7, 8), first_position=0),
    )

    def corrupted(vid, what, world, *corruption):
        """A scenario that writes both chains, corrupts, then verifies both exactly."""
        add(vid, what, world, two_chains, *corruption, _exact(two_chains))

    # one bit of each canary field: (field, slot, bit)
    for field, (slot, bit) in enumerate(((2, 0), (6, 63), (7, 17), (1, 40))):
        name = ("token", "position", "prev_hash", "real_kv_hash")[field]
        corrupted(
            f"wv-corrupt-{name.replace('_', '-')}-bit-{bit}",
            f"bit {bit} of slot {slot}'s {name}, then the exact verify of both chains",
            _world(seed=23, ring_capacity=16, kernel_kind=3),
            Corruption("field", slot=slot, field=field, bit=bit),
        )
    others = {
        "wv-corrupt-kv-byte": (
            "the last read byte of slot 6's KV window",
            Corruption("kv_inside", slot=6, source=0, offset=_window_byte(_KV, 6, 31), value=0x80),
        ),
        "wv-corrupt-page-swap": (
            "rows 0 and 2 of the source swapped",
            Corruption("page_swap", 0, 2),
        ),
        "wv-corrupt-stale-record": ("slot 3 holds slot 6's record", Corruption("stale", 3, 6)),
    }
    for vid, (what, corruption) in others.items():
        corrupted(
            vid,
            f"{what}, then the exact verify of both chains",
            _world(seed=23, ring_capacity=16, kernel_kind=3),
            corruption,
        )
    # _KV's buffer: 16 bytes, rows of 128 slot bytes + a 16 B hole every 160 B, 3 tail bytes.
    unread = [5, 16 + 128 + 3, 16 + 144 + 7, 16 + 2 * 160 + 144 + 1]
    corrupted(
        "wv-corrupt-kv-unread-bytes",
        "bytes no slot reads change (before the view, a hole, a row gap, the tail): no report",
        _world(seed=23, ring_capacity=16, kernel_kind=3),
        *[Corruption("kv_outside", source=0, offset=o, value=0xFF) for o in unread],
    )
    # PARTIAL reads the first 16 bytes of a slot's window
    for vid, what, kind, byte in (
        ("wv-corrupt-kv-byte-partial", "is read and reported", "kv_inside", 15),
        ("wv-corrupt-kv-byte-past-16-partial", "is not read: no report", "kv_outside", 16),
    ):
        corrupted(
            vid,
            f"PARTIAL: byte {byte} of slot 5's window {what}",
            _world(seed=24, mode=1, ring_capacity=16),
            Corruption(kind, slot=5, source=0, offset=_window_byte(_KV, 5, byte), value=1),
        )
    corrupted(
        "wv-mode-none-kv-byte",
        "mode NONE stores real_kv_hash 0 and reads no KV byte: a changed byte is not reported",
        _world(seed=25, mode=0, ring_capacity=16),
        Corruption("kv_outside", slot=5, source=0, offset=_window_byte(_KV, 5, 0), value=1),
    )
    corrupted(
        "wv-no-sources",
        "mode ALL without sources stores real_kv_hash 0",
        _world(seed=26, sources=(), ring_capacity=16),
        Corruption("field", slot=8, field=3, bit=2),
    )
    four = (
        _KV,
        st_kv.layout(
            dtype="bfloat16", rows=12, page_size=1, num_bytes_per_token=48, read_bytes=32, seed=201
        ),
        st_kv.layout(
            dtype="uint8", rows=1, page_size=16, num_bytes_per_token=16, offset_bytes=32, seed=202
        ),
        st_kv.layout(
            dtype="int32", rows=6, page_size=2, num_bytes_per_token=32, row_shape=(2, 8), seed=203
        ),
    )
    corrupted(
        "wv-four-sources",
        "four sources; a byte of source 3 in slot 7's window changes",
        _world(seed=27, sources=four, ring_capacity=16),
        Corruption("kv_inside", slot=7, source=3, offset=_window_byte(four[3], 7, 20), value=0x10),
    )
    corrupted(
        "wv-second-source-page-swap",
        "two sources; rows 1 and 5 of source 1 swap",
        _world(seed=28, sources=four[:2], ring_capacity=16),
        Corruption("page_swap", slot=1, other=5, source=1),
    )
    corrupted(
        "wv-slot-stride-40-kind-11",
        "40-byte canary slots (bytes past 32 untouched), kernel kind 11 stamped into rows",
        _world(seed=29, slot_stride_bytes=40, kernel_kind=11, ring_capacity=16),
        Corruption("field", slot=5, field=1, bit=1),
    )
    add(
        "wv-slot-stride-64-partial",
        "64-byte canary slots in PARTIAL mode, with a stale record",
        _world(seed=30, slot_stride_bytes=64, mode=1, ring_capacity=16),
        two_chains,
        Corruption("stale", slot=6, other=2),
        _exact(two_chains, check_token=False),
    )

    # Edges found by mutation testing (strength/mutation/survivors/).
    w1 = _write(_request(-1, (0, 3), first_position=50))
    add(
        "wv-seed-slot-0",
        "a chain continued from slot 0, a real slot (only a negative seed is the anchor), "
        "with one position jump",
        _world(seed=31),
        w1,
        _write(_request(0, (5, 6), positions=(51, 60))),
    )
    add(
        "wv-input-assert-expected-positions-above",
        "input assert: expected positions above the given ones are reported too",
        _world(seed=32),
        _write(_request(-1, (2, 3, 4)), mismatches={0: "position", 1: "both"}),
    )
    w = _write(_request(-1, (1, 2, 3), first_position=40))
    wrong = [
        (s, t, p ^ 4, prev) for s, t, p, prev in st_kv.plan_for_chains(st_kv.chains_written(w))
    ]
    add(
        "wv-verify-enable-minus-1",
        "enable -1 runs like 1 (any value but 0)",
        _world(seed=33),
        w,
        _verify(wrong, enable=-1),
    )
    add(
        "wv-verify-past-one-program",
        "133 plan entries, two programs of 128: the reported entries are in the second",
        _world(seed=34),
        w,
        _verify([(0, -1, 0, 0)] * 130 + wrong),
    )
    return out


# ---------------------------------------------------------------------------------------------
