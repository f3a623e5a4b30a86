"""The engine model's prefix cache holds to SGLang's radix tree (run from source:
``conformance/sglang/radix_tree.py``): its insert (``checkpoint_into_tree`` over the unified tree
core's insert walk) frees the same duplicates, leaves the same row and the same tree, node by
node, in the same access order; its match (``match_prefix``) splits and stamps the tree as
SGLang's does; each way of departing from them is caught; and the named choices that stay
(CONTRACT §15) are shown with what they change."""

from __future__ import annotations

import collections
import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.sglang import memory, radix_tree, random_steps
from engine_model import Engine, EngineConfig, faults
from engine_model.eviction import Eviction


def _config(page_size: int, offset: int = 0) -> EngineConfig:
    return EngineConfig(
        page_size=page_size, num_pages=24, pool_rows=6, context_len=16, offset=offset
    )


def test_the_engine_inserts_and_matches_as_sglang_s_radix_cache_does():
    """Every insert of random histories (pages of 1, 2 and 4; EAGLE's bigram keys and not)
    frees the slots, leaves the row and the tree, and orders the tree's access times, as
    SGLang's insert over the same tree; every match leaves the tree as SGLang's match does;
    and the histories reach each kind, at least three times: an insert that frees a request's
    duplicates, one that splits a node, one that splits at the prompt's end, a finishing
    request's, a match that splits a node."""
    seen: collections.Counter = collections.Counter()
    for page_size in (1, 2, 4):
        for offset in (0, 1):
            for seed in range(3):
                found = radix_tree.tree_departures(_config(page_size, offset), 120, seed, seen)
                assert found == [], (page_size, offset, seed)
    assert all(seen[kind] >= 3 for kind in radix_tree.KINDS), dict(seen)


def test_the_engine_inserts_matches_and_locks_as_sglang_does_on_pages_of_16():
    """The CPU's largest pages (16 slots, a context of four pages): the inserts, matches and
    evictable leaves of random histories are SGLang's too. (The suite's own histories hold every
    insert and match at the sizes they draw: pages up to 16 slots on the CPU, 64 on a GPU.)"""
    seen: collections.Counter = collections.Counter()
    for offset in (0, 1):
        config = EngineConfig(page_size=16, num_pages=24, pool_rows=6, context_len=64, offset=offset)  # fmt: skip
        for seed in range(2):
            assert radix_tree.tree_departures(config, 120, seed, seen) == [], (offset, seed)
            assert radix_tree.lock_departures(config, 60, seed) == [], (offset, seed)
    assert seen["inserts"] >= 3 and seen["inserts of a finishing request"] >= 3, dict(seen)


def _without_prompt_split(self, req):
    """The model's earlier insert: no split at the prompt's end."""
    self.rebind(req)
    return self.cache_prefix(req)


def _without_rebind(self, req):
    """An insert that caches the request's pages and frees none of its duplicates."""
    return self.cache_prefix(req)


ORIGINAL_TOUCH = Eviction.touch_insert
ORIGINAL_SPLIT = Eviction._split


def _untouched_walk(self, entry, walked, new=0, left=None):
    """An insert that splits and adds nodes but touches none it walks."""
    return ORIGINAL_TOUCH(self, entry, 0, new, left) if new else None


def _unstamped_match(self, entry, matched):
    """A match that splits the node it ends inside but stamps no node it matched."""
    return ORIGINAL_SPLIT(self, entry, matched)


def _unsplit_match(self, entry, matched):
    """A match that stamps the nodes it walked but splits none."""
    self._split = lambda *_: None  # this engine's alone, for this match
    try:
        Eviction._touch_match(self, entry, matched)
    finally:
        del self._split


OTHERS = {
    "an insert without the split at the prompt's end": (Engine, "_checkpoint", _without_prompt_split),
    "an insert that frees no duplicate": (Engine, "_checkpoint", _without_rebind),
    "an insert that touches no node it walks": (Eviction, "touch_insert", _untouched_walk),
    "a match that stamps nothing": (Eviction, "_touch_match", _unstamped_match),
    "a match that splits nothing": (Engine, "_touch_match", _unsplit_match),
}  # fmt: skip


@pytest.mark.parametrize("other", OTHERS)
def test_an_insert_or_a_match_of_another_kind_is_caught(other, monkeypatch):
    """Able to fail: an insert or a match that departs from SGLang's is caught."""
    monkeypatch.setattr(*OTHERS[other])
    found = [radix_tree.tree_departures(_config(2), 120, seed) for seed in range(3)]
    assert any(found), other


