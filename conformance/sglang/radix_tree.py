"""SGLang's radix tree, its insert and its match, run from source, and the engine model's held
to them.

A running or finishing request's insert (:meth:`engine_model.Engine.checkpoint`: after every
prefill chunk, at an insert event, at a finish) is SGLang's ``checkpoint_into_tree``
(``mem_cache/unified_radix_cache.py``, 0.5.22 on: :func:`available`; the model follows
0.5.23's tree, :func:`usable`) with the cache's
``insert`` pump and its action application (``_apply_cache_actions``,
``_apply_cache_action``), the unified tree core's resumable insert walk
(``unified_cache/unified_tree_core.py``: ``begin_insert``, ``_advance_insert``, the walk,
overlap, commit and tail steps, ``_split_node``, ``_add_new_node``, ``_touch_node``,
``collect_full_device_indices``, with ``UnifiedTreeNode`` and the walk's state), the full
component and the component defaults (``components/full.py``, ``components/base.py``, with
``get_and_increase_time_counter``), ``InsertParams``, ``InsertResult``, ``RadixKey`` and the
cache actions; a match (:meth:`engine_model.Engine.touch_match`: an admission sharing a cached
prefix, a readmission) is the tree core's ``match_prefix`` (``_match_prefix_helper``, which
splits the node the match ends inside, and ``_match_post_processor``, which stamps the matched
path from its deepest node up), with the full component's validator and ``MatchPrefixParams``.
All of it runs from the installed release's source, over a tree built from the engine's cached
paths (:func:`sglang_tree`): a node a radix node of the engine
(:meth:`engine_model.Engine.nodes`), its key its tokens, its value its slots, its last access
time the engine's; the counter of fresh times starts past the engine's clock.

It gives back what SGLang's insert does to the request and the tree: the slots it frees as the
request's duplicates of cached ones, the request's row after it rewrites the cached part, and
the tree after (each node's slots and its place in the order of access times), the prompt
boundary's split included (a second insert of the prompt's key, where the request's key goes
past it); and the tree after a match. :func:`tree_departures` holds the engine to both over
random histories. Which cached leaves an eviction may take once the running requests hold
their locks is the tree core's ``inc_lock_ref`` with the full component's
``acquire_component_lock`` and ``_is_device_leaf``, each request locking the node its cached
prefix ends in (:func:`sglang_evictable`); :func:`lock_departures` holds the engine's
:meth:`engine_model.Engine.evictable_leaves` to it.

Stand-ins (each holding only what these methods read, none doing more than SGLang's): the tree
core and the cache (their fields; no hierarchical cache, no storage, no session, no sharding,
no event recorder: SGLang's records events for subscribers and changes nothing), the request
(its lengths, tokens and row; its cached prefix, ``cache_protected_len``, the pages it shares
with a cached path, as the model keeps them), the request pool (SGLang's
``ReqToTokenPool.write``, from source, over the engine's table), the allocator (it records what
``free_segment`` is given), the lock (a handle) and the environment (each flag's default, read
from the release's ``environ.py``). A cache with a window (SWA) is not run: the SWA component
(what an insert does with a cached node whose window lost its SWA slots, a tombstone) is not
run, and the model keeps a request's copy beside such a node (a named choice:
:func:`prefixes_cached_twice`, CONTRACT §15).
"""

from __future__ import annotations

import abc
import ast
import collections
import dataclasses
import enum
import functools
import itertools
import re
import types
from array import array
from pathlib import Path
from typing import Any, NamedTuple, Optional

import numpy as np
import torch

from conformance.sglang import loading
from conformance.sglang.random_steps import STEPS, random_step
from engine_model import Engine, EngineConfig
from engine_model.state import Request

__all__ = [
    "KINDS",
    "TREE",
    "SGLangTree",
    "TreeDeparture",
    "held_insert",
    "held_match",
    "engine_evictable",
    "lock_departures",
    "sglang_evictable",
    "usable",
    "available",
    "prefixes_cached_twice",
    "sglang_checkpoint",
    "engine_tree_order",
    "protected_len",
    "tree_after_match",
    "sglang_tree",
    "tombstoned",
    "tree_departures",
]

