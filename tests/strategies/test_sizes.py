"""Sizes that aim at edges, and the engine-scale options of the strategies that use them."""

from __future__ import annotations

import pytest
from hypothesis import find, settings
from hypothesis.errors import InvalidArgument

import strategies as st_kv
from tests.strategies.draws import collect

DRAWS = 100


def test_edges_are_the_powers_of_two_either_side_and_the_blocks():
    """The documented examples of power_of_two_edges and size_edges."""
    assert st_kv.power_of_two_edges(9) == (0, 1, 2, 3, 4, 5, 7, 8, 9)
    assert st_kv.size_edges(300, min_size=100, block=96) == (
        100, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300,
    )  # fmt: skip


def test_sizes_stay_in_bounds_and_hit_the_edges_often():
    """Every draw is in [min_size, max_size]; a good share are powers of two or one off one,
    and multiples of the block or one off one, far more than uniform draws would give."""
    drawn = collect(st_kv.sizes(40_000, min_size=1000, block=512), DRAWS)
    assert all(1000 <= n <= 40_000 for n in drawn)
    edges = set(st_kv.size_edges(40_000, min_size=1000))
    at_edges = [n for n in drawn if n in edges]
    near_block = [n for n in drawn if min(n % 512, -n % 512) <= 1]
    assert len(at_edges) >= DRAWS // 5, f"{len(at_edges)} of {DRAWS} draws at a 2^k edge"
    assert len(near_block) >= DRAWS // 5, f"{len(near_block)} of {DRAWS} draws by a block"
    assert {32767, 32768, 32769} & set(drawn)


def test_sizes_shrink_to_the_lower_bound():
    """The smallest size is found first: a failure at scale shrinks to the least size."""
    once = settings(derandomize=True, database=None)
    assert find(st_kv.sizes(2**20, min_size=12345), lambda n: True, settings=once) == 12345
    assert find(st_kv.sizes(300, block=96), lambda n: True, settings=once) == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: st_kv.sizes(-1),
        lambda: st_kv.sizes(10, min_size=11),
        lambda: st_kv.sizes(10, block=0),
        lambda: st_kv.sizes(True),
        lambda: st_kv.sizes(2**41),
    ],
    ids=["negative", "min above max", "block 0", "bool", "past 2^40"],
)
def test_bad_size_arguments_raise_invalid_argument(call):
    """Bad bounds are refused when the strategy is built."""
    with pytest.raises(InvalidArgument):
        call()


def test_slot_edges_include_every_power_of_two_edge_of_the_capacity_and_the_page():
    """slot_indices(edges=True) holds capacity_edges: 2^k - 1, 2^k, 2^k + 1 below the
    capacity, the last slot, and the in-page edges (64 of a page of 96) of the first and last page."""
    capacity, page = 96 * 730, 96  # whole pages: the last one has an in-page index 64
    edges = st_kv.capacity_edges(capacity, page)
    assert {0, 32767, 32768, 32769, 65535, 65536, 65537, capacity - 1, 63, 64, 65} <= set(edges)
    last_page = (capacity - 1) // page * page
    assert {last_page + 63, last_page + 64, last_page + 65} <= set(edges)
    for slots in collect(st_kv.slot_indices(capacity, page_size=page, edges=True), 20):
        assert set(edges) <= set(slots)
        assert all(0 <= s < capacity for s in slots)


def test_long_slot_lists_are_made_in_bulk_from_a_seed():
    """Past 64 slots a list is drawn in bulk: its length is the drawn size, every slot in range."""
    lists = collect(st_kv.slot_indices(5000, min_size=1000, max_size=4096, page_size=16), 10)
    assert all(1000 <= len(slots) <= 4096 for slots in lists)
    assert all(0 <= s < 5000 for slots in lists for s in slots)
    assert st_kv.bulk_slots(1000, 6, page_size=16, seed=1) == [942, 943, 944, 945, 946, 947]


def _world(num_slots: int, **options) -> st_kv.CanaryWorld:
    return collect(
        st_kv.canary_worlds(
            min_slots=num_slots,
            max_slots=num_slots,
            reads_kv=True,
            max_rows=2**20,
            max_page_size=256,
            max_bytes_per_token=32,
            max_capacity=2 * num_slots,
            **options,
        ),
        1,
    )[0]


def test_scale_worlds_have_the_slots_and_rings_asked_for():
    """canary_worlds reaches 2^16+ slots and rings of min_ring+ rows, with sources that
    address every slot."""
    for world in collect(
        st_kv.canary_worlds(
            min_slots=2**16 + 1,
            max_slots=2**17,
            min_ring=1024,
            max_ring=4096,
            max_rows=2**20,
            max_page_size=256,
            max_capacity=2**18,
        ),
        10,
    ):
        assert 2**16 < world.num_slots <= 2**17
        assert 1024 <= world.ring_capacity <= 4096
        assert all(layout.capacity >= world.num_slots for layout in world.sources)