def test_a_window_s_cache_is_not_run():
    """SGLang's SWA component of the insert is not run: a cache with a window is refused."""
    with pytest.raises(ValueError, match="window"):
        radix_tree.tree_departures(dataclasses.replace(_config(2), swa_window=4), 10, 0)


#: the steps of the histories that show a prefix cached twice: twins, and inserts
OPS = (*random_steps.STEPS[:3], "insert", "twin", *random_steps.STEPS[3:])


def _twice(config: EngineConfig, seeds: int = 6, steps: int = 150) -> list:
    """The prefixes the cache holds twice after each step of random histories with twins, each
    with whether one of its copies is a tombstone."""
    found = []
    for seed in range(seeds):
        engine = Engine(dataclasses.replace(config, allocators="model"))
        rng = np.random.default_rng(seed)
        for _ in range(steps):
            random_steps.random_step(engine, rng, OPS)
            for _, paths in radix_tree.prefixes_cached_twice(engine):
                found.append(any(radix_tree.tombstoned(engine, p) for p in paths))
    return found


def test_under_a_window_the_model_caches_a_prefix_twice_only_beside_a_tombstone():
    """A named choice (CONTRACT §15): SGLang's SWA component of the tree (what an insert does
    with a cached node whose window lost its SWA slots, a tombstone) is not run; the model does
    not match a prefix whose window it lost, and keeps the request's copy beside it. What that
    changes: the model's cache holds such a prefix twice, its old pages freed only by an
    eviction; without a window it never holds a prefix twice, and under one only where a copy
    lost an SWA slot in the window of a request that shares it."""
    assert _twice(_config(2)) == []
    windowed = _twice(dataclasses.replace(_config(2), swa_window=4, swa_slots=24))
    assert windowed, "no prefix cached twice under a window"
    assert all(windowed)


def _served(engine: Engine) -> None:
    """Admit two requests, the second sharing the first's cached prefix, prefill, decode and
    finish them: two inserts at least, a match, two finishes."""
    engine.admit(6)
    engine.prefill(8)
    engine.decode()
    engine.admit(3, share=1)
    engine.prefill(8)
    engine.decode()
    engine.finish(0)
    engine.finish(0)


def test_sglang_s_tree_holds_every_insert_and_match_of_an_engine_on_its_allocators(monkeypatch):
    """An engine on SGLang's allocators (the suite's histories) has every insert and match held
    by SGLang's tree code as it makes it; a departure raises there. Able to fail: an insert
    without the split at the prompt's end raises; and once a fault is made in an engine the
    code no longer holds its steps."""
    assert memory.allocators()[0] == "sglang", memory.allocators()  # it registers them
    config = dataclasses.replace(_config(2), allocators="sglang")
    assert radix_tree.usable()[0], radix_tree.usable()
    radix_tree.TREE.seen.clear()
    _served(Engine(config))
    seen = radix_tree.TREE.seen
    assert seen["inserts"] >= 2 and seen["matches"] >= 1 and seen["inserts of a finishing request"] == 2, dict(seen)  # fmt: skip
    faulty = Engine(config)
    faulty.admit(6)
    faulty.admit(5)
    faulty.prefill(12)
    faulty.decode()
    assert radix_tree.TREE.applies(faulty)
    assert faults.make(faulty, "req_to_token", 0) is not None
    assert not radix_tree.TREE.applies(faulty)
    monkeypatch.setattr(Engine, "_checkpoint", _without_prompt_split)
    with pytest.raises(radix_tree.TreeDeparture, match="insert of request"):
        _served(Engine(config))


def test_the_tree_is_held_only_where_the_model_follows_the_release_s(monkeypatch):
    """SGLang's tree code holds the suite's histories only where the engine model follows the
    installed release's tree (a short fixed history departs nowhere): on the default release it
    does. Able to fail: a model whose insert departs (no split at the prompt's end) is not
    held, and the reason says so."""
    assert radix_tree.usable() == (True, "")
    for offset in (0, 1):
        seen = radix_tree.tried(offset)
        assert seen["inserts that freed a duplicate"] and seen["inserts that split at the prompt's end"]  # fmt: skip
    monkeypatch.setattr(Engine, "_checkpoint", _without_prompt_split)
    radix_tree.usable.cache_clear()
    try:
        held, why = radix_tree.usable()
        assert not held and "does not follow this release's tree" in why, why
    finally:
        radix_tree.usable.cache_clear()


