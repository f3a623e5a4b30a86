"""Write launches as plain data: worlds, write batches and the chains they leave behind
(CONTRACT §5, §6).

A :class:`CanaryWorld` is everything a launch sees besides its plan: the KV sources and
mode, the canary buffer, the violation ring and the counters. A :class:`WriteBatch` is one
write launch; :func:`chains_written` says which chains it leaves behind, over which
:mod:`strategies.verify` draws verify plans and corruptions. :mod:`strategies.materialize`
turns all of these into tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np
from hypothesis.errors import InvalidArgument

from strategies.layouts import SourceLayout, capacity_edges, layout, source_tuples
from strategies.sizes import check_int, sizes

__all__ = [
    "CHAIN",
    "POSITION",
    "REAL_KV",
    "TOKEN",
    "WRITE_POSITION",
    "WRITE_TOKEN",
    "CanaryWorld",
    "Chain",
    "WriteBatch",
    "WriteRequest",
    "canary_worlds",
    "chains_written",
    "ring_starts",
    "world",
    "write_batches",
]

# FailReason bits (CONTRACT §1), as plain ints so that descriptions stay torch- and enum-free.
CHAIN, POSITION, REAL_KV, WRITE_TOKEN, WRITE_POSITION, TOKEN = 1, 2, 4, 8, 16, 32

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


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


def world(
    *,
    sources: tuple[SourceLayout, ...] | list[SourceLayout] | None = None,
    mode: int = 2,
    num_slots: int = 8,
    slot_stride_bytes: int = 32,
    ring_capacity: int = 4,
    ring_start: int = 0,
    kernel_kind: int = 0,
    chain_assert: int = 1,
    seed: int = 1,
) -> CanaryWorld:
    """A fixed world from what a test cares about, the rest at plain defaults: mode ALL,
    32-byte canary slots, an empty ring of 4 rows, and (``sources=None``) one flat source of
    :func:`layout` addressing exactly ``num_slots`` slots. Every source must address every
    canary slot::

        world(sources=(layout(rows=3, page_size=4),), num_slots=12, ring_capacity=8)
    """
    chosen = (layout(rows=num_slots),) if sources is None else tuple(sources)
    short = [i for i, source in enumerate(chosen) if source.capacity < num_slots]
    if short:
        raise InvalidArgument(
            f"sources {short} address fewer than num_slots={num_slots} slots: every source "
            "must address every canary slot"
        )
    return CanaryWorld(
        chosen,
        mode,
        num_slots,
        slot_stride_bytes,
        ring_capacity,
        ring_start,
        kernel_kind,
        chain_assert,
        seed,
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
        check_int(name, value, lo, hi)
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
class _SeededEntries:
    """A slot to continue (``seed``) and entries after it: parallel slots, tokens, positions."""

    seed: int
    slots: tuple[int, ...]
    tokens: tuple[int, ...]
    positions: tuple[int, ...]


@dataclass(frozen=True)
class WriteRequest(_SeededEntries):
    """One request of a write plan: its seed and its entries (``slot < 0`` = skipped entry)."""


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
class Chain(_SeededEntries):
    """A written sequence: the slot it continues (``seed``, -1 for the anchor) and its entries."""


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
    _check_write_batch_sizes(max_requests, max_entries, min_requests, long_requests)
    _check_seeded(seeded, seeds)
    seed_slots = {slot for slot, _ in seeds}
    taken = seed_slots | set(avoid)
    bulk = max_requests * max_entries > DRAWN_ENTRIES or world.num_slots > _DRAWN_WORLD
    if bulk:
        free_count = world.num_slots - sum(1 for s in taken if 0 <= s < world.num_slots)
        most = min(free_count, _bulk_most(max_requests, max_entries, long_requests))
    else:
        free = tuple(s for s in range(world.num_slots) if s not in taken)
        most = min(len(free), max_requests * max_entries)
    check_int("min_written", min_written)
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


def _check_write_batch_sizes(
    max_requests: int, max_entries: int, min_requests: int, long_requests: int
) -> None:
    """Refuse a size of ``write_batches`` that is no int or below its least, or more
    requests at least than at most."""
    for name, value, lo in (
        ("max_requests", max_requests, 1),
        ("max_entries", max_entries, 0),
        ("min_requests", min_requests, 1),
        ("long_requests", long_requests, 1),
    ):
        check_int(name, value, lo)
    if min_requests > max_requests:
        raise InvalidArgument(f"min_requests={min_requests} must be <= max_requests={max_requests}")


def _check_seeded(seeded: bool | None, seeds: tuple[tuple[int, int], ...]) -> None:
    """Refuse a ``seeded`` of ``write_batches`` that is neither None nor a bool, or True with
    no seed to continue."""
    if seeded is not None and not isinstance(seeded, bool):
        raise InvalidArgument(f"seeded={seeded!r} must be None or a bool")
    if seeded and not seeds:
        raise InvalidArgument("seeded=True needs seeds to continue")


# A batch of at most this many entries (requests x entries) in a world of at most this many
# slots is drawn entry by entry; a larger one in bulk (see write_batches). A verify plan of
# more entries is drawn in bulk too (strategies.verify).
DRAWN_ENTRIES = 64
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
    order = _bulk_slot_order(rng, world.num_slots, taken)
    lengths = _bulk_lengths(draw, rng, capacity, len(order), sizes_)
    rates = _bulk_rates(draw, seeds, seeded)
    seed_order = rng.permutation(len(seeds)) if seeds else np.zeros(0, np.int64)

    requests = []
    cursor = 0
    for r in range(capacity):
        n = int(lengths[r])
        slots = order[cursor : cursor + n]
        cursor += n
        offered = seeds[int(seed_order[r % len(seeds)])] if seeds else None
        requests.append(_bulk_request(rng, slots, offered, rates))
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
    batch = WriteBatch(tuple(requests), num_valid, padding, False, (), ())
    input_assert, expected_tokens, expected_positions = _bulk_expected_inputs(draw, rng, batch)
    return WriteBatch(
        tuple(requests), num_valid, padding, input_assert, expected_tokens, expected_positions
    )


def _bulk_slot_order(rng: np.random.Generator, num_slots: int, taken: frozenset) -> np.ndarray:
    """The free slots of a world of ``num_slots`` in the order a bulk batch writes them: its
    power-of-two edge slots first, in a seeded order, then every other free slot."""
    free = np.setdiff1d(np.arange(num_slots, dtype=np.int64), np.fromiter(taken, np.int64))
    edges = np.intersect1d(np.asarray(capacity_edges(num_slots), np.int64), free)
    return np.concatenate(
        [rng.permutation(edges), rng.permutation(np.setdiff1d(free, edges, assume_unique=True))]
    )


def _bulk_lengths(draw, rng: np.random.Generator, capacity: int, room: int, sizes_) -> np.ndarray:
    """The written entries of each of a bulk batch's ``capacity`` requests, ``room`` slots in
    all: short ones from the seed, then the long ones drawn, owing ``min_written``."""
    max_requests, max_entries, min_written, min_requests, long_requests = sizes_
    short = min(max_entries, _SHORT_ENTRIES)
    longs = rng.choice(capacity, size=min(long_requests, capacity), replace=False)
    lengths = rng.integers(0 if min_written == 0 else 1, short + 1, size=capacity)
    if min_written > long_requests * max_entries:
        lengths[:] = short
    lengths[longs] = 0
    while lengths.sum() > room:  # a small world: fewer short entries
        lengths[np.argmax(lengths)] -= 1
    room -= int(lengths.sum())
    owed = max(min_written - int(lengths.sum()), 0)
    for k, at in enumerate(longs.tolist()):
        lowest = min(-(-owed // (len(longs) - k)), max_entries, room)
        n = draw(sizes(min(max_entries, room), min_size=lowest), label="long request entries")
        lengths[at] = n
        owed, room = max(owed - n, 0), room - n
    return lengths


def _bulk_rates(draw, seeds, seeded: bool | None) -> tuple[float, float, float, float]:
    """A bulk batch's rates of skipped entries, position jumps, extreme tokens and seeded
    requests (the last drawn only where ``seeded`` is None and there are seeds)."""
    skip_rate = draw(st.sampled_from([0.0, 1 / 64, 1 / 6]), label="skipped entries")
    jump_rate = draw(st.sampled_from([0.0, 1 / 256]), label="position jumps")
    extreme_rate = draw(st.sampled_from([1 / 64, 0.0]), label="extreme tokens")
    if seeded is None and seeds:
        seeded_rate = draw(st.sampled_from([0.5, 0.0, 1.0]), label="seeded requests")
    else:
        seeded_rate = 1.0 if seeded else 0.0
    return skip_rate, jump_rate, extreme_rate, seeded_rate


def _bulk_request(
    rng: np.random.Generator,
    slots: np.ndarray,
    offered: tuple[int, int] | None,
    rates: tuple[float, float, float, float],
) -> WriteRequest:
    """One request of a bulk batch writing ``slots``, continuing the ``offered`` seed (a
    ``(slot, stored position)``; None: there are none) at the seeded rate."""
    skip_rate, jump_rate, extreme_rate, seeded_rate = rates
    n = len(slots)
    if offered is not None and rng.random() < seeded_rate:
        seed, stored_position = offered
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
    return WriteRequest(
        seed, tuple(slots.tolist()), tuple(tokens.tolist()), tuple(positions.tolist())
    )


def _bulk_expected_inputs(
    draw, rng: np.random.Generator, batch: WriteBatch
) -> tuple[bool, tuple[int, ...], tuple[int, ...]]:
    """Whether a bulk batch asserts its inputs, and its expected tokens and positions: its
    own, each wrong at a drawn rate."""
    input_assert = draw(st.booleans(), label="input_assert")
    expected_tokens: tuple[int, ...] = ()
    expected_positions: tuple[int, ...] = ()
    if input_assert:
        ids, positions, _ = (np.asarray(column, dtype=np.int64) for column in batch.token_arrays())
        rate = draw(st.sampled_from([1 / 64, 0.0]), label="input mismatches")
        wrong = rng.random((2, len(ids))) < rate
        expected_tokens = tuple(np.where(wrong[0], ids ^ 1, ids).tolist())
        expected_positions = tuple(np.where(wrong[1], positions ^ 2, positions).tolist())
    return input_assert, expected_tokens, expected_positions