def _written_entries(batch: st_kv.WriteBatch) -> list[int]:
    return [slot for chain in st_kv.chains_written(batch) for slot in chain.slots]


def test_a_bulk_batch_holds_one_long_request_of_min_written_entries():
    """write_batches with 8192 entries: one request writes them all, every slot distinct,
    positions without gaps over the written entries, skipped entries taking none."""
    world = _world(9000)
    for batch in collect(
        st_kv.write_batches(world, max_requests=1, max_entries=8448, min_written=8192), 5
    ):
        (request,) = batch.requests
        written = [k for k, slot in enumerate(request.slots) if slot >= 0]
        assert len(written) >= 8192
        slots = [request.slots[k] for k in written]
        assert len(set(slots)) == len(slots) and all(s < world.num_slots for s in slots)
        positions = [request.positions[k] for k in written]
        steps = {b - a for a, b in zip(positions, positions[1:], strict=False)}
        assert steps <= {1, 0, 2, -5, 1 - 2**64}, f"position steps {sorted(steps)[:5]}"


def test_a_bulk_batch_of_many_requests_continues_each_seed():
    """seeded=True: every request of a 257+ request launch continues one of the seeds, and
    no written slot is a seed or avoided."""
    world = _world(2000)
    seeds = tuple((slot, 100 + slot) for slot in range(1, 301))
    avoid = frozenset(range(301, 400))
    for batch in collect(
        st_kv.write_batches(
            world,
            seeds=seeds,
            avoid=avoid,
            max_requests=300,
            min_requests=257,
            max_entries=1,
            min_written=257,
            seeded=True,
        ),
        5,
    ):
        assert batch.capacity >= 257 and batch.active == batch.capacity
        stored = dict(seeds)
        for request in batch.requests:
            assert request.seed in stored
            for slot, position in zip(request.slots, request.positions, strict=True):
                if slot >= 0:
                    assert position == stored[request.seed] + 1
        written = _written_entries(batch)
        assert len(written) >= 257 and not set(written) & (set(stored) | avoid)


def test_bulk_batches_write_the_world_s_edge_slots_first():
    """A bulk batch's slots start with the world's power-of-two edge slots."""
    world = _world(70_000)
    (batch,) = collect(st_kv.write_batches(world, max_entries=200, min_written=100), 1)
    edges = set(st_kv.capacity_edges(world.num_slots))
    assert edges <= set(_written_entries(batch))


def test_a_sweep_plan_repeats_the_chains_to_min_entries():
    """verify_batches(min_entries=n) over fewer written entries holds n entries, each one a
    written slot (or padding 0), all of them active when min_checked is given."""
    world = _world(600)
    (batch,) = collect(st_kv.write_batches(world, max_entries=500, min_written=400), 1)
    chains = st_kv.chains_written(batch)
    written = set(_written_entries(batch))
    for exact in (True, False):
        for plan in collect(
            st_kv.verify_batches(chains, exact=exact, min_entries=33_000, min_checked=1), 3
        ):
            assert plan.capacity >= 33_000 and plan.active >= 33_000
            assert set(plan.slots) <= written | {0}


@pytest.mark.parametrize(
    "call",
    [
        lambda w: st_kv.write_batches(w, seeded=True),
        lambda w: st_kv.write_batches(w, seeded=1),
        lambda w: st_kv.write_batches(w, min_requests=4, max_requests=3),
        lambda w: st_kv.write_batches(w, long_requests=0),
        lambda w: st_kv.verify_batches((), min_entries=5),
        lambda w: st_kv.verify_batches((), min_entries=-1),
        lambda w: st_kv.source_layouts(min_page_size=9, max_page_size=8),
        lambda w: st_kv.source_layouts(min_capacity=10, max_capacity=5, max_rows=10),
        lambda w: st_kv.slot_indices(10, edges=1),
        lambda w: st_kv.canary_worlds(min_ring=7, max_ring=6),
    ],
    ids=[
        "seeded without seeds",
        "seeded not a bool",
        "min_requests above max",
        "no long request",
        "min_entries without chains",
        "negative min_entries",
        "min_page_size above max",
        "max_capacity below min",
        "edges not a bool",
        "min_ring above max",
    ],
)
def test_bad_scale_options_raise_invalid_argument(call):
    """The scale options are checked when the strategy is built."""
    world = _world(300)
    with pytest.raises(InvalidArgument):
        call(world)
