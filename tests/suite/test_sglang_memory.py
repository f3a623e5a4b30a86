"""SGLang's allocators, run from their source (``conformance/sglang/memory.py``), choose the
pages and pool rows of the SGLang legs' and the suite's engine histories; the engine model's own
lists, which the older releases run on, hold to them: the same pages and pool rows, and the same
free lists, over random allocations and frees and over whole histories."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.sglang import histories, memory, swa_paging
from engine_model import Engine, EngineConfig, free_lists
from engine_model.free_lists import PageList, RowList


def _config(page_size: int) -> EngineConfig:
    return EngineConfig(page_size=page_size, num_pages=24, pool_rows=6, context_len=16)


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_the_engine_allocates_pages_and_rows_as_sglang_does(page_size):
    for seed in range(4):
        assert memory.departures(_config(page_size), 150, seed) == []


def _fifo_pages(self, pages):
    self._free.extend(pages)


def _front_row(self):
    return self._free.pop(0)


#: the engine's earlier orders: freed pages behind every free page, rows from the front
OTHER_ORDERS = {
    "pages freed to the back": (PageList, "free", _fifo_pages),
    "rows taken from the front": (RowList, "take", _front_row),
}


@pytest.mark.parametrize(("page_size", "order"), [(2, "pages freed to the back"), (1, "rows taken from the front")])  # fmt: skip
def test_an_allocator_in_another_order_is_caught(page_size, order, monkeypatch):
    """Able to fail: the engine's earlier orders depart from SGLang's."""
    monkeypatch.setattr(*OTHER_ORDERS[order])
    found = [memory.departures(_config(page_size), 150, seed) for seed in range(4)]
    assert any(found), found


def _both(index: int, steps: int = histories.STEPS) -> tuple[Engine, Engine]:
    """History ``index`` of the SGLang legs (``steps`` long) run on an engine whose free lists
    are SGLang's (the legs' own) and on one whose lists are the model's."""
    config = histories.engine_config(index)
    assert config.allocators == "sglang", memory.allocators()
    engines = Engine(config), Engine(dataclasses.replace(config, allocators="model"))
    for engine in engines:
        histories.history(index, steps, engine=engine)
    return engines


#: one history of each page size, window and EAGLE offset (histories.PAGE_SIZES, ...)
INDICES = (0, 1, 2, 3, 7, 11)


@pytest.mark.parametrize("index", INDICES)
def test_sglang_s_allocators_drive_the_histories_and_the_model_s_lists_agree(index):
    """The legs' histories take their pages and pool rows from SGLang's own allocator and
    request pool (run from source, ``memory.SGLangPages`` and ``SGLangRows``), their evictions
    from its radix cache's walk; a history on the model's lists and walk makes every step alike:
    the same log, page table and free lists."""
    theirs, mine = _both(index)
    assert isinstance(theirs.page_allocator, memory.SGLangPages)
    assert isinstance(theirs.row_allocator, memory.SGLangRows)
    assert theirs.steps == mine.steps > 30 and theirs.log == mine.log
    assert (theirs.req_to_token == mine.req_to_token).all()
    assert (theirs.free_pages, theirs.free_rows) == (mine.free_pages, mine.free_rows)


def test_sglang_s_walk_chooses_what_the_histories_evict(monkeypatch):
    """On SGLang's allocators an eviction takes the cached nodes SGLang's radix cache walk
    chooses (``memory.eviction_walk``, run from source), and the histories evict."""
    calls = []
    walk = free_lists.EVICTIONS["sglang"]
    monkeypatch.setitem(free_lists.EVICTIONS, "sglang", lambda e, t: calls.append(t) or walk(e, t))
    evicting = sum(_both(i)[0].events["an allocation that evicted cached leaves"] for i in INDICES)
    assert evicting > 0 and len(calls) >= evicting