#: the tree core's methods an insert and a match run (0.5.23's names), and the cache's
CORE_METHODS = (
    "begin_insert", "_advance_insert", "_insert_walk_step", "_insert_commit_step",
    "_insert_tail_step", "_split_node", "_add_new_node", "_touch_node",
    "collect_full_device_indices", "match_prefix", "_match_prefix_helper",
    "_match_post_processor", "inc_lock_ref", "_is_device_leaf",
)  # fmt: skip
CACHE_METHODS = ("checkpoint_into_tree", "insert", "_apply_cache_actions", "path_device_indices")


def available() -> bool:
    """Whether the installed release has the insert in this shape (``checkpoint_into_tree``
    over the resumable tree core: 0.5.22 on; the older releases keep the model's insert); False
    where SGLang is not installed."""
    try:
        path = loading.mem_cache() / "unified_radix_cache.py"
    except ImportError:
        return False
    return path.is_file() and "def checkpoint_into_tree(" in path.read_text()


def _env_defaults() -> types.SimpleNamespace:
    """Each boolean flag of the release's ``environ.py`` at its default, as ``envs`` gives it
    on a server that sets none (``envs.NAME.get()``)."""
    text = (loading.sglang_root() / "srt" / "environ.py").read_text()
    flags = re.findall(r"^\s+(SGLANG_\w+) = EnvBool\((True|False)\)", text, re.M)
    return types.SimpleNamespace(
        **{name: types.SimpleNamespace(get=lambda v=v: v == "True") for name, v in flags}
    )


@functools.cache
def _code() -> types.SimpleNamespace:
    """The release's insert code, executed from source into one scope."""
    import msgspec

    root, unified = loading.mem_cache(), loading.mem_cache() / "unified_cache"
    scope: dict = {
        "torch": torch, "msgspec": msgspec, "Enum": enum.Enum, "IntFlag": enum.IntFlag,
        "auto": enum.auto, "dataclasses": dataclasses, "array": array, "ABC": abc.ABC,
        "abstractmethod": abc.abstractmethod, "defaultdict": collections.defaultdict,
        "Optional": Optional, "Any": Any, "NamedTuple": NamedTuple, "float64": np.float64, "replace": dataclasses.replace,
        "envs": _env_defaults(),
    }  # fmt: skip
    loading.from_source(unified / "component_type.py", ("ComponentType",), scope)
    kinds = scope["ComponentType"]
    scope.update(BASE_COMPONENT_TYPE=kinds.FULL, _NUM_COMPONENT_TYPES=len(kinds))
    base = ("ComponentData", "EvictLayer", "LRURefreshPhase", "TreeComponent")
    loading.from_source(unified / "components" / "base.py", (*base, "get_and_increase_time_counter"), scope)  # fmt: skip
    loading.from_source(unified / "components" / "full.py", ("FullComponent",), scope)
    actions = unified / "cache_action.py"  # every action the release defines (they differ)
    kinds_of_action = [n.name for n in ast.parse(actions.read_text()).body if isinstance(n, ast.ClassDef)]  # fmt: skip
    loading.from_source(actions, tuple(kinds_of_action), scope)
    prefix_cache = (
        "InsertParams",
        "InsertResult",
        "MatchPrefixParams",
        "MatchResult",
        "IncLockRefResult",
    )
    loading.from_source(root / "base_prefix_cache.py", prefix_cache, scope)
    loading.from_source(unified / "unified_tree_core_interface.py", ("InsertStepResult",), scope)
    loading.from_source(root / "radix_cache.py", ("RadixKey",), scope)
    loading.from_source(root / "utils.py", ("split_node_hash_value",), scope)
    core_file = unified / "unified_tree_core.py"
    loading.from_source(core_file, ("UnifiedTreeNode", "_InsertPhase", "_InsertWalkState"), scope)
    core = _class_methods(core_file, "UnifiedTreeCore", scope)
    cache = _class_methods(root / "unified_radix_cache.py", "UnifiedRadixCache", scope)
    missing = sorted(set(CORE_METHODS) - set(core)) + sorted(set(CACHE_METHODS) - set(cache))
    if missing:
        raise LookupError(f"the release's radix tree has no {missing}")
    pool_write = loading.methods_from_source(
        root / "memory_pool.py", "ReqToTokenPool", ("write",), scope
    )["write"]
    return types.SimpleNamespace(
        scope=scope, core=type("UnifiedTreeCore", (), core), cache=type("UnifiedRadixCache", (), cache),
        pool=type("ReqToTokenPool", (), {"write": pool_write}),
    )  # fmt: skip


