"""engine_model.eviction: the prefix cache evicts whole least-recently-used leaf nodes when an
allocation finds the allocator short, never a node a running request holds, and the pages go to
the allocation that asked for them."""

from __future__ import annotations

from engine_model import Engine, EngineConfig


def _engine() -> Engine:
    """Pages of 2 slots, 9 to hand out: two finished prompts of 6 tokens leave 3 free."""
    engine = Engine(EngineConfig(page_size=2, num_pages=10, pool_rows=4, context_len=8))
    for _ in range(2):
        engine.admit(6)
        engine.prefill(8)
        engine.finish(0)
    assert [e.length for e in engine.cache] == [6, 6] and len(engine.free_pages) == 3
    return engine


def test_an_allocation_short_of_pages_evicts_the_least_recently_used_leaf_whole():
    engine = _engine()
    older = engine.cache[0].pages
    engine.admit(8)  # 4 pages: one short
    engine.prefill(8)
    assert engine.last_evicted == [older]  # the whole node, though one page was missing
    (req,) = engine.running.values()
    assert set(older) <= set(req.pages)  # handed out at once
    assert engine.events["a cached page evicted"] == 3
    assert engine.events["a page freed and handed out again within one step"] == 3


def test_a_match_makes_a_cached_path_the_most_recently_used():
    engine = _engine()
    first, second = (e.pages for e in engine.cache)
    engine.admit(2, share=2)  # matches the first prompt's cached prefix (2 % 2 == 0) ...
    engine.retract(0)  # ... and leaves it, caching nothing new
    engine.admit(8)
    engine.prefill(8)
    assert engine.last_evicted == [second]


def test_a_leaf_a_running_request_holds_is_never_evicted():
    engine = _engine()
    first, second = (e.pages for e in engine.cache)
    holder = engine.admit(2, share=1)  # holds the newer path's pages
    engine.admit(2, share=2)  # matches the older path: the newer one is the older now ...
    engine.retract(1)  # ... and leaves it
    assert set(engine.running) == {holder}
    engine.admit(6)
    engine.prefill(8)  # 1 page and 3: 1 short, and the older path locked
    assert engine.last_evicted == [first]
    assert all(engine.req_refs[p] for p in second)