def test_only_sglang_s_own_methods_change_its_free_list_in_correct_histories(monkeypatch):
    """The stand-in is no more capable than SGLang's allocator: in correct histories its free
    list changes only by SGLang's own ``alloc`` and ``free``, never set from outside
    (``first_in_line``), which only a fault does (seen here: a page freed while in use)."""
    from conformance.engine_support import warm_up
    from engine_model import faults

    set_from_outside = []
    real = memory.SGLangPages.first_in_line
    monkeypatch.setattr(memory.SGLangPages, "first_in_line",
                        lambda self, pages: set_from_outside.append(list(pages)) or real(self, pages))  # fmt: skip
    for index in INDICES:
        _both(index)
    assert set_from_outside == []
    engine = Engine(histories.engine_config(0))
    warm_up(engine, lambda step: None)  # every fault class has a place after it
    assert faults.make(engine, "freed_while_referenced", 0, 0) is not None
    assert set_from_outside


def _reversed_walk(engine, tokens):
    return list(reversed(memory.eviction_walk(engine, tokens)))


@pytest.mark.parametrize("walk", [_reversed_walk, lambda engine, tokens: []], ids=["reversed", "none"])  # fmt: skip
def test_a_walk_that_chooses_otherwise_changes_the_histories(walk, monkeypatch):
    """Able to fail: with a walk of another choice (SGLang's nodes in reverse order, or none)
    some history evicts otherwise than on the model's walk, or the engine refuses a node that
    is no evictable leaf. The histories run twice as long as the legs' (an eviction of two
    nodes or more, which only the order tells apart, comes later)."""
    monkeypatch.setitem(free_lists.EVICTIONS, "sglang", walk)
    differ = []
    for index in INDICES:
        try:
            theirs, mine = _both(index, 2 * histories.STEPS)
        except AssertionError as refused:
            differ.append("no evictable leaf" in str(refused))
            continue
        differ.append(theirs.log != mine.log or (theirs.req_to_token != mine.req_to_token).any())
    assert any(differ)


@pytest.mark.parametrize("order", OTHER_ORDERS)
def test_a_history_on_lists_of_another_order_departs(order, monkeypatch):
    """Able to fail: with the model's lists in another order, some history's page table or
    free lists differ from the one SGLang's allocators make."""
    monkeypatch.setattr(*OTHER_ORDERS[order])
    differ = []
    for index in INDICES:
        theirs, mine = _both(index)
        differ.append(
            (theirs.req_to_token != mine.req_to_token).any()
            or (theirs.free_pages, theirs.free_rows) != (mine.free_pages, mine.free_rows)
        )
    assert any(differ)


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_the_engine_evicts_the_cached_nodes_sglang_s_walk_evicts(page_size):
    """The prefix cache's eviction for an allocation takes the nodes, whole and in the order,
    that SGLang's unified radix cache's walk takes over the same tree (run from source)."""
    for seed in range(3):
        assert memory.eviction_departures(_config(page_size), 120, seed) == []


#: other choices of leaves: the newest first, or the last page of each where SGLang takes the
#: whole node (the engine's earlier eviction)
OTHER_CHOICES = {
    "newest first": lambda leaves: [(-t, i, e, first) for t, i, e, first in leaves],
    "a page at a time": lambda leaves: [(t, i, e, len(e.pages) - 1) for t, i, e, _ in leaves],
}


@pytest.mark.parametrize("choice", OTHER_CHOICES)
def test_an_eviction_of_another_choice_is_caught(choice, monkeypatch):
    """Able to fail: an eviction that chooses its leaves otherwise departs from SGLang's walk."""
    original = Engine.evictable_leaves
    monkeypatch.setattr(
        Engine, "evictable_leaves", lambda self: OTHER_CHOICES[choice](original(self))
    )
    found = [memory.eviction_departures(_config(2), 120, seed) for seed in range(3)]
    assert any(found), found


@pytest.mark.parametrize("offset", [0, 1])  # EAGLE's draft model: SGLang's bigram keys
@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_the_engine_matches_the_prefix_sglang_s_radix_tree_matches(page_size, offset):
    """Every running request's tokens, after every step of a random history, match as long a
    cached prefix in the engine as SGLang's unified tree core's match (``RadixKey`` and
    ``match_full_device_prefix``, run from source) finds in the same tree, keyed by tokens."""
    config = dataclasses.replace(_config(page_size), offset=offset)
    for seed in range(3):
        assert memory.match_departures(config, 120, seed) == []


