"""SGLang's allocators and radix cache eviction walk, run from their source: they choose the
pages, pool rows and evicted nodes of the suite's engine histories, and the engine model's own
lists and walk, which the older releases run on, hold to them.

The engine model (``engine_model/allocators.py``, ``engine_model/free_lists.py``) asks its free
lists for pages and pool rows; on an engine whose configuration names ``allocators="sglang"``
(:func:`allocators`: the installed release has them in this shape, 0.5.20 on) those lists are
SGLang's own allocators, run on the CPU from the installed release's source (their modules
import the serving stack): :class:`SGLangPages` and :class:`SGLangRows`, and an eviction takes
the nodes SGLang's walk chooses (:func:`eviction_walk`). The model's own lists and walk are held
to the same choices on the same sequences by self-tests (:func:`departures`,
:func:`eviction_departures`):

- ``TokenToKVPoolAllocator`` (``mem_cache/allocator/token.py``), pages of one slot: ``alloc``
  takes from the front of its free list, ``free`` appends;
- ``PagedTokenToKVPoolAllocator`` (``mem_cache/allocator/paged.py``), larger pages: ``alloc``
  takes whole pages from the front, ``free`` puts a call's pages, sorted, before every free
  page (``_release_page_ids`` without ``need_sort``: a server without PD);
- ``ReqToTokenPool`` (``mem_cache/memory_pool.py``): ``alloc_rows`` takes from the tail of its
  free list, ``free_rows`` appends.

Each is a stand-in object holding the fields those methods read, the methods SGLang's own.

The prefix cache's eviction (:mod:`engine_model.eviction`) is held to the walk of SGLang's
unified radix cache (:func:`eviction_departures`): ``FullComponent._evict_device_start`` and
``_evict_device_next_node`` (``mem_cache/unified_cache/components/full.py``), with
``_ensure_eviction_strategy``, ``LRUStrategy`` (``mem_cache/evict_policy.py``) and
``UnifiedTreeNode.__lt__`` (``unified_cache/unified_tree_core.py``), run from source over a tree
of stand-in nodes built from the engine's cached paths, radix nodes, access times and locks. The
tree core's part of each step, a stand-in here, is what ``_evict_device_leaf`` does to the walk:
the node's tokens counted, the node taken from its parent, the parent an evictable leaf when it
has no child left and no lock. The locks are the engine's (a running request holds a page of the
node or below), which :func:`conformance.sglang.radix_tree.lock_departures` holds to SGLang's
``inc_lock_ref``.

The prefix cache's match (:meth:`engine_model.Engine.tree_match`) is held to the unified tree
core's read-only match of the full pool (:func:`match_departures`):
``UnifiedTreeCore.match_full_device_prefix`` with ``RadixKey`` (``mem_cache/radix_cache.py``;
under EAGLE's offset its bigram keys), run from source over the engine's cached paths as SGLang's
tree holds them (:func:`sglang_match`: a node a radix node of the engine, keyed by its tokens,
its value its slots), which also shows the cache holds no prefix's tokens twice. The insert
(its split, its rebind of a request's row to the cached pages) is held to SGLang's
``checkpoint_into_tree`` by :mod:`conformance.sglang.radix_tree`.

A retraction (:meth:`engine_model.Engine.retract`) frees the pages of the positions SGLang's
``release_kv_cache(checkpoint=False)`` (``mem_cache/common.py``, with
``_release_overallocated_kv_indices``) gives back, run from source over a stand-in request and
tree cache holding the request's lengths (:func:`release_departures`): what it owns past its
cached prefix, and a speculative server's over-allocation past that. The draft model's draft
extend has the layout of ``prepare_for_draft_extend`` (``speculative/eagle_worker_common.py``,
run from source with ``ForwardBatch.init_new`` a stand-in that keeps what it is given:
:func:`draft_extend_layout`): the verify's whole window from the committed length.

A target verify's allocation (:meth:`engine_model.forwards.Forwards.verify_alloc_to`) is held
to SGLang's spec v2 sizing (:func:`reserve_departures`): ``get_alloc_len_per_decode``,
``get_alloc_reserve_per_decode`` and ``page_aligned_decode_alloc_lens``
(``mem_cache/allocation_sizing.py``), run from source with the server's options as stand-ins
(``get_spec``, ``get_alloc_page_size``, ``max_speculative_num_draft_tokens`` and
``SpeculativeAlgorithm.from_string``, an EAGLE chain: ``topk`` 1, ``drafts - 1`` steps).

The engine model's SWA frees (every page wholly behind a request's window, after each forward)
are a named choice beside SGLang's ``free_swa_out_of_window_slots`` (``mem_cache/common.py``, with
``ReqKvInfo.swa_dead_lo``, ``get_evicted_seqlen`` and ``set_evicted_seqlen`` of
``managers/schedule_batch.py``), run from source as a prefix-sharing radix cache slides a
decoding request's window (:func:`swa_free_departures`): whatever SGLang frees, the model has
freed, and it frees more (SGLang's page-aligned margin and protected prefix).
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import functools
import heapq
import inspect
import types
from array import array

import numpy as np
import torch

from conformance import upstream
from conformance.sglang import loading, radix_tree
from conformance.sglang.random_steps import STEPS, random_step
from engine_model import FULL, Engine, EngineConfig, free_lists
from engine_model.state import Request

__all__ = [
    "SGLangPages",
    "SGLangRows",
    "allocators",
    "departures",
    "draft_extend_layout",
    "eviction_departures",
    "eviction_walk",
    "match_departures",
    "page_allocator",
    "release_departures",
    "release_ranges",
    "reserve_departures",
    "row_pool",
    "sglang_match",
    "swa_free_departures",
]


def page_allocator(page_size: int, free_pages: list[int]) -> types.SimpleNamespace:
    """SGLang's allocator of pages of ``page_size`` slots (``TokenToKVPoolAllocator`` for
    one, else ``PagedTokenToKVPoolAllocator``), its free list ``free_pages``: ``alloc(slots)``
    and ``free(slots)`` are its own methods."""
    methods = _allocator_methods(page_size == 1)
    state = types.SimpleNamespace(
        page_size=page_size, device="cpu", need_sort=False, debug_mode=False, free_group=None,
        staged_pages=[], num_staged_pages=0,
        free_pages=torch.tensor(free_pages, dtype=torch.int64),
        release_pages=torch.empty((0,), dtype=torch.int64),
    )  # fmt: skip
    for name, method in methods.items():
        setattr(state, name, types.MethodType(method, state))
    return state


@functools.cache
def _allocator_methods(one: bool) -> dict:
    """The methods of SGLang's allocator of pages of one slot (``one``) or of larger pages,
    executed from source once."""
    path = loading.mem_cache() / "allocator" / ("token.py" if one else "paged.py")
    cls = "TokenToKVPoolAllocator" if one else "PagedTokenToKVPoolAllocator"
    names = ("alloc", "free") if one else ("alloc", "free", "_release_page_ids", "merge_and_sort_free", "get_all_free_pages")  # fmt: skip
    return loading.methods_from_source(path, cls, names, {"torch": torch})


@functools.cache
def _row_methods() -> dict:
    """``ReqToTokenPool.alloc_rows`` and ``free_rows``, executed from source once."""
    return loading.methods_from_source(
        loading.mem_cache() / "memory_pool.py", "ReqToTokenPool", ("alloc_rows", "free_rows"), {}
    )


def row_pool(rows: int) -> types.SimpleNamespace:
    """SGLang's ``ReqToTokenPool`` of ``rows`` rows (row 0 the padding row): its own
    ``alloc_rows`` and ``free_rows``."""
    methods = _row_methods()
    state = types.SimpleNamespace(
        free_slots=list(range(1, rows)), req_generation=torch.zeros(rows, dtype=torch.int64),
        _on_alloc_rows=None, _aux_cache=None,
    )  # fmt: skip
    for name, method in methods.items():
        setattr(state, name, types.MethodType(method, state))
    return state


class SGLangPages:
    """An engine's page allocator that is SGLang's (:func:`page_allocator`): its own ``alloc``
    and ``free`` choose the pages and order the free list. ``first_in_line`` (a fault's, or
    pages an allocation leaves out put back) sets its free list."""

    def __init__(self, page_size: int, pages: list[int]):
        self._sglang, self._p = page_allocator(page_size, pages), page_size
        self._order = list(pages)

    def order(self) -> list[int]:
        return self._order

    def _read(self) -> None:
        self._order = self._sglang.free_pages.tolist()

    def alloc(self, n: int) -> list[int] | None:
        if n == 0:
            return []
        out = self._sglang.alloc(n * self._p)
        self._read()
        return None if out is None else [s // self._p for s in out[:: self._p].tolist()]

    def free(self, pages: list[int]) -> None:
        p = self._p
        self._sglang.free(torch.tensor([q * p + i for q in pages for i in range(p)]))
        self._read()

    def first_in_line(self, pages: list[int]) -> None:
        order = list(pages) + [q for q in self._order if q not in pages]
        self._sglang.free_pages = torch.tensor(order, dtype=torch.int64)
        self._order = order


class SGLangRows:
    """An engine's request pool that is SGLang's ``ReqToTokenPool`` (:func:`row_pool`): its own
    ``alloc_rows`` and ``free_rows`` choose the rows."""

    def __init__(self, pool_rows: int, rows: list[int]):
        self._sglang = row_pool(pool_rows)
        self._sglang.free_slots = list(rows)

    def order(self) -> list[int]:
        return self._sglang.free_slots

    def take(self) -> int:
        (row,) = self._sglang.alloc_rows(1)
        return row

    def give(self, row: int) -> None:
        self._sglang.free_rows([row])


def _sglang_free_lists(config: EngineConfig, pages: list[int], rows: list[int]):
    return SGLangPages(config.page_size, pages), SGLangRows(config.pool_rows, rows)


@functools.cache
def allocators() -> tuple[str, str]:
    """The free lists the suite's engines run on, and why: ``"sglang"`` where the installed
    release's allocators and request pool are in the shape :func:`page_allocator` and
    :func:`row_pool` run, and its eviction walk as :func:`eviction_walk` runs it (from 0.5.20),
    else ``"model"``, the engine's own lists and walk, held to SGLang's by :func:`departures`
    and :func:`eviction_departures`."""
    try:
        for page_size in (1, 2):
            _sglang_free_lists(EngineConfig(page_size=page_size), [1, 2], [1])
        _walk_methods()
    except (LookupError, OSError, ImportError, SyntaxError) as error:
        why = f"{type(error).__name__}: {error}"
        return "model", f"the engine model's lists and walk (SGLang's do not run here: {why})"
    tree, why = radix_tree.usable()
    return "sglang", (
        f"SGLang {upstream.installed_version()}'s allocators, request pool and radix cache "
        "eviction walk; "
        + (
            "its radix tree's insert and match hold the engine's (without a window)"
            if tree
            else f"the engine's insert and match, unheld ({why})"
        )
    )


def departures(config: EngineConfig, steps: int, seed: int, engine: Engine | None = None):
    """``steps`` random allocations and frees of pages (several pages a free call, as a
    request's release frees them) and of pool rows, made on the engine model's allocators and
    on SGLang's beside them from the same free lists: where their choices or free lists first
    differ (empty: nowhere)."""
    engine = engine or Engine(dataclasses.replace(config, allocators="model"))
    sglang = page_allocator(config.page_size, list(engine.free_pages))
    rows = row_pool(config.pool_rows)
    rows.free_slots = list(engine.free_rows)
    rng = np.random.default_rng(seed)
    held: list[int] = []
    taken_rows: list[int] = []
    p = config.page_size
    for step in range(steps):
        what = int(rng.integers(0, 4))
        if what == 0 or not held:  # an allocation of pages
            n = int(rng.integers(1, 4))
            mine = engine._alloc_pages(n)
            out = sglang.alloc(n * p)
            theirs = None if out is None else [int(s) // p for s in out[::p]]
            if mine != theirs:
                return [f"step {step}: alloc {n}: the engine {mine}, SGLang {theirs}"]
            held += mine or []
        elif what == 1:  # a free call of some held pages
            k = int(rng.integers(1, len(held) + 1))
            picked = [held.pop(int(rng.integers(0, len(held)))) for _ in range(k)]
            engine._release_pages(picked, cache=False)
            sglang.free(torch.tensor([q * p + i for q in picked for i in range(p)]))
        elif what == 2 and engine.free_rows:  # a pool row taken
            mine_row, theirs_rows = engine._take_row(), rows.alloc_rows(1)
            if [mine_row] != theirs_rows:
                return [f"step {step}: row: the engine {mine_row}, SGLang {theirs_rows}"]
            taken_rows.append(mine_row)
        elif taken_rows:  # a pool row freed
            row = taken_rows.pop(int(rng.integers(0, len(taken_rows))))
            engine._give_row(row)
            rows.free_rows([row])
        if engine.free_pages != sglang.free_pages.tolist() or engine.free_rows != rows.free_slots:
            return [f"step {step}: free lists: the engine {engine.free_pages} "
                    f"{engine.free_rows}, SGLang {sglang.free_pages.tolist()} {rows.free_slots}"]  # fmt: skip
    return []


@functools.cache
def _walk_methods() -> tuple[dict, type, type]:
    """SGLang's full-component walk, its LRU strategy and its node ordering, from source."""
    root = loading.mem_cache()
    scope = {"heapq": heapq, "ABC": abc.ABC, "abstractmethod": abc.abstractmethod}
    walk = loading.methods_from_source(
        root / "unified_cache" / "components" / "full.py", "FullComponent",
        ("_ensure_eviction_strategy", "_evict_device_start", "_evict_device_next_node"), scope,
    )  # fmt: skip
    lru = loading.from_source(root / "evict_policy.py", ("EvictionStrategy", "LRUStrategy"), scope)
    less = loading.methods_from_source(
        root / "unified_cache" / "unified_tree_core.py", "UnifiedTreeNode", ("__lt__",), {}
    )["__lt__"]
    node = type("Node", (types.SimpleNamespace,), {"__lt__": less, "__hash__": object.__hash__})
    return walk, lru["LRUStrategy"], node


def _tree(engine: Engine, node_type: type) -> tuple[types.SimpleNamespace, dict]:
    """The engine's cached paths as a tree of stand-in nodes: one a radix node, with its pages,
    its last access time and its lock (a running request holds a page of it or below, or it is
    on the path of the cached prefix the engine is moving, which the engine locks:
    :attr:`engine_model.state.EngineState.moving`)."""
    root = node_type(id=0, parent=None, children={}, pages=(), last_access_time=0.0, lock_ref=0)
    for entry in engine.cache:
        node = root
        for first, end in engine.nodes(entry):
            pages = entry.pages[first:end]
            child = node.children.get(pages[0])
            if child is None:
                time = float(engine.node_time[pages[0]])
                child = node_type(
                    id=0, parent=node, children={}, pages=pages, last_access_time=time, lock_ref=0
                )
                node.children[pages[0]] = child
            node = child
    nodes, stack = {}, [root]
    while stack:
        node = stack.pop()
        nodes[id(node)] = node
        stack += node.children.values()
    moving = set(engine.moving.pages) if engine.moving is not None else set()
    for node in nodes.values():
        if node is not root and any(engine.req_refs[p] or p in moving for p in node.pages):
            up = node
            while up is not root:
                up.lock_ref += 1
                up = up.parent
    return root, nodes


def eviction_walk(engine: Engine, tokens: int) -> list[tuple[int, ...]]:
    """The nodes SGLang's full-component walk evicts from the engine's prefix cache for
    ``tokens`` slots, in order (each its pages); the engine is left as it was."""
    walk, lru, node_type = _walk_methods()
    root, nodes = _tree(engine, node_type)
    for i, node in enumerate(nodes.values()):
        node.id = i
    by_id = {node.id: node for node in nodes.values()}
    leaves = {n for n in nodes.values() if n is not root and not n.children and not n.lock_ref}
    component = types.SimpleNamespace(
        component_type=FULL, session_ref_eviction_strategy=None,
        tree_core=types.SimpleNamespace(evictable_device_leaves=leaves, eviction_strategy=lru()),
    )  # fmt: skip
    for name, method in walk.items():
        setattr(component, name, types.MethodType(method, component))
    component._evict_device_start(tokens)
    tracker, order = {FULL: 0}, []
    # the cache's actions list, where the release's walk takes one (0.5.23 on)
    actions = {"cache_actions": []} if "cache_actions" in inspect.signature(
        walk["_evict_device_next_node"]).parameters else {}  # fmt: skip
    while (chosen := component._evict_device_next_node(tracker, {}, {}, **actions)) is not None:
        node = by_id[chosen]  # the tree core's _evict_device_leaf, as the walk sees it
        order.append(node.pages)
        tracker[FULL] += len(node.pages) * engine.config.page_size
        del node.parent.children[node.pages[0]]
        leaves.discard(node)
        parent = node.parent
        if parent is not root and not parent.children and not parent.lock_ref:
            leaves.add(parent)
    return order


def eviction_departures(config: EngineConfig, steps: int, seed: int) -> list[str]:
    """A random history of ``steps`` steps of the engine model (admissions sharing cached
    prefixes, prefills, decodes, finishes, retractions and readmissions); before each step, an
    eviction for a random number of slots made by the engine on a copy of itself and by
    SGLang's walk over the same tree: where the nodes they evict first differ (empty:
    nowhere), and how many evictions of two nodes or more were compared."""
    engine = Engine(dataclasses.replace(config, allocators="model"))
    rng = np.random.default_rng(seed)
    multi = 0
    for step in range(steps):
        if engine.cache:
            tokens = int(rng.integers(1, config.num_slots // 2))
            theirs = eviction_walk(engine, tokens)
            mine = copy.deepcopy(engine).evict_for(tokens)
            if mine != theirs:
                return [f"step {step}: evict {tokens}: the engine {mine}, SGLang {theirs}"]
            multi += len(mine) > 1
        random_step(engine, rng)
    return [] if multi else ["no eviction of two nodes or more was compared"]


def sglang_match(engine: Engine, tokens: list[int]) -> int:
    """The positions of ``tokens`` (raw tokens; under EAGLE's offset, SGLang's bigram keys)
    that SGLang's read-only match of the full pool, ``UnifiedTreeCore.match_full_device_prefix``
    (``unified_cache/unified_tree_core.py``, with ``RadixKey``, run from source), finds in the
    engine's prefix cache as SGLang's tree holds it (:func:`radix_tree.sglang_tree`; a path
    whose tokens another path holds in other pages raises ``AssertionError`` there)."""
    code, core = radix_tree.sglang_tree(engine)
    key = code.scope["RadixKey"](array("q", [int(t) for t in tokens]), is_bigram=core.is_eagle)
    matched, _, _ = core.match_full_device_prefix(key)
    return int(matched)


def match_departures(config: EngineConfig, steps: int, seed: int) -> list[str]:
    """A random history of ``steps`` steps of the engine model (admissions sharing cached
    prefixes, prefills, decodes, inserts, finishes, retractions and readmissions); after each
    step, every running request's tokens (up to the last it computes, as a match leaves one)
    matched against the prefix cache by the engine (:meth:`Engine.tree_match`) and by SGLang's
    match over the same tree (:func:`sglang_match`): where they first differ (empty: nowhere),
    and how many matches were compared that found a prefix."""
    engine = Engine(dataclasses.replace(config, allocators="model"))
    rng = np.random.default_rng(seed)
    found = 0
    c = config
    for step in range(steps):
        random_step(engine, rng, STEPS[:3] + ("insert",) + STEPS[3:])
        for req in engine.running.values():
            limit = len(req.tokens) - c.offset - 1
            _, mine = engine.tree_match(req, limit=limit)
            theirs = sglang_match(engine, req.tokens[: limit + c.offset])
            if mine != theirs:
                return [f"step {step}: request {req.rid}: the engine {mine}, SGLang {theirs}"]
            found += mine > 0
    return [] if found else ["no match that found a prefix was compared"]


def draft_extend_layout(seq_lens: list[int], num_draft_tokens: int) -> types.SimpleNamespace:
    """The draft extend SGLang's spec v2 lays out after a target verify of
    ``num_draft_tokens`` a request whose committed lengths were ``seq_lens``:
    ``prepare_for_draft_extend`` (``speculative/eagle_worker_common.py``) run from source on
    the host path (``seq_lens_cpu`` given, no window widening), its ``ForwardBatch.init_new``
    a stand-in that keeps what the batch was given; the forward batch's ``prefix_lens``,
    ``extend_lens``, ``seq_lens`` and ``forward_mode`` name."""
    path = loading.sglang_root() / "srt" / "speculative" / "eagle_worker_common.py"
    forward_mode = loading.runtime().ForwardMode

    def init_new(batch, runner, **_):
        return types.SimpleNamespace(
            seq_lens=batch.seq_lens.clone(), seq_lens_cpu=batch.seq_lens_cpu.clone(),
            prefix_lens=batch.prefix_lens, extend_lens=batch.extend_lens,
            forward_mode=batch.forward_mode, mark_forward_metadata_ready=lambda: None,
        )  # fmt: skip

    scope: dict = {
        "torch": torch, "maybe_detect_oob": lambda *a, **k: None, "is_npu": lambda: False,
        "ForwardMode": forward_mode, "ForwardBatch": types.SimpleNamespace(init_new=init_new),
        "CaptureHiddenMode": types.SimpleNamespace(NULL=0, FULL=1),  # kept, not read
    }  # fmt: skip
    prepare = loading.from_source(path, ("prepare_for_draft_extend",), scope)[
        "prepare_for_draft_extend"
    ]
    bs = len(seq_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int64)
    batch = types.SimpleNamespace(
        seq_lens=lens, seq_lens_cpu=lens.clone(), forward_mode=forward_mode.DECODE,
        model_config=types.SimpleNamespace(vocab_size=1 << 20), multimodal_inputs=[None] * bs,
    )  # fmt: skip
    runner = types.SimpleNamespace(  # its attention backend's metadata: not the canary's
        spec_algorithm=types.SimpleNamespace(is_standalone=lambda: False),
        model_config=types.SimpleNamespace(model_is_mrope=False),
        attn_backend=types.SimpleNamespace(init_forward_metadata=lambda batch: None),
    )
    made = prepare(
        types.SimpleNamespace(num_front_tokens=0, positions=None, hidden_states=None),
        batch, torch.ones(bs * num_draft_tokens, dtype=torch.int64), num_draft_tokens, runner,
        None, return_hidden_states_before_norm=False,
    )  # fmt: skip
    return types.SimpleNamespace(
        prefix_lens=[int(x) for x in made.prefix_lens],
        extend_lens=[int(x) for x in made.extend_lens],
        seq_lens=made.seq_lens.tolist(),
        forward_mode=made.forward_mode.name,
    )


def release_ranges(
    engine: Engine, req: Request, checkpoints: list[int] | None = None
) -> list[tuple[int, int]]:
    """The row positions SGLang's ``release_kv_cache(checkpoint=False)`` (a retraction's,
    ``mem_cache/common.py``, with ``_release_overallocated_kv_indices``, run from source) gives
    back to the allocator for ``req`` of the engine: its owned positions past its protected
    prefix (what the prefix cache holds of its pages) and, page-aligned, the positions it was
    allocated past them: a whole page past its last written one is a speculative server's
    over-allocation (spec v2), else it was allocated what it wrote. The tree cache and the
    request are stand-ins that hold those lengths and record the calls. ``checkpoints``: a
    finish's release instead (``checkpoint=True``), the ``up_to`` of each checkpoint it makes of
    the request into the tree appended there."""
    path = loading.mem_cache() / "common.py"
    p = engine.config.page_size
    eagle = len(req.pages) * p >= req.written + p  # a page past the written ones
    spec = types.SimpleNamespace(speculative_algorithm="EAGLE" if eagle else None)
    scope: dict = {
        "get_spec": lambda: spec,
        "get_serving": lambda: types.SimpleNamespace(strip_thinking_cache=False),
        "ceil_align": lambda x, y: -(-x // y) * y,
        "array": array,
    }
    release = loading.from_source(
        path, ("release_kv_cache", "_release_overallocated_kv_indices"), scope
    )["release_kv_cache"]

    protected = radix_tree.protected_len(engine, req)
    freed: list[tuple[int, int]] = []
    kv = types.SimpleNamespace(
        holds_kv=True, is_kv_released=False, cache_protected_len=protected,
        kv_committed_len=req.written,
        kv_allocated_len=len(req.pages) * p if eagle else req.written,
        req_pool_idx=req.row, mark_kv_released=lambda: None,
    )  # fmt: skip
    request = types.SimpleNamespace(
        kv=kv, rid=req.rid, lock=object(), skip_radix_cache_insert=False, finished_len=None,
        origin_input_ids=list(req.tokens), owned_kv_len=lambda: req.written,
    )  # fmt: skip
    tree = types.SimpleNamespace(
        supports_mamba=lambda: False, claim_kv_row=lambda r: False, unlock=lambda lock: None,
        free_kv_row=lambda row, ranges: freed.extend(ranges),
        token_to_kv_pool_allocator=types.SimpleNamespace(page_size=p),
        on_release=lambda r, checkpointed: None,
        req_to_token_pool=types.SimpleNamespace(free=lambda r: None),
        checkpoint=lambda r, up_to, **_: None if checkpoints is None else checkpoints.append(up_to),
    )  # fmt: skip
    request.refresh_fill_ids, request.finished = (lambda: None), (lambda: True)
    release(request, tree, checkpoint=checkpoints is not None)
    return [(a, b) for a, b in freed if a < b]


def release_departures(config: EngineConfig, steps: int, seed: int) -> list[str]:
    """A random history of ``steps`` steps of the engine model (admissions sharing cached
    prefixes, prefills, decodes, target verifies, inserts, finishes and readmissions), a third
    of them retractions and one after every target verify: the pages each retraction frees in
    the engine against the pages of
    the positions SGLang's release gives back (:func:`release_ranges`): where they first
    differ (empty: nowhere), or that no retraction freed a page the cache did not hold."""
    engine = Engine(dataclasses.replace(config, allocators="model"))
    rng = np.random.default_rng(seed)
    p, compared = config.page_size, 0
    for step in range(steps):
        if int(rng.integers(0, 3)):  # a retraction follows a target verify at once, too
            op = random_step(engine, rng, (*STEPS[:3], "verify", "insert", "finish", "readmit"))
            if op != "verify":
                continue
        able = engine.retractable()
        if not able:
            continue
        pick = int(rng.integers(0, 10))
        req = able[pick % len(able)]
        theirs = {
            req.pages[pos // p] for a, b in release_ranges(engine, req) for pos in range(a, b)
        }
        before = set(engine.free_pages)
        engine.retract(pick)
        mine = set(engine.free_pages) - before
        if mine != theirs:
            return [f"step {step}: retract {req.rid}: the engine frees {sorted(mine)}, "
                    f"SGLang {sorted(theirs)}"]  # fmt: skip
        compared += bool(mine)
    return [] if compared else ["no retraction that freed a page was compared"]


def _sizing(page_size: int, drafts: int) -> dict:
    """SGLang's spec v2 sizing functions, from source, for an EAGLE chain of ``drafts`` draft
    tokens (``drafts - 1`` steps, ``topk`` 1) on pages of ``page_size`` slots."""
    spec = types.SimpleNamespace(
        speculative_algorithm="EAGLE", speculative_num_steps=drafts - 1,
        speculative_eagle_topk=1, speculative_num_draft_tokens=drafts,
    )  # fmt: skip
    eagle = types.SimpleNamespace(is_uno=lambda: False, has_draft_kv=lambda: True)
    scope = {
        "get_spec": lambda: spec,
        "max_speculative_num_draft_tokens": lambda: drafts,
        "get_alloc_page_size": lambda: page_size,
        "SpeculativeAlgorithm": types.SimpleNamespace(from_string=lambda name: eagle),
    }
    names = ("get_alloc_len_per_decode", "get_alloc_reserve_per_decode", "page_aligned_decode_alloc_lens")  # fmt: skip
    return loading.from_source(
        loading.mem_cache() / "allocation_sizing.py", names, scope, scope_imports=True
    )


def reserve_departures(page_sizes=(1, 2, 4, 16, 64), drafts=(2, 3, 4, 5)) -> list[str]:
    """Where the positions a target verify's row holds pages for differ from SGLang's spec v2
    sizing, over committed and allocated lengths of every page size and draft count given
    (empty: nowhere)."""
    out = []
    for p in page_sizes:
        engine = Engine(EngineConfig(page_size=p, num_pages=8, pool_rows=3, context_len=16))
        for n in drafts:
            sizing = _sizing(p, n)
            reserve = sizing["get_alloc_reserve_per_decode"]()
            for committed in range(0, 3 * p + 2 * n):
                for pages in range(0, -(-(committed + 3 * n) // p) + 1):
                    if pages * p < committed:
                        continue
                    kv = types.SimpleNamespace(
                        kv_allocated_len=pages * p, kv_committed_len=committed
                    )
                    _, (theirs,), _ = sizing["page_aligned_decode_alloc_lens"](
                        [types.SimpleNamespace(kv=kv)], reserve=reserve, page_size=p
                    )
                    req = Request(0, 0, [], [], written=committed, pages=[1] * pages)
                    mine = engine.verify_alloc_to(req, 2 * n)
                    if mine != theirs:
                        out.append(f"pages of {p}, {n} drafts, {committed} committed, "
                                   f"{pages} pages held: the engine {mine}, SGLang {theirs}")  # fmt: skip
    return out


def _swa_free() -> tuple:
    """SGLang's ``free_swa_out_of_window_slots`` (``mem_cache/common.py``) and the methods of
    ``ReqKvInfo`` (``managers/schedule_batch.py``) it calls, from source."""
    align = {"ceil_align": lambda n, k: -(-n // k) * k}
    component = types.SimpleNamespace(SWA=object())  # ComponentType.SWA: a key
    scope = {**align, "ComponentType": component, "Callable": None}
    loading.from_source(loading.mem_cache() / "common.py", ("free_swa_out_of_window_slots",), scope)
    batch = loading.sglang_root() / "srt" / "managers" / "schedule_batch.py"
    kv_methods = loading.methods_from_source(
        batch, "ReqKvInfo", ("swa_dead_lo", "get_evicted_seqlen", "set_evicted_seqlen"), align
    )
    return scope["free_swa_out_of_window_slots"], type("ReqKvInfo", (), kv_methods)


def swa_free_departures(page_sizes=(1, 2, 4, 16), windows=(3, 5, 8, 20), length: int = 48):
    """The engine model's SWA frees (every page wholly behind a request's window, after each
    forward: :meth:`engine_model.state.EngineState.swa_freed_to`) beside SGLang's
    ``free_swa_out_of_window_slots`` run from source, as its radix cache slides a decoding
    request's window (``evict_sliding_windows``: the window, prefix sharing, no retain floor,
    an interval of one), the request's cached prefix protected. Per page size, window,
    protected prefix and written length: the positions SGLang has freed that the model keeps
    (departures), and the count of those the model has freed that SGLang keeps (its margin).
    Returns ``(cases, departures, freed_by_sglang, kept_by_sglang)``, the last two summed
    over the cases."""
    free, kv_class = _swa_free()
    cases, out, theirs, kept = 0, [], 0, 0
    for p in page_sizes:
        for w in windows:
            engine = Engine(EngineConfig(page_size=p, num_pages=64, pool_rows=2,
                                         context_len=length, swa_window=w, swa_slots=64 * p))  # fmt: skip
            for protected in range(0, length // 2 + 1, p):
                kv = kv_class()
                kv.cache_protected_len, kv.swa_evict_floor, kv.req_pool_idx = protected, 0, 0
                kv.component_evicted_seqlens, kv.holds_kv = {}, True
                freed: set[int] = set()

                def segment(slots, start_pos, freed=freed):
                    freed.update(int(s) - 1000 for s in slots)

                table = types.SimpleNamespace(req_to_token=torch.arange(1000, 1000 + length)[None])
                for written in range(1, length + 1):
                    free(types.SimpleNamespace(kv=kv), written, sliding_window_size=w,
                         page_size=p, req_to_token_pool=table, token_to_kv_pool_allocator=None,
                         supports_prefix_sharing=True, retain_floor=None, free_segment=segment)  # fmt: skip
                    mine = set(range(engine.swa_freed_to(written)))
                    cases += 1
                    if freed - mine:
                        out.append(f"pages of {p}, window {w}, {protected} protected, "
                                   f"{written} written: SGLang freed {sorted(freed - mine)}")  # fmt: skip
                    theirs, kept = theirs + len(freed), kept + len(mine - freed)
    return cases, out, theirs, kept


free_lists.register(
    "sglang",
    _sglang_free_lists,
    eviction=eviction_walk,
    tree=radix_tree.TREE if radix_tree.usable()[0] else None,
)