def _class_methods(path: Path, cls: str, scope: dict) -> dict:
    """Every method of class ``cls`` in SGLang's file ``path``, executed from source in a copy
    of ``scope`` (a method's name never shadows a name of the scope), its static methods wrapped
    again (``loading.methods_from_source`` drops decorators) and its properties left out (the
    stand-ins set the fields they read)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls)
    functions = [f for f in node.body if isinstance(f, ast.FunctionDef)]
    methods = loading.methods_from_source(path, cls, tuple(f.name for f in functions), dict(scope))
    for f in functions:
        decorators = [ast.unparse(d) for d in f.decorator_list]
        if "staticmethod" in decorators:
            methods[f.name] = staticmethod(methods[f.name])
        elif any(d == "property" or d.endswith((".setter", ".deleter")) for d in decorators):
            methods.pop(f.name, None)
    return methods


@dataclasses.dataclass
class Checkpoint:
    """What SGLang's insert of a request does: the slots it frees as duplicates, the request's
    row after it (its first ``length`` positions, those the tree now holds), and the tree
    after it (:func:`tree_order`)."""

    freed: list[int]
    row: list[int]
    length: int
    tree: list[tuple[tuple[int, ...], tuple[int, ...]]]


def _engine_tree(engine: Engine, code: types.SimpleNamespace, core) -> dict:
    """SGLang's tree of the engine's cached paths under ``core``'s root: the nodes by their
    slots. A path whose tokens another path holds in other pages (two nodes under one child
    key) raises ``AssertionError``: SGLang's tree has one node there."""
    c = engine.config
    node_type, key_type, full = code.scope["UnifiedTreeNode"], code.scope["RadixKey"], code.scope["BASE_COMPONENT_TYPE"]  # fmt: skip
    made: dict = {}
    for entry in engine.cache:
        node, slots = core.root_node, engine.cached_full_slots(entry)
        for first, end in engine.nodes(entry):
            a, b = first * c.page_size, min(end * c.page_size, entry.length)
            value = tuple(int(s) for s in slots[a:b])
            child = made.get(value)
            if child is None:
                child = node_type(core.component_types)
                child.parent, child.last_access_time = node, float(engine.node_time[entry.pages[first]])  # fmt: skip
                child.key = key_type(array("q", [int(t) for t in entry.tokens[a : b + c.offset]]), is_bigram=c.offset == 1)  # fmt: skip
                child.component_data[full].value = torch.tensor(value, dtype=torch.int64)
                under = child.key.child_key(c.page_size)
                assert under not in node.children, f"two cached paths under one key: {under}"
                node.children[under] = child
                core._register_node(child)
                made[value] = child
            node = child
    return made


def tree_order(root, full) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """A tree's nodes, each ``(its slots, its parent's slots)``, oldest access first (ties in
    slot order)."""
    nodes, stack = [], list(root.children.values())
    while stack:
        node = stack.pop()
        parent = () if node.parent is root else tuple(node.parent.component_data[full].value.tolist())  # fmt: skip
        nodes.append((float(node.last_access_time), tuple(node.component_data[full].value.tolist()), parent))  # fmt: skip
        stack += node.children.values()
    return [(slots, parent) for _, slots, parent in sorted(nodes)]


def protected_len(engine: Engine, req: Request) -> int:
    """The positions of ``req`` whose pages are a cached path's (SGLang's
    ``cache_protected_len``, as the model keeps it: what a match or an earlier insert gave the
    request)."""
    shared = (
        sum(1 for _ in itertools.takewhile(lambda ab: ab[0] == ab[1], zip(e.pages, req.pages)))
        for e in engine.cache
    )
    return min(max(shared, default=0) * engine.config.page_size, req.written)