def test_the_engine_keeps_from_eviction_the_nodes_sglang_s_locks_keep():
    """After every step of random histories, the engine's evictable leaves are SGLang's once
    each running request holds the lock its last match or insert took (``inc_lock_ref``, run
    from source), in histories where locks keep leaves from eviction."""
    seen: collections.Counter = collections.Counter()
    for page_size in (1, 2, 4):
        for offset in (0, 1):
            found = radix_tree.lock_departures(_config(page_size, offset), 120, 0, seen)
            assert found == [], (page_size, offset)
    assert seen["states with a leaf a lock kept"] >= 3, dict(seen)


ORIGINAL_LEAVES = Engine.evictable_leaves


def _unlocked_leaves(self):
    """The evictable leaves of an engine that ignores its running requests' holds."""
    held, self.req_refs = self.req_refs, np.zeros_like(self.req_refs)
    try:
        return ORIGINAL_LEAVES(self)
    finally:
        self.req_refs = held


def test_a_leaf_evictable_under_a_lock_is_caught(monkeypatch):
    """Able to fail: an engine that would evict a leaf a running request holds departs."""
    monkeypatch.setattr(Engine, "evictable_leaves", _unlocked_leaves)
    assert radix_tree.lock_departures(_config(2), 120, 0)


#: what a fresh Python process prints after importing the suite's modules: the allocators its
#: histories run on, and whether SGLang's tree holds them
IMPORTED = """
from conformance.sglang import memory, radix_tree
import conformance.test_engine
print(memory.allocators()[0], radix_tree.usable())
"""
#: the process finds no SGLang installed
WITHOUT_SGLANG = """
import importlib.util
found = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name == "sglang" else found(name, *a, **k)
"""
#: the process finds SGLang and no msgspec (a GPU host that installs nothing)
WITHOUT_MSGSPEC = """
import sys
sys.modules["msgspec"] = None  # an import of it raises ImportError
"""


def _imported(setup: str) -> str:
    """What :data:`IMPORTED` prints in a fresh process after ``setup``; it must exit 0."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run(
        [sys.executable, "-c", setup + IMPORTED],
        capture_output=True,
        text=True,
        cwd=root,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_without_sglang_the_histories_run_on_the_model_s_own_lists_and_tree():
    """Where SGLang is not installed the suite still imports (its engine histories among its
    modules), and runs them on the engine model's own lists, walk and tree, saying why."""
    out = _imported(WITHOUT_SGLANG)
    assert out.split()[0] == "model" and "(False, 'no installed release" in out, out


def test_without_msgspec_the_histories_run_on_sglang_s_lists_and_the_model_s_tree():
    """Where msgspec is not installed the suite still imports; its histories run on SGLang's
    allocators and walk, and on the engine model's own insert and match, unheld, saying why."""
    out = _imported(WITHOUT_MSGSPEC)
    assert (
        out.split()[0] == "sglang" and "(False, 'ModuleNotFoundError: import of msgspec" in out
    ), out


def test_a_prefix_cached_twice_without_a_tombstone_is_caught(monkeypatch):
    """Able to fail: an insert that frees no duplicate caches a prefix twice without a window,
    and under one beside no tombstone."""
    monkeypatch.setattr(Engine, "_checkpoint", _without_rebind)
    assert _twice(_config(2), seeds=2)
    assert not all(_twice(dataclasses.replace(_config(2), swa_window=4, swa_slots=24), seeds=2))


def test_a_finish_inserts_what_sglang_s_release_checkpoints():
    """A finishing request's insert (:meth:`Engine.checkpoint` from ``finish``) takes the
    positions SGLang's ``release_kv_cache(checkpoint=True)`` (run from source) checkpoints into
    the tree: everything the request owns, its written positions, page-aligned by the insert."""
    engine = Engine(dataclasses.replace(_config(2), allocators="model"))
    engine.admit(6)
    engine.prefill(8)
    engine.decode()
    req = next(iter(engine.running.values()))
    made: list[int] = []
    memory.release_ranges(engine, req, made)
    assert made == [req.written]
    inserted: list[int] = []
    monkey = engine.checkpoint
    engine.checkpoint = lambda r: inserted.append(monkey(r)) or inserted[-1]  # type: ignore[method-assign]
    engine.finish(0)
    assert inserted == [req.written // 2 * 2], (inserted, req.written)
