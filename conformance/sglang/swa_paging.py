"""SGLang's SWA allocator run from source: how it pages the SWA pool beside the full pool, the
rule the engine model's SWA pages follow (CONTRACT §15, ``engine_model/allocators.py``).

``SWATokenToKVPoolAllocator`` (``mem_cache/allocator/swa.py``) holds two allocators of one
class, one per pool; at pages of more than one slot, ``PagedTokenToKVPoolAllocator``
(``allocator/paged.py``). :func:`swa_allocator` runs its ``alloc_extend``,
``new_pages_available``, ``translate_loc_from_full_to_swa``, ``set_full_to_swa_mapping``,
``clear_full_to_swa_mapping``, ``free_swa``, ``_expand_to_full_pages`` and ``_release_swa``,
and the paged allocator's ``alloc_extend`` (its CPU path, ``alloc_extend_naive``),
``available_size``, ``merge_and_sort_free``, ``free`` and ``_release_page_ids``, with
``get_num_new_pages`` (``utils/common.py``) and the SWA pool's ``register_mapping`` and
``translate_loc_from_full_to_swa`` (``swa_memory_pool.py``), all from the installed release's source, over
stand-in objects holding the fields they read. :func:`paging_departures` drives it with
random extends and frees and reports where it departs from the model's rule:

- every allocated full slot ``s`` of page ``q`` maps to slot ``s % page_size`` of one SWA page
  (the same for every slot of ``q``);
- a free of any slot of a page clears the whole page's mapping and gives its SWA page back.
"""

from __future__ import annotations

import functools
import types

import numpy as np
import torch

from conformance.sglang import loading, memory

__all__ = ["paging_departures", "swa_allocator"]

#: the methods run from source, per class
SWA_METHODS = (
    "alloc_extend", "new_pages_available", "translate_loc_from_full_to_swa",
    "set_full_to_swa_mapping", "clear_full_to_swa_mapping", "free_swa", "_expand_to_full_pages",
    "_release_swa",
)  # fmt: skip
#: the paged allocator's methods besides those :func:`memory.page_allocator` binds
PAGED_METHODS = ("alloc_extend", "available_size")
POOL_METHODS = ("register_mapping", "translate_loc_from_full_to_swa")


def _allocator_dir():
    return loading.sglang_root() / "srt" / "mem_cache" / "allocator"


@functools.cache
def _scope() -> dict:
    """The module-level names the methods read: ``alloc_extend_naive`` of ``paged.py`` and
    ``get_num_new_pages`` of ``utils/common.py``, from source."""
    scope: dict = {"torch": torch, "Optional": None}
    loading.from_source(_allocator_dir() / "paged.py", ("alloc_extend_naive",), scope)
    common = loading.sglang_root() / "srt" / "utils" / "common.py"
    loading.from_source(common, ("get_num_new_pages",), scope)
    scope["_is_npu"] = False
    return scope


@functools.cache
def _methods() -> tuple[dict, dict, dict]:
    scope = _scope()
    swa = loading.methods_from_source(
        _allocator_dir() / "swa.py", "SWATokenToKVPoolAllocator", SWA_METHODS, dict(scope)
    )
    paged = loading.methods_from_source(
        _allocator_dir() / "paged.py", "PagedTokenToKVPoolAllocator", PAGED_METHODS, dict(scope)
    )
    pool = loading.methods_from_source(
        _allocator_dir().parent / "swa_memory_pool.py", "SWAKVPool", POOL_METHODS, dict(scope)
    )
    return swa, paged, pool


def _bind(state: types.SimpleNamespace, methods: dict) -> types.SimpleNamespace:
    for name, method in methods.items():
        setattr(state, name, types.MethodType(method, state))
    return state


def _paged(page_size: int, pages: list[int], size: int) -> types.SimpleNamespace:
    """SGLang's paged allocator of ``size`` slots over free ``pages`` (the histories', a server
    without PD), with its ``alloc_extend`` on the CPU path and ``available_size``."""
    state = memory.page_allocator(page_size, pages)
    state.size, state.use_triton_kernels = size, False
    return _bind(state, _methods()[1])


