"""The engine model's insert into its prefix cache holds to SGLang's (``checkpoint_into_tree``
over the unified tree core's insert walk, run from source: ``conformance/sglang/
radix_insert.py``): the same duplicates freed, the same row, the same tree, node by node, in the
same access order; and each way of departing from it is caught."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from conformance.sglang import radix_insert
from engine_model import Engine, EngineConfig
from engine_model.eviction import Eviction


def _config(page_size: int, offset: int = 0) -> EngineConfig:
    return EngineConfig(
        page_size=page_size, num_pages=24, pool_rows=6, context_len=16, offset=offset
    )


def test_the_engine_inserts_as_sglang_s_radix_cache_does():
    """Every insert of random histories (pages of 1, 2 and 4; EAGLE's bigram keys and not)
    frees the slots, leaves the row and the tree, and orders the tree's access times, as
    SGLang's insert over the same tree; and the histories reach each kind of insert: one that
    frees a request's duplicates, one that splits a node, one that splits at the prompt's end,
    a finishing request's."""
    seen: collections.Counter = collections.Counter()
    for page_size in (1, 2, 4):
        for offset in (0, 1):
            for seed in range(3):
                found = radix_insert.checkpoint_departures(
                    _config(page_size, offset), 120, seed, seen
                )
                assert found == [], (page_size, offset, seed)
    assert all(seen[kind] >= 3 for kind in radix_insert.KINDS), dict(seen)


def _without_prompt_split(self, req):
    """The model's earlier insert: no split at the prompt's end."""
    self.rebind(req)
    return self.cache_prefix(req)


def _without_rebind(self, req):
    """An insert that caches the request's pages and frees none of its duplicates."""
    return self.cache_prefix(req)


ORIGINAL_TOUCH = Eviction.touch_insert


def _untouched_walk(self, entry, walked, new=0, left=None):
    """An insert that splits and adds nodes but touches none it walks."""
    return ORIGINAL_TOUCH(self, entry, 0, new, left) if new else None


OTHER_INSERTS = {
    "no split at the prompt's end": (Engine, "checkpoint", _without_prompt_split),
    "no duplicate freed": (Engine, "checkpoint", _without_rebind),
    "no node walked touched": (Eviction, "touch_insert", _untouched_walk),
}


@pytest.mark.parametrize("other", OTHER_INSERTS)
def test_an_insert_of_another_kind_is_caught(other, monkeypatch):
    """Able to fail: an insert that departs from SGLang's is caught."""
    monkeypatch.setattr(*OTHER_INSERTS[other])
    found = [radix_insert.checkpoint_departures(_config(2), 120, seed) for seed in range(3)]
    assert any(found), other


def test_a_window_s_cache_is_not_run():
    """SGLang's SWA component of the insert is not run: a cache with a window is refused."""
    with pytest.raises(ValueError, match="window"):
        radix_insert.checkpoint_departures(dataclasses.replace(_config(2), swa_window=4), 10, 0)