def sglang_tree(engine: Engine) -> tuple[types.SimpleNamespace, Any]:
    """The release's code and a tree core holding the engine's prefix cache as SGLang's tree
    holds it (its time counter past the engine's clock); the engine is left as it was. A cache
    with a window raises ``ValueError``: SGLang's SWA component is not run."""
    code, c = _code(), engine.config
    if c.swa_window:
        raise ValueError("a cache with a window: SGLang's SWA component of the tree is not run")
    full = code.scope["BASE_COMPONENT_TYPE"]
    code.scope["_LAST_ACCESS_TIME_COUNTER_FLOAT"] = np.float64(engine.clock + 1.0)
    core = object.__new__(code.core)  # the fields below, not its __init__'s
    core.__dict__.update(
        page_size=c.page_size, is_eagle=c.offset == 1, component_types=(full,),
        _ongoing_insert_walk_state=None, tlru_bookkeeping=False, enable_storage=False,
        enable_external_cache_linker=False, enable_hicache=False, is_write_back=False,
        is_host_memory_buffer_only=False, evictable_device_leaves=set(),
        evictable_host_leaves=set(), full_host_duplicates={}, _node_arena={}, lru_lists={},
        component_evictable_size_=collections.Counter(), component_protected_size_=collections.Counter(),
        kv_events=types.SimpleNamespace(record_store=lambda *a, **k: None),
        _empty_device_indices=torch.empty(0, dtype=torch.int64),
    )  # fmt: skip
    component = object.__new__(code.scope["FullComponent"])
    component.tree_core = core
    core.components, core.components_by_type = [component], {full: component}
    core.root_node = code.scope["UnifiedTreeNode"]((full,))
    core.root_node.component_data[full].value = torch.empty(0, dtype=torch.int64)
    core._register_node(core.root_node)
    _engine_tree(engine, code, core)
    return code, core


def tree_after_match(engine: Engine, tokens: list[int]) -> list:
    """The tree after SGLang's ``match_prefix`` (the unified tree core's, with its split of
    the node the match ends inside and its post-processor's stamps) of ``tokens`` over the
    engine's prefix cache (:func:`tree_order`); the engine is left as it was."""
    code, core = sglang_tree(engine)
    key = code.scope["RadixKey"](array("q", [int(t) for t in tokens]), is_bigram=core.is_eagle)
    core.match_prefix(code.scope["MatchPrefixParams"](key=key))
    return tree_order(core.root_node, code.scope["BASE_COMPONENT_TYPE"])


def sglang_checkpoint(engine: Engine, req: Request, *, finished: bool) -> Checkpoint:
    """SGLang's ``checkpoint_into_tree`` of ``req`` (``finished``: a finishing request's, else
    a running one's after its extend) over the engine's prefix cache as SGLang's tree holds it
    (:func:`sglang_tree`); the engine is left as it was."""
    c = engine.config
    code, core = sglang_tree(engine)
    full = code.scope["BASE_COMPONENT_TYPE"]
    component = core.components[0]
    freed: list[int] = []
    pool = code.pool()
    pool.req_to_token = torch.from_numpy(engine.req_to_token.astype(np.int64))
    cache = object.__new__(code.cache)  # the fields below, not its __init__'s
    cache.__dict__.update(
        disable=False, tree_core=core, req_to_token_pool=pool, _components_tuple=(component,),
        components={full: component}, page_size=c.page_size, buffer_pipeline=None, linker=None,
        enable_session_radix_cache=False, lock=lambda node, **_: ("lock", node),
        unlock=lambda lock: None,
        token_to_kv_pool_allocator=types.SimpleNamespace(
            free_segment=lambda indices, start_pos: freed.extend(indices.tolist())),
    )  # fmt: skip
    prompt = req.tokens[: req.prompt]
    protected = protected_len(engine, req)
    request = types.SimpleNamespace(
        finished=lambda: finished, full_untruncated_fill_ids=array("q", req.tokens),
        origin_input_ids=array("q", prompt), priority=None, session_id=None, kv_rotation_base=None,
        extra_key=None, cache_salt=None, lock=None, last_node=None,
        kv=types.SimpleNamespace(req_pool_idx=req.row, cache_protected_len=protected, cache_inserted_len=protected),
    )  # fmt: skip
    cache.checkpoint_into_tree(request, up_to=req.written + c.offset)
    length = request.kv.cache_protected_len
    return Checkpoint(
        freed=sorted(freed), row=pool.req_to_token[req.row, :length].tolist(), length=length,
        tree=tree_order(core.root_node, full),
    )  # fmt: skip