def swa_allocator(page_size: int, full_pages: int, swa_pages: int, rng) -> types.SimpleNamespace:
    """SGLang's ``SWATokenToKVPoolAllocator`` of pages of ``page_size`` (> 1) slots over
    ``full_pages`` and ``swa_pages`` pages (page 0 of each the padding page), each free list in
    an order ``rng`` shuffles."""
    if page_size < 2:
        raise ValueError("pages of one slot take TokenToKVPoolAllocator's alloc, not alloc_extend")
    full, swa = list(range(1, full_pages)), list(range(1, swa_pages))
    rng.shuffle(full)
    rng.shuffle(swa)
    size = full_pages * page_size
    state = types.SimpleNamespace(
        page_size=page_size, free_group=None, _swa_req_ring=False,
        full_attn_allocator=_paged(page_size, full, size),
        swa_attn_allocator=_paged(page_size, swa, swa_pages * page_size),
        full_to_swa_index_mapping=torch.cat(
            [torch.zeros(size + page_size, dtype=torch.int64), torch.tensor([-1])]
        ),
    )  # fmt: skip
    # the SWA KV pool, which translates through the mapping the allocator registers with it
    state._kvcache = _bind(types.SimpleNamespace(), _methods()[2])
    state._kvcache.register_mapping(state.full_to_swa_index_mapping)
    return _bind(state, _methods()[0])


def _check(alloc, slots_of: dict[int, list[int]], page_size: int, freed: set) -> list[str]:
    """Where the mapping of the allocated slots of the pages in use (``freed``: the pages whose
    SWA page was freed) departs from whole SWA pages in step with the full pages: slot ``k`` of
    a full page at slot ``k`` of one SWA page."""
    lut = alloc.full_to_swa_index_mapping.numpy()
    out = []
    for rid, slots in slots_of.items():
        pages: dict[int, set[int]] = {}
        for slot in slots:
            if slot // page_size not in freed:
                pages.setdefault(slot // page_size, set()).add(int(lut[slot]) - slot % page_size)
        for page, starts in sorted(pages.items()):
            if len(starts) != 1 or min(starts) <= 0 or min(starts) % page_size:
                out.append(f"request {rid}, page {page}: SWA slots {sorted(starts)} + k")
    return out


def paging_departures(
    page_sizes=(2, 4, 16), seeds: int = 20, steps: int = 30
) -> tuple[int, list[str], int]:
    """Random extends (new requests and next chunks of running ones, in batches of one to
    three) and frees of one slot of a request's page through :func:`swa_allocator`, checked
    after each against the rule: ``(cases, departures, pages_freed)``."""
    cases, out, freed_pages = 0, [], 0
    for p in page_sizes:
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            alloc = swa_allocator(p, 64, 48, rng)
            slots_of: dict[int, list[int]] = {}
            freed: set[int] = set()
            for _ in range(steps):
                batch = sorted({int(r) for r in rng.integers(0, 6, size=int(rng.integers(1, 4)))})
                prefix = [len(slots_of.get(r, [])) for r in batch]
                seq = [n + int(rng.integers(1, 2 * p + 2)) for n in prefix]
                last = [slots_of[r][-1] if slots_of.get(r) else -1 for r in batch]
                lens = torch.tensor(prefix), torch.tensor(seq)
                got = alloc.alloc_extend(lens[0], lens[0], lens[1], lens[1], torch.tensor(last),
                                         int(sum(seq) - sum(prefix)))  # fmt: skip
                if got is None:
                    break
                start = 0
                for r, a, b in zip(batch, prefix, seq, strict=True):
                    slots_of.setdefault(r, []).extend(got[start : start + b - a].tolist())
                    start += b - a
                out += _check(alloc, slots_of, p, freed)
                cases += 1
                # a page behind a request's last one (a server frees SWA pages behind the
                # window; the last page is being written)
                rid = int(rng.choice(sorted(slots_of)))
                last_page = slots_of[rid][-1] // p
                behind = [s for s in slots_of[rid] if s // p not in freed | {last_page}]
                if not behind:
                    continue
                slot = int(rng.choice(behind))
                page = slot // p
                swa_page = int(alloc.full_to_swa_index_mapping[page * p]) // p
                alloc.free_swa(torch.tensor([slot]))
                row = alloc.full_to_swa_index_mapping[page * p : (page + 1) * p]
                back = swa_page in alloc.swa_attn_allocator.free_pages.tolist()
                if row.any() or not back:
                    out.append(f"pages of {p}: a free of slot {slot} left {row.tolist()}, "
                               f"SWA page {swa_page} {'back' if back else 'not back'}")  # fmt: skip
                freed.add(page)
                freed_pages += 1
    return cases, out, freed_pages