ORIGINAL_MATCH = Engine.tree_match
OTHER_MATCHES = {
    "a page short": lambda self, req, entry=None, limit=None: (
        lambda best, m: (best, max(0, m - self.config.page_size))
    )(*ORIGINAL_MATCH(self, req, entry, limit)),
    "the first page only": lambda self, req, entry=None, limit=None: (
        lambda best, m: (best, min(m, self.config.page_size))
    )(*ORIGINAL_MATCH(self, req, entry, limit)),
}


@pytest.mark.parametrize("other", OTHER_MATCHES)
def test_a_match_of_another_length_is_caught(other, monkeypatch):
    """Able to fail: a match that stops short of SGLang's departs from it."""
    monkeypatch.setattr(Engine, "tree_match", OTHER_MATCHES[other])
    assert memory.match_departures(_config(2), 120, 0)


def test_two_cached_paths_under_one_key_are_caught():
    """Able to fail: a cache holding one prefix's tokens twice, in other pages, is no tree
    SGLang's insert makes."""
    engine = Engine(dataclasses.replace(_config(2), allocators="model"))
    engine.admit(6)
    engine.prefill(6)
    assert engine.cache, "the prefill inserted nothing"
    entry = engine.cache[0]
    engine.cache.append(dataclasses.replace(entry, pages=tuple(p + 1 for p in entry.pages)))
    with pytest.raises(AssertionError, match="two cached paths"):
        memory.sglang_match(engine, list(entry.tokens))


def test_a_draft_extend_writes_the_verify_s_window_as_sglang_lays_it_out():
    """The draft model's draft extend writes, for each request, the verify's whole window from
    its committed length, rejected drafts included, as SGLang's ``prepare_for_draft_extend``
    (run from source) lays it out: the same prefix, extend and sequence lengths; the request
    commits only the accepted positions. Able to fail: a draft extend of the accepted
    positions alone is not SGLang's layout."""
    engine = Engine(dataclasses.replace(_config(2), offset=1, allocators="model"))
    for _ in range(3):
        engine.admit(4)
    engine.prefill(12)
    engine.decode()
    before = {r.row: r.written for r in engine.running.values()}
    forward = engine.draft_extend(3, accept=0)
    assert forward is not None
    rows = forward.plan["req_pool_indices"]
    live = rows != 0
    prefix = forward.plan["prefix_lens"][live].tolist()
    extend = forward.plan["extend_seq_lens"][live].tolist()
    theirs = memory.draft_extend_layout(prefix, 3)
    assert theirs.forward_mode == forward.mode == "DRAFT_EXTEND_V2"
    assert (prefix, extend) == (theirs.prefix_lens, theirs.extend_lens)
    assert [p + e for p, e in zip(prefix, extend, strict=True)] == theirs.seq_lens
    committed = {r.row: r.written - before[r.row] for r in engine.running.values()}
    assert set(committed.values()) == {1, 2, 3}, committed  # some rows rejected drafts
    assert theirs.extend_lens != [committed[int(r)] for r in rows[live]]


@pytest.mark.parametrize("page_size", [1, 2, 4])
def test_a_retraction_frees_the_pages_sglang_s_release_gives_back(page_size):
    """A retraction frees the pages of the positions SGLang's ``release_kv_cache`` (run from
    source, ``checkpoint=False``) gives back: what the request owns past its cached prefix,
    and a speculative server's over-allocation past that; it caches nothing new."""
    for seed in range(2):
        assert memory.release_departures(_config(page_size), 150, seed) == []


def _caching_retract(self, pick):
    """The model's earlier retraction: what the request wrote is cached first."""
    req = Engine.retractable(self)[pick % len(Engine.retractable(self))]
    self.cache_prefix(req)
    return ORIGINAL_RETRACT(self, pick)


ORIGINAL_RETRACT = Engine.retract