def engine_tree_order(engine: Engine) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The engine's side of :func:`tree_order`: its radix nodes, each ``(its slots, its
    parent's slots)``, oldest access first (ties in slot order)."""
    tree = set()
    for entry in engine.cache:
        slots = engine.cached_full_slots(entry)
        parent: tuple[int, ...] = ()
        for first, end in engine.nodes(entry):
            a, b = first * engine.config.page_size, min(end * engine.config.page_size, entry.length)
            value = tuple(int(s) for s in slots[a:b])
            tree.add((float(engine.node_time[entry.pages[first]]), value, parent))
            parent = value
    return [(value, parent) for _, value, parent in sorted(tree)]


class TreeDeparture(AssertionError):
    """The engine's insert or match left another tree (or freed other slots, or left another
    row) than SGLang's over the same tree."""


def held_insert(engine: Engine, req: Request, step, seen: collections.Counter) -> int:
    """The engine's insert of ``req`` (``step(req)``: :meth:`engine_model.Engine._checkpoint`)
    beside SGLang's (:func:`sglang_checkpoint`), a finish's where the engine has taken the
    request out; :class:`TreeDeparture` where they differ. Counts what it compared in
    ``seen``."""
    finished = req.rid not in engine.running  # a finish takes the request out first
    before = {slots for slots, _ in engine_tree_order(engine)}
    theirs = sglang_checkpoint(engine, req, finished=finished)
    free_before = set(engine.free_pages)
    k = step(req)
    freed = set(engine.free_pages) - free_before
    mine = Checkpoint(
        freed=sorted(int(s) for page in freed for s in engine.page_slots(page)),
        row=[int(s) for s in engine.req_to_token[req.row, : theirs.length]],
        length=theirs.length, tree=engine_tree_order(engine),
    )  # fmt: skip
    if mine != theirs:
        raise TreeDeparture(f"insert of request {req.rid} (finished: {finished}): the engine {mine}, SGLang {theirs}")  # fmt: skip
    p = engine.config.page_size
    seen["inserts"] += 1
    seen["inserts that freed a duplicate"] += bool(theirs.freed)
    seen["inserts that split a node"] += bool(before - {slots for slots, _ in theirs.tree})
    seen["inserts that split at the prompt's end"] += 0 < (req.prompt - engine.config.offset) // p * p < k  # fmt: skip
    seen["inserts of a finishing request"] += finished
    return k


def held_match(engine: Engine, entry, pages: int, step, seen: collections.Counter) -> None:
    """The engine's match of ``pages`` pages of the cached path ``entry`` (``step(entry,
    pages)``: :meth:`engine_model.Engine._touch_match`) beside SGLang's ``match_prefix`` of
    those tokens (:func:`tree_after_match`); :class:`TreeDeparture` where the trees differ. Counts
    what it compared in ``seen``."""
    before = {slots for slots, _ in engine_tree_order(engine)}
    c = engine.config
    theirs = tree_after_match(engine, list(entry.tokens[: pages * c.page_size + c.offset]))
    step(entry, pages)
    mine = engine_tree_order(engine)
    if mine != theirs:
        raise TreeDeparture(f"match of {pages} pages of {entry.pages}: the engine {mine}, SGLang {theirs}")  # fmt: skip
    seen["matches"] += 1
    seen["matches that split a node"] += bool(before - {slots for slots, _ in theirs})


class SGLangTree:
    """SGLang's radix tree code as the engine model's registry holds it
    (:data:`engine_model.free_lists.TREES`): every insert and match of an engine without a
    window, until a fault is made in it, beside SGLang's. ``seen`` counts what it compared."""

    def __init__(self) -> None:
        self.seen: collections.Counter = collections.Counter()

    def applies(self, engine: Engine) -> bool:
        return not engine.config.swa_window and not engine.hooks.fault_made

    def insert(self, engine: Engine, req: Request, step) -> int:
        return held_insert(engine, req, step, self.seen)

    def match(self, engine: Engine, entry, pages: int, step) -> None:
        held_match(engine, entry, pages, step, self.seen)


