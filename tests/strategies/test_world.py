"""strategies.world: a fixed world from a few fields, the rest at plain defaults."""

from __future__ import annotations

import pytest
from hypothesis.errors import InvalidArgument

import strategies as st_kv
from reference import RealKvHashMode

NONE = RealKvHashMode.NONE
ALL = RealKvHashMode.ALL


def test_a_plain_world_has_one_source_for_every_slot():
    """By default: mode ALL, one flat source of exactly num_slots slots, an empty ring."""
    world = st_kv.world(num_slots=12)
    assert (world.mode, world.num_slots, world.ring_start, len(world.sources)) == (ALL, 12, 0, 1)
    assert world.sources[0].capacity == 12
    # a CanaryWorld holds plain ints
    assert st_kv.world(sources=[], mode=int(NONE)).sources == ()


def test_a_source_too_small_for_the_world_is_refused():
    """A source that addresses fewer slots than the world has is an InvalidArgument."""
    with pytest.raises(InvalidArgument, match=r"sources \[1\] address fewer than num_slots=8"):
        st_kv.world(sources=(st_kv.layout(rows=8), st_kv.layout(rows=7)))
