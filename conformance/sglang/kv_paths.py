"""What SGLang's paths that move KV without a forward carry of the canary: run on an MHA pool
with SGLang's canary attached by its own ``attach_mha``.

``install_canary`` attaches the canary's buffers beside the KV pool's (``pool_patcher``): each
buffer group holds its head and tail canary buffers as tensors of their own, and the pool's
``get_contiguous_buf_infos`` is wrapped to splice them into the list it returns. A path that
moves KV through that list moves the records with it (a PD transfer: the runtime leg runs
SGLang's splice, :mod:`conformance.sglang.splice`); a path that moves the pool's per-layer KV
buffers leaves the records where they were. :func:`paths` runs, from the installed release's
``mem_cache/memory_pool.py`` (``MHATokenToKVPool``, whose module imports the serving stack),
on a stand-in pool of its fields with SGLang's canary attached:

- the retraction backup (``get_cpu_copy``, then ``load_cpu_copy`` into other slots: what a
  PD decode server's ``cpu_tensor`` retraction backup does, ``mem_cache/common.py``'s
  ``backup_kv_cache`` and ``restore_kv_cache`` through ``Req.offload_kv_cache`` and
  ``load_kv_cache``): the KV and the canary buffers at the destination slots compared with
  the source's;
- HiCache's device buffers (``_mha_buffers``, the ``KVBuffers`` of the pool's buffer info):
  whether any canary buffer is among the tensors it names. The host pool copies exactly
  those (``pool_host/mha.py``: ``MHATokenToKVPoolHost`` keeps ``info.buffers.k`` and
  ``.v`` as its device buffers; read, not run: its module imports the serving stack);
- an EAGLE tree's accepted path (``topk`` > 1): ``move_kv_cache``, which EAGLE calls to move
  the accepted drafts' KV to the front of their request's block (:func:`eagle_tree`).

:func:`carries` says, per path, whether the canary's records move with the KV; the support
matrix's rows of those options move KV as it says (:mod:`conformance.sglang.matrix`).
"""

from __future__ import annotations

import functools
import importlib
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from conformance.sglang import loading

__all__ = ["EAGLE_TREE", "HICACHE", "RETRACTION_BACKUP", "MovePath", "carries", "paths"]

#: The paths, by the names the matrix gives them.
RETRACTION_BACKUP = "retraction backup (cpu_tensor)"
HICACHE = "HiCache host pool"
EAGLE_TREE = "EAGLE tree's accepted path (move_kv_cache)"
#: The stand-in pool's sizes: slots, layers, bytes of KV a slot and layer.
SLOTS, LAYERS, ROW_BYTES = 12, 2, 16


@dataclass(frozen=True)
class MovePath:
    """What one path moved: whether the KV arrived at the destination slots, and whether the
    canary's records did."""

    name: str
    kv_moved: bool
    records_moved: bool
    how: str

    def __str__(self) -> str:
        return f"{self.name}: KV {'moved' if self.kv_moved else 'left'}, records " + (
            "moved" if self.records_moved else "left behind"
        ) + f" ({self.how})"  # fmt: skip


def memory_pool_file() -> Path:
    return loading.sglang_root() / "srt" / "mem_cache" / "memory_pool.py"


def _pool() -> tuple[object, tuple]:
    """A stand-in ``MHATokenToKVPool`` (its fields the methods read, distinct KV bytes a slot
    and layer) with SGLang's canary attached by ``attach_mha``, and the canary group."""
    loading.manager_modules()
    for name in ("pool_patcher", "pool_patcher.adapters"):
        loading.register_package(f"{loading.KV_CANARY}.{name}")
    mha = importlib.import_module(f"{loading.KV_CANARY}.pool_patcher.adapters.mha")
    values = torch.arange(LAYERS * SLOTS * ROW_BYTES, dtype=torch.int64) % 251 + 1
    kv = values.to(torch.uint8).view(LAYERS, SLOTS, ROW_BYTES)
    pool = types.SimpleNamespace(
        k_buffer=[kv[i].clone() for i in range(LAYERS)],
        v_buffer=[(kv[i] ^ 0x5A).clone() for i in range(LAYERS)],
        layer_num=LAYERS, page_size=1, use_hnd=False, cpu_offloading_chunk_size=5,
        kv_cache_layout="nhd", k_data_ptrs=None, v_data_ptrs=None,
        get_contiguous_buf_infos=lambda: ([], [], []),
    )  # fmt: skip
    (group,) = mha.attach_mha(
        pool=pool, device=torch.device("cpu"), read_bytes=ROW_BYTES,
        kv_token_id_vs_position_offset=0,
    )  # fmt: skip
    for buf in (group.k_head, group.k_tail, group.v_head, group.v_tail):  # records of their own
        buf.copy_(torch.randint(1, 255, buf.shape, dtype=torch.uint8, generator=_rng()))
    return pool, group


def _rng() -> torch.Generator:
    return torch.Generator().manual_seed(23)


def _canary(group) -> tuple:
    return (group.k_head, group.k_tail, group.v_head, group.v_tail)