def tried(offset: int) -> collections.Counter:
    """A short fixed history on pages of 2 (``offset``: EAGLE's bigram keys or not) whose
    inserts and matches are held to SGLang's: a prompt prefilled and inserted, decoded, a
    request sharing its prefix (a match that splits a node), a twin computing it again (an
    insert that frees duplicates), finishes (inserts that split at the prompt's end). What it
    compared; :class:`TreeDeparture` where the engine departs."""
    seen: collections.Counter = collections.Counter()
    config = EngineConfig(page_size=2, num_pages=24, pool_rows=6, context_len=16, offset=offset)
    engine = _held_engine(config, seen)
    engine.admit(7)
    engine.prefill(8)
    engine.decode()
    engine.decode()
    engine.admit(3, share=1)
    engine.admit_twin(0, 1, pages=2)
    engine.prefill(8)
    engine.decode()
    for _ in range(3):
        engine.finish(0)
    return seen


@functools.cache
def usable() -> tuple[bool, str]:
    """Whether SGLang's insert and match hold the engine model's here, and why not: the
    installed release has them in this shape (:func:`available`), msgspec is installed, and
    the model follows the release's tree (:func:`tried` departs nowhere: on 0.5.23; on 0.5.22
    it departs, and the reason is the first departure)."""
    if not available():
        return False, "no installed release has the insert in this shape (0.5.22 on)"
    try:
        for offset in (0, 1):
            tried(offset)
    except TreeDeparture as departure:
        return False, f"the engine model does not follow this release's tree ({str(departure)[:160]} ...)"  # fmt: skip
    except (LookupError, OSError, ImportError, SyntaxError, AttributeError, TypeError) as error:
        return False, f"{type(error).__name__}: {error}"
    return True, ""


#: the tree code the suite registers for the engines on SGLang's allocators
TREE = SGLangTree()


def _held_engine(config: EngineConfig, seen: collections.Counter) -> Engine:
    """An engine of ``config`` on the model's own lists whose every insert and match is held to
    SGLang's (:func:`held_insert`, :func:`held_match`), counted in ``seen``."""
    if config.swa_window:
        raise ValueError("a cache with a window: SGLang's SWA component of the tree is not run")
    engine = Engine(dataclasses.replace(config, allocators="model"))
    insert, match = engine._checkpoint, engine._touch_match
    engine._checkpoint = lambda req: held_insert(engine, req, insert, seen)  # type: ignore[method-assign]
    engine._touch_match = lambda entry, n: held_match(engine, entry, n, match, seen)  # type: ignore[method-assign]
    return engine


def tree_departures(
    config: EngineConfig, steps: int, seed: int, seen: collections.Counter | None = None
) -> list[str]:
    """A random history of ``steps`` steps of the engine model (admissions sharing cached
    prefixes or computing them again, prefills, decodes, target verifies, insert events,
    finishes, retractions and readmissions); every insert the engine makes
    (:meth:`engine_model.Engine.checkpoint`) compared with SGLang's over the same tree and
    request (:func:`held_insert`): the slots it frees, the request's row, the tree's nodes and
    their access order; and every match (:meth:`engine_model.Engine.touch_match`: an
    admission sharing a cached prefix, a readmission) with SGLang's ``match_prefix`` of the
    matched tokens (:func:`held_match`): the tree's nodes and their access order. Where they
    first differ (empty: nowhere); ``seen`` counts what was compared of each kind
    (:data:`KINDS`)."""
    engine = _held_engine(config, collections.Counter() if seen is None else seen)
    rng = np.random.default_rng(seed)
    ops = (*STEPS[:3], "verify", "insert", "twin", *STEPS[3:])
    for step in range(steps):
        try:
            random_step(engine, rng, ops)
        except TreeDeparture as departure:
            return [f"step {step}: {departure}"]
    return []


