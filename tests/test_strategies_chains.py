"""Self-tests of the write/verify strategies: each option's guarantee holds in every draw."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from draws import collect
from hypothesis.errors import InvalidArgument

import strategies as st_kv

DRAWS = 100


def test_reads_kv_worlds_all_read_kv_bytes():
    """``reads_kv=True``: every world has a source and a mode that reads (PARTIAL or ALL)."""
    worlds = collect(st_kv.canary_worlds(reads_kv=True), DRAWS)
    assert all(world.reads_kv for world in worlds)
    assert {world.mode for world in worlds} == {1, 2}
    assert {len(world.sources) for world in worlds} == {1, 2}


def test_reads_kv_keeps_only_the_reading_modes_asked_for():
    """``reads_kv=True`` with ``modes=(0, 2)`` draws ALL only."""
    worlds = collect(st_kv.canary_worlds(reads_kv=True, modes=(0, 2)), DRAWS)
    assert {world.mode for world in worlds} == {2} and all(world.sources for world in worlds)


def test_min_sources_is_a_floor():
    """``min_sources``: no world has fewer sources; every count up to the maximum is drawn."""
    counts = collect(st_kv.canary_worlds(min_sources=2, max_sources=3), DRAWS, lambda w: w.sources)
    assert {len(sources) for sources in counts} == {2, 3}


@pytest.mark.parametrize(
    ("modes", "allowed"),
    [((1,), {1}), ((0, 2), {0, 2}), (st.just(2), {2}), (st.sampled_from([1, 2]), {1, 2})],
)
def test_modes_are_drawn_from_what_is_given(modes, allowed):
    """``modes`` as a tuple or a strategy: every world's mode is one of them, each drawn."""
    drawn = set(collect(st_kv.canary_worlds(modes=modes), DRAWS, lambda w: w.mode))
    assert drawn == allowed


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(modes=()),
        dict(modes=(3,)),
        dict(modes=(True,)),
        dict(modes=5),
        dict(reads_kv=False),
        dict(reads_kv=1),
        dict(reads_kv=True, modes=(0,)),
        dict(reads_kv=True, max_sources=0),
        dict(min_sources=3, max_sources=2),
        dict(min_sources=-1),
        dict(max_sources=7),
        dict(min_slots=1),
        dict(max_ring=-1),
        dict(max_slots=100),
    ],
    ids=repr,
)
def test_bad_world_arguments_raise_invalid_argument(kwargs):
    """Arguments are checked when the strategy is made, with InvalidArgument."""
    with pytest.raises(InvalidArgument):
        st_kv.canary_worlds(**kwargs)


def test_a_modes_strategy_that_draws_none_under_reads_kv_is_refused():
    """A ``modes`` strategy is drawn as given; NONE under ``reads_kv=True`` is a usage error."""
    with pytest.raises(InvalidArgument, match="reads no KV"):
        collect(st_kv.canary_worlds(reads_kv=True, modes=st.just(0)), 1)