def test_a_retraction_that_caches_what_it_wrote_is_caught(monkeypatch):
    """Able to fail: a retraction that caches the request's written prefix (SGLang caches
    nothing new) frees fewer pages than SGLang's release."""
    monkeypatch.setattr(Engine, "retract", _caching_retract)
    assert any(memory.release_departures(_config(2), 150, seed) for seed in range(2))


def test_a_target_verify_holds_pages_as_sglang_s_spec_v2_sizes_them():
    """The positions a target verify's row holds pages for are SGLang's spec v2 sizing's (run
    from source): the committed length plus twice the draft allocation, rounded to a page."""
    assert memory.reserve_departures() == []


OTHER_RESERVES = {
    "once the draft allocation": lambda self, req, reserve: ORIGINAL_RESERVE(
        self, req, reserve // 2
    ),
    "not rounded to a page": lambda self, req, reserve: max(
        len(req.pages) * self.config.page_size, req.written + reserve
    ),
}
ORIGINAL_RESERVE = Engine.verify_alloc_to


@pytest.mark.parametrize("reserve", OTHER_RESERVES)
def test_a_reserve_of_another_size_is_caught(reserve, monkeypatch):
    """Able to fail: the draft allocation once, or a length not rounded to a page."""
    monkeypatch.setattr(Engine, "verify_alloc_to", OTHER_RESERVES[reserve])
    assert memory.reserve_departures()


def test_the_engine_frees_every_swa_slot_sglang_s_window_slide_frees():
    """A named choice (CONTRACT §15): the model frees a request's SWA pages wholly behind its
    window after each forward, SGLang's radix cache with a margin, keeping the window rounded up
    to whole pages, and above the protected prefix. Whatever SGLang's code, run from source, has
    freed, the model has freed too: SWA slots are reused no later in the histories than on a
    server, and the model frees more."""
    cases, departures, theirs, kept = memory.swa_free_departures()
    assert cases > 1000 and theirs > 0 and kept > 0
    assert departures == []


def test_an_swa_free_later_than_sglang_s_is_caught(monkeypatch):
    """Able to fail: a model that kept a page behind its window frees less than SGLang."""
    from engine_model.state import EngineState
    from engine_model.vocabulary import SWA

    real = EngineState.window_start
    monkeypatch.setattr(EngineState, "window_start",
                        lambda self, prefix, group=SWA: max(0, real(self, prefix, group) - 4))  # fmt: skip
    _, departures, _, _ = memory.swa_free_departures(page_sizes=(1, 2), windows=(3,))
    assert departures


def test_sglang_s_swa_allocator_pages_the_swa_pool_in_step_with_the_full_pool():
    """CONTRACT §15: SGLang's ``SWATokenToKVPoolAllocator``, run from source at pages of 2, 4
    and 16 slots over random extends and frees: every allocated slot ``k`` of a full page maps
    to slot ``k`` of one SWA page, and a free of any slot of a page clears the whole page and
    gives its SWA page back, the rule the engine model's SWA pages keep
    (``tests/engine_model/test_engine.py``'s invariants)."""
    cases, departures, freed = swa_paging.paging_departures()
    assert cases > 1000 and freed > 1000
    assert departures == []


def test_an_swa_free_of_the_slot_alone_is_caught(monkeypatch):
    """Able to fail: an allocator that freed only the slot it was given, not its page."""
    monkeypatch.setitem(swa_paging._methods()[0], "_expand_to_full_pages", lambda self, i: i)
    _, departures, _ = swa_paging.paging_departures(page_sizes=(4,), seeds=2)
    assert any("a free of slot" in d for d in departures)


def test_swa_slots_out_of_step_with_their_full_page_are_caught(monkeypatch):
    """Able to fail: an allocator whose SWA slots of one extend are handed out rotated."""
    methods = swa_paging._methods()[0]
    real = methods["set_full_to_swa_mapping"]
    monkeypatch.setitem(methods, "set_full_to_swa_mapping",
                        lambda self, full, swa: real(self, full, swa.roll(1)))  # fmt: skip
    _, departures, _ = swa_paging.paging_departures(page_sizes=(4,), seeds=2)
    assert any("SWA slots" in d for d in departures)