def sglang_evictable(engine: Engine) -> set[tuple[int, ...]]:
    """The nodes (each its slots) SGLang's tree holds as evictable device leaves
    (``_is_device_leaf``) once every running request holds the lock its last match or insert
    took: ``inc_lock_ref`` of the node its cached prefix ends in (``cache_protected_len``), and
    of the node the prefix the engine is moving ends in (a load back's lock), run from source
    with the full component's ``acquire_component_lock``, over the engine's tree."""
    code, core = sglang_tree(engine)
    full = code.scope["BASE_COMPONENT_TYPE"]
    nodes = [n for n in core._node_arena.values() if n is not core.root_node]
    ends = {int(n.component_data[full].value[-1]): n for n in nodes}
    anchors = [engine.full_slot(r, k - 1) for r in engine.running.values() if (k := protected_len(engine, r))]  # fmt: skip
    if engine.moving is not None:
        anchors.append(int(engine.cached_full_slots(engine.moving)[engine.moving.length - 1]))
    for slot in anchors:
        core.inc_lock_ref(ends[int(slot)].id)
    return {tuple(n.component_data[full].value.tolist()) for n in nodes if core._is_device_leaf(n)}


def engine_evictable(engine: Engine) -> set[tuple[int, ...]]:
    """The engine's evictable leaves (:meth:`engine_model.Engine.evictable_leaves`), each its
    slots."""
    p = engine.config.page_size
    return {
        tuple(int(s) for s in engine.cached_full_slots(entry)[first * p : entry.length])
        for _, _, entry, first in engine.evictable_leaves()
    }


def lock_departures(
    config: EngineConfig, steps: int, seed: int, seen: collections.Counter | None = None
) -> list[str]:
    """A random history of ``steps`` steps of the engine model (as :func:`tree_departures`
    draws them); after each, the engine's evictable leaves against SGLang's once the running
    requests hold their locks (:func:`sglang_evictable`). Where they first differ (empty:
    nowhere); ``seen`` counts the states compared with a leaf a lock kept from eviction."""
    if config.swa_window:
        raise ValueError("a cache with a window: SGLang's SWA component of the tree is not run")
    engine = Engine(dataclasses.replace(config, allocators="model"))
    rng = np.random.default_rng(seed)
    seen = collections.Counter() if seen is None else seen
    for step in range(steps):
        random_step(engine, rng, (*STEPS[:3], "verify", "insert", "twin", *STEPS[3:]))
        mine, theirs = engine_evictable(engine), sglang_evictable(engine)
        if mine != theirs:
            return [f"step {step}: the engine's evictable leaves {sorted(mine)}, SGLang's {sorted(theirs)}"]  # fmt: skip
        leaves = {s for s, _ in engine_tree_order(engine)} - {parent for _, parent in engine_tree_order(engine)}  # fmt: skip
        seen["states"] += 1
        seen["states with a leaf a lock kept"] += bool(leaves - mine)
    return []


#: the kinds of insert and match :func:`tree_departures` counts
KINDS = (
    "inserts", "inserts that freed a duplicate", "inserts that split a node",
    "inserts that split at the prompt's end", "inserts of a finishing request", "matches",
    "matches that split a node",
)  # fmt: skip


def prefixes_cached_twice(engine: Engine) -> list[tuple[tuple, list[tuple]]]:
    """Each page-aligned run of tokens the engine's prefix cache holds in more than one path of
    pages, with those paths: none in SGLang's tree, which holds a key in one node (under a
    window the model keeps a request's copy beside a cached path whose window lost its SWA
    slots, a tombstone, a named choice: CONTRACT §15)."""
    c = engine.config
    paths: dict[tuple, set[tuple]] = collections.defaultdict(set)
    for entry in engine.cache:
        for n in range(1, len(entry.pages) + 1):
            paths[tuple(entry.tokens[: n * c.page_size + c.offset])].add(entry.pages[:n])
    return [(tokens, sorted(held)) for tokens, held in paths.items() if len(held) > 1]


def tombstoned(engine: Engine, pages: tuple) -> bool:
    """Whether a cached path of ``pages`` has lost the SWA slot of a position in the window of
    a request that shares all of it (the model's match then refuses it, where SGLang's tree
    holds a tombstone)."""
    if engine.lut is None:
        return False
    p = engine.config.page_size
    length = len(pages) * p
    slots = [s for page in pages for s in engine.page_slots(page)]
    return any(not engine.lut[slots[pos]] for pos in range(engine.window_start(length), length))
