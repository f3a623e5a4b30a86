"""SGLang's allocators run from their source beside the engine model's, which hold to them.

The engine model (``engine_model/allocators.py``) hands out pages and pool rows in SGLang's
order; this module runs SGLang's own allocators on the CPU, from the installed release's source
(their modules import the serving stack), so that a self-test can require the same choices on
the same sequence of allocations and frees (:func:`departures`):

- ``TokenToKVPoolAllocator`` (``mem_cache/allocator/token.py``), pages of one slot: ``alloc``
  takes from the front of its free list, ``free`` appends;
- ``PagedTokenToKVPoolAllocator`` (``mem_cache/allocator/paged.py``), larger pages: ``alloc``
  takes whole pages from the front, ``free`` puts a call's pages, sorted, before every free
  page (``_release_page_ids`` without ``need_sort``: a server without PD);
- ``ReqToTokenPool`` (``mem_cache/memory_pool.py``): ``alloc_rows`` takes from the tail of its
  free list, ``free_rows`` appends.

Each is a stand-in object holding the fields those methods read, the methods SGLang's own.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import torch

from conformance.sglang import loading
from engine_model import Engine, EngineConfig

__all__ = ["departures", "page_allocator", "row_pool"]


def _mem_cache() -> Path:
    return loading.sglang_root() / "srt" / "mem_cache"


def page_allocator(page_size: int, free_pages: list[int]) -> types.SimpleNamespace:
    """SGLang's allocator of pages of ``page_size`` slots (``TokenToKVPoolAllocator`` for
    one, else ``PagedTokenToKVPoolAllocator``), its free list ``free_pages``: ``alloc(slots)``
    and ``free(slots)`` are its own methods."""
    one = page_size == 1
    path = _mem_cache() / "allocator" / ("token.py" if one else "paged.py")
    cls = "TokenToKVPoolAllocator" if one else "PagedTokenToKVPoolAllocator"
    names = ("alloc", "free") if one else ("alloc", "free", "_release_page_ids", "merge_and_sort_free", "get_all_free_pages")  # fmt: skip
    methods = loading.methods_from_source(path, cls, names, {"torch": torch})
    state = types.SimpleNamespace(
        page_size=page_size, device="cpu", need_sort=False, debug_mode=False, free_group=None,
        staged_pages=[], num_staged_pages=0,
        free_pages=torch.tensor(free_pages, dtype=torch.int64),
        release_pages=torch.empty((0,), dtype=torch.int64),
    )  # fmt: skip
    for name, method in methods.items():
        setattr(state, name, types.MethodType(method, state))
    return state


def row_pool(rows: int) -> types.SimpleNamespace:
    """SGLang's ``ReqToTokenPool`` of ``rows`` rows (row 0 the padding row): its own
    ``alloc_rows`` and ``free_rows``."""
    methods = loading.methods_from_source(
        _mem_cache() / "memory_pool.py", "ReqToTokenPool", ("alloc_rows", "free_rows"), {}
    )
    state = types.SimpleNamespace(
        free_slots=list(range(1, rows)), req_generation=torch.zeros(rows, dtype=torch.int64),
        _on_alloc_rows=None, _aux_cache=None,
    )  # fmt: skip
    for name, method in methods.items():
        setattr(state, name, types.MethodType(method, state))
    return state


def departures(config: EngineConfig, steps: int, seed: int, engine: Engine | None = None):
    """``steps`` random allocations and frees of pages (several pages a free call, as a
    request's release frees them) and of pool rows, made on the engine model's allocators and
    on SGLang's beside them from the same free lists: where their choices or free lists first
    differ (empty: nowhere)."""
    engine = engine or Engine(config)
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
