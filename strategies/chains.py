"""Write and verify launches as plain data: worlds, write batches, verify plans, ring states
and corruptions (CONTRACT §5-§7).

A :class:`CanaryWorld` is everything a launch sees besides its plan: the KV sources and
mode, the canary buffer, the violation ring and the counters. A :class:`WriteBatch` is one
write launch; :func:`chains_written` says which chains it leaves behind, and
:func:`verify_batches` draws verify plans over those chains. :func:`corruptions` draws one
thing going wrong between the write and the verify (the reports it must cause are worked out
by ``conformance.write_verify_support.expected_reports``). :mod:`strategies.materialize`
turns all of these into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
from hypothesis.errors import InvalidArgument

from strategies.layouts import SourceLayout, capacity_edges, slot_window_starts, source_tuples
from strategies.sizes import sizes

__all__ = [
    "CHAIN",
    "CORRUPTION_KINDS",
    "POSITION",
    "REAL_KV",
    "TOKEN",
    "WRITE_POSITION",
    "WRITE_TOKEN",
    "CanaryWorld",
    "Chain",
    "Corruption",
    "VerifyBatch",
    "WriteBatch",
    "WriteRequest",
    "canary_worlds",
    "chains_written",
    "corruption_kinds",
    "corruptions",
    "plan_for_chains",
    "ring_starts",
    "verify_batches",
    "write_batches",
]

# FailReason bits (CONTRACT §1), as plain ints so that descriptions stay torch- and enum-free.
CHAIN, POSITION, REAL_KV, WRITE_TOKEN, WRITE_POSITION, TOKEN = 1, 2, 4, 8, 16, 32

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_FIELD_NAMES = ("token", "position", "prev_hash", "real_kv_hash")


@dataclass(frozen=True)
class CanaryWorld:
    """What a write or verify launch sees besides its plan.

    ``num_slots`` canary slots of ``slot_stride_bytes`` each (bytes past 32 of a slot are
    never touched); every source addresses at least ``num_slots`` slots. The ring holds
    ``ring_capacity`` rows and its write index starts at ``ring_start`` (which may already
    be at or past the capacity). The buffer, the ring and the counters start with random
    non-zero contents drawn from ``seed``, so stray writes show.

    Example draw::

        CanaryWorld(sources=(SourceLayout(dtype='bfloat16', rows=3, ...),), mode=2,
                    num_slots=12, slot_stride_bytes=40, ring_capacity=4, ring_start=3,
                    kernel_kind=7, chain_assert=1, seed=99)
    """

    sources: tuple[SourceLayout, ...]
    mode: int
    num_slots: int
    slot_stride_bytes: int
    ring_capacity: int
    ring_start: int
    kernel_kind: int
    chain_assert: int
    seed: int

    @property
    def reads_kv(self) -> bool:
        """Whether launches fingerprint real KV bytes (a mode other than NONE, and sources)."""
        return self.mode != 0 and bool(self.sources)


def ring_starts(ring_capacity: int) -> st.SearchStrategy[int]:
    """Initial write indices: empty, partly full, one short, exactly full, already past.

    Example draw from ``ring_starts(4)``: ``4`` (exactly full: every new row is counted, none stored).
    """
    return st.sampled_from(
        sorted({0, ring_capacity // 2, max(ring_capacity - 1, 0), ring_capacity, ring_capacity + 3})
    )


_MODE_VALUES = (0, 1, 2)  # RealKvHashMode NONE, PARTIAL, ALL
_READING_MODES = (1, 2)  # the modes that read KV bytes


def canary_worlds(
    *,
    min_slots: int = 4,
    max_slots: int = 16,
    min_sources: int = 0,
    max_sources: int = 2,
    max_ring: int = 6,
    modes=_MODE_VALUES,
    reads_kv: bool | None = None,
    min_ring: int = 0,
    **layout_kwargs,
) -> st.SearchStrategy[CanaryWorld]:
    """Worlds for write/verify launches; ``layout_kwargs`` go to :func:`source_tuples`.

    ``modes`` is a tuple of RealKvHashMode values (ints) to sample the mode from, or a
    strategy drawing them. ``reads_kv=True`` draws only worlds that fingerprint real KV
    bytes (:attr:`CanaryWorld.reads_kv`): at least one source and a mode of ``modes`` that
    reads (PARTIAL or ALL), by construction rather than by rejection; a strategy given as
    ``modes`` must then draw only those. ``None`` (the default) puts no such condition.
    Without these options, draws are those of the strategy before they existed.

    ``num_slots`` and ``ring_capacity`` (from ``min_ring``) are drawn by
    :func:`strategies.sizes`: worlds of 2^k +- 1 slots and rings of 2^k +- 1 rows come up
    often. An engine-scale world (``max_slots=2**17``, ``min_ring=1024``) also needs the
    layouts to reach that far: ``max_rows``, ``max_page_size`` and, to bound memory,
    ``max_capacity`` go to :func:`source_tuples` with the other ``layout_kwargs``.

    Example draw from ``canary_worlds(reads_kv=True)``::

        CanaryWorld(sources=(SourceLayout(dtype='int8', rows=2, ...),), mode=1, num_slots=9,
                    slot_stride_bytes=32, ring_capacity=0, ring_start=3, ...)
    """
    arguments = dict(locals())  # every option by name, passed on once checked
    if not isinstance(min_slots, int) or not isinstance(max_slots, int):
        raise InvalidArgument(f"min_slots={min_slots!r} and max_slots={max_slots!r} must be ints")
    if not 2 <= min_slots <= max_slots:
        raise InvalidArgument(f"need 2 <= min_slots={min_slots} <= max_slots={max_slots}")
    for name, value, lo, hi in (
        ("max_sources", max_sources, 0, 6),
        ("min_sources", min_sources, 0, max_sources if isinstance(max_sources, int) else 6),
        ("max_ring", max_ring, 0, 2**20),
        ("min_ring", min_ring, 0, max_ring if isinstance(max_ring, int) else 2**20),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise InvalidArgument(f"{name}={value!r} must be an int in [{lo}, {hi}]")
    if reads_kv is not None and reads_kv is not True:
        raise InvalidArgument(
            f"reads_kv={reads_kv!r} must be None or True (for worlds that read no KV bytes "
            "pass modes=(0,) or max_sources=0)"
        )
    if isinstance(modes, st.SearchStrategy):
        mode_strategy = modes
    else:
        modes = tuple(modes) if isinstance(modes, (tuple, list)) else modes
        if (
            not isinstance(modes, tuple)
            or not modes
            or any(isinstance(m, bool) or m not in _MODE_VALUES for m in modes)
        ):
            raise InvalidArgument(
                f"modes={modes!r} must be a strategy or a non-empty tuple of {_MODE_VALUES}"
            )
        if reads_kv:
            modes = tuple(m for m in modes if m in _READING_MODES)
            if not modes:
                raise InvalidArgument("reads_kv=True needs a mode that reads (1 or 2) in modes")
        mode_strategy = st.sampled_from(modes)
    if reads_kv:
        if max_sources == 0:
            raise InvalidArgument("reads_kv=True needs max_sources >= 1")
        min_sources = max(min_sources, 1)
    layout_kwargs.setdefault("max_rows", 8)
    layout_kwargs.setdefault("max_page_size", 8)
    # Built now, so that bad layout arguments raise here, not at the first draw.
    source_tuples(
        min_sources=min_sources, max_sources=max_sources, min_capacity=max_slots, **layout_kwargs
    )
    return _canary_worlds(**{**arguments, "min_sources": min_sources, "modes": mode_strategy})


@st.composite
def _canary_worlds(
    draw,
    *,
    min_slots,
    max_slots,
    min_sources,
    max_sources,
    max_ring,
    min_ring,
    modes,
    reads_kv,
    layout_kwargs,
) -> CanaryWorld:
    num_slots = draw(sizes(max_slots, min_size=min_slots), label="num_slots")
    sources = draw(
        source_tuples(
            min_sources=min_sources,
            max_sources=max_sources,
            min_capacity=num_slots,
            **layout_kwargs,
        ),
        label="sources",
    )
    ring_capacity = draw(sizes(max_ring, min_size=min_ring), label="ring_capacity")
    mode = draw(modes, label="mode")
    if reads_kv and mode not in _READING_MODES:
        raise InvalidArgument(f"modes drew {mode!r}, which reads no KV bytes, with reads_kv=True")
    return CanaryWorld(
        sources=sources,
        mode=mode,
        num_slots=num_slots,
        slot_stride_bytes=draw(st.sampled_from([32, 40, 64]), label="slot_stride_bytes"),
        ring_capacity=ring_capacity,
        ring_start=draw(ring_starts(ring_capacity), label="ring_start"),
        kernel_kind=draw(st.integers(0, 11), label="kernel_kind"),
        chain_assert=draw(st.sampled_from([0, 1, 7]), label="chain_assert"),
        seed=draw(st.integers(0, 2**32 - 1), label="seed"),
    )


@dataclass(frozen=True)
class WriteRequest:
    """One request of a write plan: its seed and its entries (``slot < 0`` = skipped entry)."""

    seed: int
    slots: tuple[int, ...]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class WriteBatch:
    """One write launch.

    ``requests`` fill the plan's ``capacity``; ``num_valid`` is the raw
    ``write_num_valid_reqs`` (clamped to ``[0, capacity]`` by the launch). The token arrays
    are the ``leading`` entries, then the requests' entries in order, then ``padding``
    entries; no request covers a leading or padding entry (``write_offsets`` starts at
    ``len(leading)``). With ``input_assert``, ``expected_tokens``/``expected_positions`` run
    along the token arrays; otherwise they are empty and the launch gets ``None``.

    Every slot of every request and of the padding is distinct and none is a seed, so any
    order of writes gives one result.
    """

    requests: tuple[WriteRequest, ...]
    num_valid: int
    padding: tuple[tuple[int, int, int], ...]  # (slot, token, position) after the last request
    input_assert: bool
    expected_tokens: tuple[int, ...]
    expected_positions: tuple[int, ...]
    leading: tuple[tuple[int, int, int], ...] = ()  # (slot, token, position) before the first

    @property
    def capacity(self) -> int:
        return len(self.requests)

    @property
    def active(self) -> int:
        return min(max(self.num_valid, 0), self.capacity)

    def token_arrays(self) -> tuple[list[int], list[int], list[int]]:
        """``input_ids``, ``positions`` and ``out_cache_loc`` as lists."""
        ids, positions, slots = [], [], []
        for slot, token, position in self.leading:
            ids.append(token)
            positions.append(position)
            slots.append(slot)
        for request in self.requests:
            ids += request.tokens
            positions += request.positions
            slots += request.slots
        for slot, token, position in self.padding:
            ids.append(token)
            positions.append(position)
            slots.append(slot)
        return ids, positions, slots

    def offsets(self) -> list[int]:
        """``write_offsets``: exclusive prefix sums of the request lengths, from the first
        entry past the leading ones."""
        offsets = [len(self.leading)]
        for request in self.requests:
            offsets.append(offsets[-1] + len(request.slots))
        return offsets


@dataclass(frozen=True)
class Chain:
    """A written sequence: the slot it continues (``seed``, -1 for the anchor) and its entries."""

    seed: int
    slots: tuple[int, ...]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]


def chains_written(batch: WriteBatch) -> tuple[Chain, ...]:
    """The chains an active write batch leaves in the canary buffer (skipped entries dropped)."""
    chains = []
    for request in batch.requests[: batch.active]:
        kept = [i for i, slot in enumerate(request.slots) if slot >= 0]
        if not kept:
            continue
        chains.append(
            Chain(
                seed=request.seed,
                slots=tuple(request.slots[i] for i in kept),
                tokens=tuple(request.tokens[i] for i in kept),
                positions=tuple(request.positions[i] for i in kept),
            )
        )
    return tuple(chains)


_tokens = st.one_of(
    st.integers(1, 200_000), st.integers(INT64_MIN, INT64_MAX), st.sampled_from([0, -1])
)


@st.composite
def _positions(draw, length: int, start: int) -> list[int]:
    """Mostly consecutive positions from ``start``, with occasional jumps and int64 wrap-around."""
    positions = []
    position = start
    for _ in range(length):
        positions.append(position)
        step = draw(st.sampled_from([1, 1, 1, 1, 0, 2, -5]), label="position step")
        position = (position + step + 2**63) % 2**64 - 2**63
    return positions


def write_batches(
    world: CanaryWorld,
    *,
    seeds: tuple[tuple[int, int], ...] = (),
    avoid: frozenset[int] = frozenset(),
    max_requests: int = 3,
    max_entries: int = 5,
    min_written: int = 0,
    min_requests: int = 1,
    seeded: bool | None = None,
    long_requests: int = 1,
) -> st.SearchStrategy[WriteBatch]:
    """Write launches on ``world``.

    ``seeds`` offers ``(slot, stored position)`` pairs of written chain tails that a request
    may continue; otherwise a request starts at the anchor (seed -1). ``seeded=True`` makes
    every request continue one of them (a chunked prefill's next chunk, a decode step),
    ``False`` none; ``None`` draws it per request. ``avoid`` lists slots that must not be
    written (records the caller still needs). Requests may hold skipped (-1) entries and be
    empty; ``num_valid`` runs from -2 to capacity + 2; a padding tail of unwritten entries may
    follow the last request; positions are mostly consecutive, starting after the seed's,
    with jumps and values at the edge of int64.

    ``min_written``: at least that many entries are written by a correct launch (CONTRACT §6:
    entries of a request below the clamped ``num_valid`` whose slot is not negative; an
    input-assert mismatch still writes), so ``chains_written(batch)`` holds at least that
    many slots. It is built in, not filtered: the requests that must carry the entries are
    long enough, those entries are not skipped, and ``num_valid`` reaches them. With the
    default 0, draws are those of the strategy before the option existed.

    Engine scale: past 64 entries in all (``max_requests * max_entries``) or 256 free slots,
    a batch is drawn in bulk: the sizes (requests from ``min_requests``, through
    :func:`strategies.sizes`; ``long_requests`` long ones of up to ``max_entries``, the
    others of up to 4), rates (skipped entries, position jumps, input-assert mismatches, seeded requests) and
    a seed are drawn, and the entries made from them with numpy. Slots are the free ones in a
    seeded order that starts with the world's power-of-two edge slots, positions run on
    without gaps over the written entries, tokens are random and non-zero (a few at the edges
    of int64). That is how one request of 8192+ tokens or 256+ requests fit in one example.

    Example draw (capacity 2, one valid request)::

        WriteBatch(requests=(WriteRequest(seed=-1, slots=(3, -1, 0), tokens=(11, 12, 13),
                                          positions=(0, 1, 2)),
                             WriteRequest(seed=5, slots=(7,), tokens=(9,), positions=(41,))),
                   num_valid=1, padding=((2, 77, 8),), input_assert=False, ...)
    """
    for name, value, lo in (
        ("max_requests", max_requests, 1),
        ("max_entries", max_entries, 0),
        ("min_requests", min_requests, 1),
        ("long_requests", long_requests, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < lo:
            raise InvalidArgument(f"{name}={value!r} must be an int >= {lo}")
    if min_requests > max_requests:
        raise InvalidArgument(f"min_requests={min_requests} must be <= max_requests={max_requests}")
    if seeded is not None and not isinstance(seeded, bool):
        raise InvalidArgument(f"seeded={seeded!r} must be None or a bool")
    if seeded and not seeds:
        raise InvalidArgument("seeded=True needs seeds to continue")
    seed_slots = {slot for slot, _ in seeds}
    taken = seed_slots | set(avoid)
    bulk = max_requests * max_entries > _DRAWN_ENTRIES or world.num_slots > _DRAWN_WORLD
    if bulk:
        free_count = world.num_slots - sum(1 for s in taken if 0 <= s < world.num_slots)
        most = min(free_count, _bulk_most(max_requests, max_entries, long_requests))
    else:
        free = tuple(s for s in range(world.num_slots) if s not in taken)
        most = min(len(free), max_requests * max_entries)
    if isinstance(min_written, bool) or not isinstance(min_written, int):
        raise InvalidArgument(f"min_written={min_written!r} must be an int")
    if not 0 <= min_written <= most:
        raise InvalidArgument(
            f"min_written={min_written} must be in [0, {most}]: {world.num_slots - len(taken)} "
            f"slots are free to write and a batch holds at most {max_requests} x "
            f"{max_entries} entries"
        )
    if bulk:
        sizes_ = (max_requests, max_entries, min_written, min_requests, long_requests)
        return _bulk_write_batches(world, tuple(seeds), frozenset(taken), sizes_, seeded)
    return _write_batches(
        world, tuple(seeds), free, max_requests, max_entries, min_written, min_requests, seeded
    )


# A batch of at most this many entries (requests x entries) in a world of at most this many
# slots is drawn entry by entry; a larger one in bulk (see write_batches).
_DRAWN_ENTRIES = 64
_DRAWN_WORLD = 256
# In a bulk batch, every request but the long one holds at most this many entries.
_SHORT_ENTRIES = 4


def _bulk_most(max_requests: int, max_entries: int, long_requests: int) -> int:
    """The most entries a bulk batch writes: its long requests and short ones."""
    longs = min(long_requests, max_requests)
    return longs * max_entries + (max_requests - longs) * min(max_entries, _SHORT_ENTRIES)


@st.composite
def _write_batches(
    draw, world, seeds, free, max_requests, max_entries, min_written, min_requests, seeded
):
    order = draw(st.permutations(free), label="slot order")
    # enough requests to hold min_written entries (any number from 1 when it is 0)
    fewest = max(1, -(-min_written // max_entries)) if max_entries else 1
    fewest = max(fewest, min_requests)
    capacity = draw(sizes(max_requests, min_size=fewest), label="capacity")
    cursor = 0
    requests = []
    owed = min_written  # entries still to be written for min_written to hold
    needed_requests = 0  # requests that num_valid must reach: the ones paying the debt
    for r in range(capacity):
        if seeds and (seeded or (seeded is None and draw(st.booleans(), label="continue a chain"))):
            seed, stored_position = draw(st.sampled_from(seeds), label="seed")
            start = (stored_position + 1 + 2**63) % 2**64 - 2**63
        else:
            seed = -1
            start = draw(
                st.one_of(st.integers(0, 4000), st.just(INT64_MAX - 1)), label="first position"
            )
        later_room = (capacity - r - 1) * max_entries  # what later requests can still hold
        length = draw(
            sizes(max_entries, min_size=min(max_entries, max(0, owed - later_room))),
            label="entries",
        )
        slots = []
        for j in range(length):
            room_after = length - j - 1 + later_room
            if cursor < len(order) and (
                owed > room_after
                or not draw(st.integers(0, 5).map(lambda n: n == 0), label="skip entry")
            ):
                slots.append(order[cursor])
                cursor += 1
                if owed:
                    owed -= 1
                    needed_requests = r + 1
            else:
                slots.append(-1)
        tokens = draw(st.lists(_tokens, min_size=length, max_size=length), label="tokens")
        positions = draw(_positions(length, start), label="positions")
        requests.append(WriteRequest(seed, tuple(slots), tuple(tokens), tuple(positions)))
    lowest = needed_requests if min_written else -2
    num_valid = draw(st.integers(lowest, capacity + 2), label="num_valid")
    padding = []
    for _ in range(draw(st.integers(0, 2), label="padding entries")):
        slot = order[cursor] if cursor < len(order) else -1
        cursor += 1
        padding.append((slot, draw(_tokens, label="padding token"), 0))
    input_assert = draw(st.booleans(), label="input_assert")
    expected_tokens: list[int] = []
    expected_positions: list[int] = []
    if input_assert:
        batch = WriteBatch(tuple(requests), num_valid, tuple(padding), False, (), ())
        ids, positions, _ = batch.token_arrays()
        for token, position in zip(ids, positions, strict=True):
            wrong = draw(
                st.sampled_from(["", "", "", "token", "position", "both"]), label="mismatch"
            )
            expected_tokens.append(token ^ 1 if wrong in ("token", "both") else token)
            expected_positions.append(position ^ 2 if wrong in ("position", "both") else position)
    return WriteBatch(
        tuple(requests),
        num_valid,
        tuple(padding),
        input_assert,
        tuple(expected_tokens),
        tuple(expected_positions),
    )


_EXTREME_TOKENS = (0, -1, INT64_MIN, INT64_MAX)


def _wrap64(values: np.ndarray) -> np.ndarray:
    """Python ints as int64 two's complement (positions run past 2^63 - 1 into -2^63)."""
    return ((values.astype(object) + 2**63) % 2**64 - 2**63).astype(np.int64)


@st.composite
def _bulk_write_batches(draw, world, seeds, taken, sizes_, seeded) -> WriteBatch:
    max_requests, max_entries, min_written, min_requests, long_requests = sizes_
    short = min(max_entries, _SHORT_ENTRIES)
    fewest = max(min_requests, 1)
    if min_written > long_requests * max_entries:  # the short requests must carry the rest
        rest = min_written - long_requests * max_entries
        fewest = max(fewest, long_requests + -(-rest // max(short, 1)))
    capacity = draw(sizes(max_requests, min_size=fewest), label="capacity")
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="bulk seed"))
    free = np.setdiff1d(np.arange(world.num_slots, dtype=np.int64), np.fromiter(taken, np.int64))
    # the world's power-of-two edge slots first, in a seeded order, then every other free slot
    edges = np.intersect1d(np.asarray(capacity_edges(world.num_slots), np.int64), free)
    order = np.concatenate(
        [rng.permutation(edges), rng.permutation(np.setdiff1d(free, edges, assume_unique=True))]
    )

    # Lengths (written entries per request): short ones from the seed, then the long ones.
    longs = rng.choice(capacity, size=min(long_requests, capacity), replace=False)
    lengths = rng.integers(0 if min_written == 0 else 1, short + 1, size=capacity)
    if min_written > long_requests * max_entries:
        lengths[:] = short
    lengths[longs] = 0
    room = len(order)
    while lengths.sum() > room:  # a small world: fewer short entries
        lengths[np.argmax(lengths)] -= 1
    room -= int(lengths.sum())
    owed = max(min_written - int(lengths.sum()), 0)
    for k, at in enumerate(longs.tolist()):
        lowest = min(-(-owed // (len(longs) - k)), max_entries, room)
        n = draw(sizes(min(max_entries, room), min_size=lowest), label="long request entries")
        lengths[at] = n
        owed, room = max(owed - n, 0), room - n

    skip_rate = draw(st.sampled_from([0.0, 1 / 64, 1 / 6]), label="skipped entries")
    jump_rate = draw(st.sampled_from([0.0, 1 / 256]), label="position jumps")
    extreme_rate = draw(st.sampled_from([1 / 64, 0.0]), label="extreme tokens")
    if seeded is None and seeds:
        seeded_rate = draw(st.sampled_from([0.5, 0.0, 1.0]), label="seeded requests")
    else:
        seeded_rate = 1.0 if seeded else 0.0
    seed_order = rng.permutation(len(seeds)) if seeds else np.zeros(0, np.int64)

    requests = []
    cursor = 0
    for r in range(capacity):
        n = int(lengths[r])
        slots = order[cursor : cursor + n]
        cursor += n
        if seeds and rng.random() < seeded_rate:
            seed, stored_position = seeds[int(seed_order[r % len(seeds)])]
            start = stored_position + 1
        else:
            seed = -1
            start = int(rng.integers(0, 4000)) if rng.random() < 0.95 else INT64_MAX - n // 2
        steps = np.ones(n, dtype=np.int64)
        if n:
            steps[0] = 0
            jumps = rng.random(n) < jump_rate
            jumps[0] = False  # a request starts right after its seed's position
            steps[jumps] = rng.choice(np.array([0, 2, -5]), size=int(jumps.sum()))
        positions = _wrap64(np.cumsum(steps).astype(object) + start)
        tokens = rng.integers(1, 200_000, size=n, dtype=np.int64)
        extreme = rng.random(n) < extreme_rate
        tokens[extreme] = rng.choice(np.array(_EXTREME_TOKENS, np.int64), size=int(extreme.sum()))
        # skipped entries (-1) between the written ones: they take no slot and no position
        skips = int(rng.binomial(n, skip_rate)) if n and skip_rate else 0
        at = np.sort(rng.integers(0, n + 1, size=skips))
        slots = np.insert(slots, at, -1)
        tokens = np.insert(tokens, at, 7)
        positions = np.insert(positions, at, 0)
        requests.append(
            WriteRequest(
                seed, tuple(slots.tolist()), tuple(tokens.tolist()), tuple(positions.tolist())
            )
        )
    num_valid = draw(
        st.sampled_from([capacity, capacity + 2] if min_written else [capacity, capacity + 2, -1]),
        label="num_valid",
    )
    padding = tuple(
        (
            int(order[cursor + k]) if cursor + k < len(order) else -1,
            int(rng.integers(1, 200_000)),
            0,
        )
        for k in range(draw(st.integers(0, 2), label="padding entries"))
    )
    input_assert = draw(st.booleans(), label="input_assert")
    expected_tokens: tuple[int, ...] = ()
    expected_positions: tuple[int, ...] = ()
    if input_assert:
        batch = WriteBatch(tuple(requests), num_valid, padding, False, (), ())
        ids, positions, _ = (np.asarray(column, dtype=np.int64) for column in batch.token_arrays())
        rate = draw(st.sampled_from([1 / 64, 0.0]), label="input mismatches")
        wrong = rng.random((2, len(ids))) < rate
        expected_tokens = tuple(np.where(wrong[0], ids ^ 1, ids).tolist())
        expected_positions = tuple(np.where(wrong[1], positions ^ 2, positions).tolist())
    return WriteBatch(
        tuple(requests), num_valid, padding, input_assert, expected_tokens, expected_positions
    )


@dataclass(frozen=True)
class VerifyBatch:
    """One verify launch: per-entry arrays of the plan's capacity, and its scalar switches.

    ``enable`` 0 disables the launch (any other value runs it); ``num_valid`` is raw
    (clamped by the launch); entries past the valid ones are padding.
    """

    slots: tuple[int, ...]
    expected_tokens: tuple[int, ...]
    expected_positions: tuple[int, ...]
    prev_slots: tuple[int, ...]
    num_valid: int
    enable: int
    check_token: bool

    @property
    def capacity(self) -> int:
        return len(self.slots)

    @property
    def active(self) -> int:
        if self.enable == 0:
            return 0
        return min(max(self.num_valid, 0), self.capacity)


def plan_for_chains(chains: tuple[Chain, ...]) -> list[tuple[int, int, int, int]]:
    """``(slot, expected token, expected position, prev slot)`` for every entry of ``chains``.

    A chain's first entry links to its seed (or -1, the anchor); every later one to the entry
    before it. Such a plan verifies clean right after the chains are written.
    """
    entries = []
    for chain in chains:
        prev = chain.seed
        for slot, token, position in zip(chain.slots, chain.tokens, chain.positions, strict=True):
            entries.append((slot, token, position, prev))
            prev = slot
    return entries


def verify_batches(
    chains: tuple[Chain, ...],
    *,
    exact: bool = False,
    max_padding: int = 3,
    min_checked: int = 0,
    min_entries: int = 0,
) -> st.SearchStrategy[VerifyBatch]:
    """Verify plans over written ``chains``.

    With ``exact``, the plan is :func:`plan_for_chains` as it is, all valid and enabled,
    with the token check on. Otherwise entries are shuffled and varied: prev slot 0
    (unchecked), -1 or -2 (anchor), expected token -1 (unchecked) or a wrong one, a wrong
    position, padding entries (slot 0), ``num_valid`` from -2 to capacity + 2, ``enable``
    0, 1 or 2, and the token check on or off.

    ``min_checked``: at least that many entries are checked by a correct launch (CONTRACT §7:
    the launch is enabled, and the entry is below the clamped ``num_valid`` and names a slot
    other than 0), built in, not filtered: ``enable`` is then never 0 and ``num_valid``
    reaches that many entries of the chains. The chains must hold that many slots other than
    0. With the default 0, draws are those of the strategy before the option existed.

    ``min_entries``: the plan holds at least that many entries, the chains' entries repeated
    in order as often as it takes (verify only reads, so a sweep may check a slot twice):
    that is how a sweep past 32,768 entries (a persistent grid's second lap) is drawn over
    fewer written slots. Past 64 entries a plan is drawn in bulk: its order, the share of
    changed entries and the padding come from a drawn seed and rate, not one draw per entry.

    Example draw::

        VerifyBatch(slots=(4, 0, 6), expected_tokens=(12, -1, -1), expected_positions=(1, 0, 2),
                    prev_slots=(3, 0, -2), num_valid=5, enable=2, check_token=True)
    """
    if isinstance(max_padding, bool) or not isinstance(max_padding, int) or max_padding < 0:
        raise InvalidArgument(f"max_padding={max_padding!r} must be an int >= 0")
    checkable = sum(slot != 0 for chain in chains for slot in chain.slots)
    if isinstance(min_checked, bool) or not isinstance(min_checked, int):
        raise InvalidArgument(f"min_checked={min_checked!r} must be an int")
    if not 0 <= min_checked <= checkable:
        raise InvalidArgument(
            f"min_checked={min_checked} must be in [0, {checkable}]: the chains hold "
            f"{checkable} slots other than 0 (verify skips slot 0)"
        )
    if isinstance(min_entries, bool) or not isinstance(min_entries, int) or min_entries < 0:
        raise InvalidArgument(f"min_entries={min_entries!r} must be an int >= 0")
    if min_entries and not checkable:
        raise InvalidArgument("min_entries needs chains with a slot other than 0")
    entries = plan_for_chains(tuple(chains))
    repeated = min_entries > len(entries)
    if repeated:
        entries = (entries * -(-min_entries // len(entries)))[:min_entries]
    if repeated or len(entries) > _DRAWN_ENTRIES:
        return _bulk_verify_batches(entries, exact, max_padding, min_checked)
    return _verify_batches(tuple(chains), exact, max_padding, min_checked)


@st.composite
def _verify_batches(draw, chains, exact, max_padding, min_checked) -> VerifyBatch:
    entries = plan_for_chains(chains)
    if exact:
        entries = entries or [(0, -1, 0, 0)]  # a plan has at least one entry: padding
        n = len(entries)
        columns = list(zip(*entries, strict=True)) if entries else [(), (), (), ()]
        return VerifyBatch(*map(tuple, columns), num_valid=n, enable=1, check_token=True)
    entries = list(draw(st.permutations(entries), label="entry order"))
    varied = []
    for slot, token, position, prev in entries:
        change = draw(
            st.sampled_from(["", "", "", "prev 0", "prev -2", "token -1", "token", "position"]),
            label="entry change",
        )
        if change == "prev 0":
            prev = 0
        elif change == "prev -2":
            prev = -2
        elif change == "token -1":
            token = -1
        elif change == "token":
            token = token ^ 4
        elif change == "position":
            position = position ^ 8
        varied.append((slot, token, position, prev))
    for _ in range(draw(st.integers(0, max_padding), label="padding entries")):
        varied.insert(draw(st.integers(0, len(varied)), label="padding at"), (0, -1, 0, 0))
    if not varied:
        varied = [(0, -1, 0, 0)]
    columns = [tuple(column) for column in zip(*varied, strict=True)]
    lowest = -2
    if min_checked:
        # num_valid reaches the min_checked-th entry that names a slot other than 0
        checked_at = [k for k, (slot, *_) in enumerate(varied) if slot != 0]
        lowest = checked_at[min_checked - 1] + 1
    return VerifyBatch(
        *columns,
        num_valid=draw(st.integers(lowest, len(varied) + 2), label="num_valid"),
        enable=draw(st.sampled_from([1, 1, 2] if min_checked else [1, 1, 2, 0]), label="enable"),
        check_token=draw(st.booleans(), label="check_token"),
    )


_ENTRY_CHANGES = ("prev 0", "prev -2", "token -1", "token", "position")


@st.composite
def _bulk_verify_batches(draw, entries, exact, max_padding, min_checked) -> VerifyBatch:
    columns = np.asarray(entries, dtype=object).T  # slot, token, position, prev
    n = len(entries)
    if exact:
        slots, tokens, positions, prevs = (tuple(int(v) for v in c) for c in columns)
        return VerifyBatch(slots, tokens, positions, prevs, num_valid=n, enable=1, check_token=True)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1), label="bulk seed"))
    order = rng.permutation(n)
    slots, tokens, positions, prevs = ([int(v) for v in c[order]] for c in columns)
    rate = draw(st.sampled_from([1 / 32, 1 / 4, 0.0]), label="changed entries")
    for k in np.flatnonzero(rng.random(n) < rate).tolist():
        change = _ENTRY_CHANGES[int(rng.integers(len(_ENTRY_CHANGES)))]
        if change == "prev 0":
            prevs[k] = 0
        elif change == "prev -2":
            prevs[k] = -2
        elif change == "token -1":
            tokens[k] = -1
        elif change == "token":
            tokens[k] ^= 4
        else:
            positions[k] ^= 8
    for _ in range(draw(st.integers(0, max_padding), label="padding entries")):
        at = int(rng.integers(0, len(slots) + 1))
        for column, value in zip((slots, tokens, positions, prevs), (0, -1, 0, 0), strict=True):
            column.insert(at, value)
    total = len(slots)
    # a sweep checks all of its entries (past a lap, past the plan): num_valid is never short
    choices = [total, total + 2] if min_checked else [total, total + 2, -1, 0]
    return VerifyBatch(
        tuple(slots),
        tuple(tokens),
        tuple(positions),
        tuple(prevs),
        num_valid=draw(st.sampled_from(choices), label="num_valid"),
        enable=draw(st.sampled_from([1, 2] if min_checked else [1, 2, 0]), label="enable"),
        check_token=draw(st.booleans(), label="check_token"),
    )


@dataclass(frozen=True)
class Corruption:
    """One thing going wrong between a write and a verify.

    ``kind``:

    - ``"field"``: bit ``bit`` of canary field ``field`` (0 token, 1 position, 2 prev hash,
      3 real-KV hash) of ``slot`` flips;
    - ``"kv_inside"``: byte ``offset`` of source ``source``'s backing buffer, which ``slot``
      reads, is xored with ``value``;
    - ``"kv_outside"``: the same for a byte no slot reads (must cause no report);
    - ``"page_swap"``: rows ``slot`` and ``other`` of source ``source`` swap their bytes (a
      page table pointing at the wrong page);
    - ``"stale"``: ``slot``'s record is overwritten by the record of ``other``, a slot of
      another chain (a freed slot reused without a new write).
    """

    kind: str
    slot: int = 0
    other: int = 0
    field: int = 0
    bit: int = 0
    source: int = 0
    offset: int = 0
    value: int = 0

    def describe(self) -> str:
        if self.kind == "field":
            return f"bit {self.bit} of {_FIELD_NAMES[self.field]} of slot {self.slot} flipped"
        if self.kind in ("kv_inside", "kv_outside"):
            where = (
                "read by slot " + str(self.slot) if self.kind == "kv_inside" else "read by no slot"
            )
            return f"byte {self.offset} of source {self.source} ({where}) ^= {self.value:#x}"
        if self.kind == "page_swap":
            return f"rows {self.slot} and {self.other} of source {self.source} swapped"
        return f"slot {self.slot} holds the stale record of slot {self.other}"


CORRUPTION_KINDS = ("field", "kv_inside", "kv_outside", "page_swap", "stale")


def corruption_kinds(world: CanaryWorld, chains: tuple[Chain, ...]) -> tuple[str, ...]:
    """The corruption kinds ``world`` and ``chains`` allow: KV ones when the world reads KV
    bytes, a stale record with two chains or more, a flipped field always."""
    kinds = ["field"]
    if world.reads_kv:
        kinds += ["kv_inside", "kv_outside", "page_swap"]
    if len(chains) >= 2:
        kinds.append("stale")
    return tuple(kinds)


@st.composite
def corruptions(
    draw, world: CanaryWorld, chains: tuple[Chain, ...], kinds: tuple[str, ...] | None = None
) -> Corruption:
    """One corruption of written ``chains`` in ``world`` (which needs at least one written slot).

    KV corruptions are drawn only when the world reads KV bytes; a stale record needs two
    chains (:func:`corruption_kinds`). ``kinds`` narrows the choice to those of its kinds
    that are allowed (at least one must be); the default draws as before the option existed.
    Example draw: ``Corruption(kind='field', slot=5, field=1, bit=63)``.
    """
    written = [slot for chain in chains for slot in chain.slots]
    if not written:
        raise InvalidArgument("corruptions() needs chains with at least one written slot")
    allowed = corruption_kinds(world, chains)
    if kinds is not None:
        allowed = tuple(k for k in allowed if k in kinds)
        if not allowed:
            raise InvalidArgument(
                f"kinds={kinds!r}: none is allowed here ({corruption_kinds(world, chains)})"
            )
    kind = draw(st.sampled_from(list(allowed)), label="corruption")
    slot = draw(st.sampled_from(written), label="slot")
    if kind == "field":
        return Corruption(
            "field",
            slot=slot,
            field=draw(st.integers(0, 3), label="field"),
            bit=draw(st.integers(0, 63), label="bit"),
        )
    if kind == "stale":
        mine = next(chain for chain in chains if slot in chain.slots)
        others = [s for chain in chains if chain is not mine for s in chain.slots]
        return Corruption(
            "stale", slot=slot, other=draw(st.sampled_from(others), label="stale from")
        )
    source = draw(st.integers(0, len(world.sources) - 1), label="source")
    layout = world.sources[source]
    if kind == "kv_inside":
        read = 16 if world.mode == 1 else layout.read_bytes
        start = int(slot_window_starts(layout)[slot])
        return Corruption(
            "kv_inside",
            slot=slot,
            source=source,
            offset=start + draw(st.integers(0, read - 1), label="byte in window"),
            value=draw(st.integers(1, 255), label="xor"),
        )
    if kind == "kv_outside":
        outside = _unread_offsets(layout, world.mode)
        if outside.size == 0:
            return Corruption("field", slot=slot, field=3, bit=0)
        return Corruption(
            "kv_outside",
            slot=slot,
            source=source,
            offset=int(draw(st.sampled_from(outside.tolist()), label="byte outside")),
            value=draw(st.integers(1, 255), label="xor"),
        )
    row = slot // layout.page_size
    rows = list(range(layout.rows))
    other = draw(st.sampled_from([r for r in rows if r != row] or [row]), label="swap with row")
    return Corruption("page_swap", slot=row, other=other, source=source)


def _unread_offsets(layout: SourceLayout, mode: int) -> np.ndarray:
    read = np.zeros(layout.backing_bytes, dtype=bool)
    length = 16 if mode == 1 else layout.read_bytes
    starts = slot_window_starts(layout)
    read[(starts[:, None] + np.arange(length, dtype=np.int64)).ravel()] = True
    return np.flatnonzero(~read)