def retraction_backup(path: Path | None = None) -> MovePath:
    """A request's slots backed up by ``get_cpu_copy`` and loaded by ``load_cpu_copy`` into
    other slots, as a PD decode server's ``cpu_tensor`` retraction backup restores a request
    into newly allocated ones."""
    pool, group = _pool()
    sync = types.SimpleNamespace(synchronize=lambda: None)
    methods = loading.methods_from_source(path or memory_pool_file(), "MHATokenToKVPool",
                       ("get_cpu_copy", "load_cpu_copy"), {"current_platform": sync})  # fmt: skip
    src = torch.tensor([1, 2, 3, 4, 5, 6], dtype=torch.int64)  # a chunk and a part of one
    dst = torch.tensor([7, 8, 9, 10, 11, 0], dtype=torch.int64)
    copy = methods["get_cpu_copy"](pool, src)
    methods["load_cpu_copy"](pool, copy, dst)
    kv = all(torch.equal(b[dst], b[src]) for b in (*pool.k_buffer, *pool.v_buffer))
    records = all(torch.equal(b[dst], b[src]) for b in _canary(group))
    return MovePath(RETRACTION_BACKUP, kv, records,
                 "MHATokenToKVPool.get_cpu_copy and load_cpu_copy, run")  # fmt: skip


def hicache(path: Path | None = None) -> MovePath | None:
    """The device buffers of the pool's buffer info (``_mha_buffers``), which HiCache's host
    pool copies: whether the canary's buffers are among them (None: a release without
    ``_mha_buffers``, up to 0.5.22, whose host pool is not run here)."""
    path = path or memory_pool_file()
    if "def _mha_buffers" not in path.read_text():
        return None
    pool, group = _pool()
    scope = {
        "KVBuffers": lambda **fields: types.SimpleNamespace(**fields),
        "KVBufferLayout": lambda layout: layout,
    }
    scope["KVBufferLayout"].NHD = "nhd"  # type: ignore[attr-defined]
    buffers = loading.methods_from_source(path, "MHATokenToKVPool", ("_mha_buffers",), scope)[
        "_mha_buffers"
    ](pool)
    named = {id(t) for t in (*buffers.k, *buffers.v)}
    kv = all(id(b) in named for b in (*pool.k_buffer, *pool.v_buffer))
    records = any(id(b) in named for b in _canary(group))
    return MovePath(HICACHE, kv, records, "MHATokenToKVPool._mha_buffers, run; the host pool "
                 "copies the buffers it names, read")  # fmt: skip


def eagle_tree(path: Path | None = None) -> MovePath | None:
    """An EAGLE tree's accepted drafts moved to the front of their request's block: EAGLE's
    ``_finalize_accept_tree_path`` (``speculative/eagle_worker_common.py``, for ``topk`` > 1;
    read) calls ``move_accept_tokens_to_target_kvcache`` (run by the tree row's verifies,
    :func:`conformance.sglang.tree.as_tree`, to choose the moves), which calls the pool's
    ``move_kv_cache`` (None: a release whose ``MHATokenToKVPool`` has no ``move_kv_cache``).
    ``move_kv_cache`` and ``_move_kv_cache_impl`` run from source with the native move
    (``move_kv_cache_native``, also run; ``SGLANG_NATIVE_MOVE_KV_CACHE``); the default move
    copies, by pointer, the tensors ``_slot_move_pointer_buffers`` names (run here): whether
    any canary buffer is among them."""
    path = path or memory_pool_file()
    text = path.read_text()
    if "def move_kv_cache" not in text or "def _slot_move_pointer_buffers" not in text:
        return None
    pool, group = _pool()
    pool.use_native_move_kv_cache, pool.size, pool.k_scale_buffer = True, SLOTS, None
    pool.native_k_scale_buffer = None
    native = types.SimpleNamespace(get=lambda: True)  # SGLANG_NATIVE_MOVE_KV_CACHE, before 0.5.2x
    scope: dict = {
        "maybe_detect_oob": lambda *a, **k: None,
        "envs": types.SimpleNamespace(SGLANG_NATIVE_MOVE_KV_CACHE=native),
    }
    loading.from_source(path, ("move_kv_cache_native",), scope)
    names = ("move_kv_cache", "_move_kv_cache_impl", "_move_native_fp4_scales",
             "_slot_move_pointer_buffers")  # fmt: skip
    methods = loading.methods_from_source(
        path, "MHATokenToKVPool", tuple(n for n in names if f"def {n}(" in text), scope
    )
    for name, method in methods.items():
        setattr(pool, name, types.MethodType(method, pool))
    src = torch.tensor([3, 5, 8], dtype=torch.int64)  # the accepted path's nodes
    dst = torch.tensor([2, 3, 4], dtype=torch.int64)  # the front of the block
    moved = [b[src].clone() for b in (*pool.k_buffer, *pool.v_buffer, *_canary(group))]
    pool.move_kv_cache(dst, src)
    kv = all(
        torch.equal(b[dst], m)
        for b, m in zip((*pool.k_buffer, *pool.v_buffer), moved, strict=False)
    )
    records = all(torch.equal(b[dst], m) for b, m in zip(_canary(group), moved[-4:], strict=True))
    named = {id(t) for t in pool._slot_move_pointer_buffers()}
    records = records or any(id(b) in named for b in _canary(group))
    return MovePath(EAGLE_TREE, kv, records, "MHATokenToKVPool.move_kv_cache with the native move, "
                 "run; the default move's buffers (_slot_move_pointer_buffers), run")  # fmt: skip


@functools.cache
def paths() -> tuple[MovePath, ...]:
    """Each path that runs on the installed release."""
    made = (retraction_backup(), hicache(), eagle_tree())
    return tuple(p for p in made if p is not None)


def carries(name: str) -> bool | None:
    """Whether the path ``name`` moves the canary's records with the KV (None: not run on the
    installed release)."""
    return next((p.records_moved for p in paths() if p.name == name), None)
