"""A PD transfer over SGLang's ``pool_patcher/buf_info_splice.py`` (``splice_kv_buf_info``, its
patch of a pool's ``get_contiguous_buf_infos``), on SGLang's own ``CanaryBufferGroup`` and a
two-layer MHA pool's buffer list, copied item by item as a transfer engine copies them
(:func:`transfer`): every page's records must arrive with its KV, and without the splice they
must not (the check can fail)."""

from __future__ import annotations

import types

import torch

from conformance.sglang import loading

__all__ = ["MOVES", "PAGES", "PAGE_SIZE", "SLOTS_MOVED", "transfer"]

#: The pages a transfer moves: from the prefill engine's pages to the decode engine's.
MOVES = ((1, 5), (3, 2), (4, 0))
#: The pages of each engine's pool and their slots, and the slots a transfer moves.
PAGES = 6
PAGE_SIZE = 4
SLOTS_MOVED = len(MOVES) * PAGE_SIZE
#: A KV layer's bytes a slot, the K and V layers of the two-layer pool, a canary buffer's names.
KV_ROW_BYTES = 16
KV_LAYERS = 4
CANARY_BUFFERS = ("k_head", "k_tail", "v_head", "v_tail")


def _side(mods: types.SimpleNamespace, rng, *, splice: bool, page_size: int, slots: int):
    """One engine's pool: its KV layers, its canary buffers, the ``(ptr, len, item_len)``
    list a transfer engine copies (spliced or not) and its memory by pointer."""
    layers = [
        torch.randint(1, 255, (slots, KV_ROW_BYTES), dtype=torch.uint8, generator=rng)
        for _ in range(KV_LAYERS)
    ]  # K of two layers, then V of two layers
    bufs = {
        name: torch.randint(1, 255, (slots, mods.slot_bytes), dtype=torch.uint8, generator=rng)
        for name in CANARY_BUFFERS
    }
    group = mods.buffer_group.CanaryBufferGroup(
        kind=mods.buffer_group.PoolKind.FULL, **bufs, real_kv_sources_k=(),
        real_kv_sources_v=(), swa_index_lut=None, kv_token_id_vs_position_offset=0,
    )  # fmt: skip
    ptrs = [t.data_ptr() for t in layers]
    lens = [t.nbytes for t in layers]
    items = [t[0].nbytes * page_size for t in layers]
    if splice:
        ptrs, lens, items = mods.splice.splice_kv_buf_info(
            ptrs=ptrs, lens=lens, item_lens=items, group=group, has_v_half=True,
            page_size=page_size,
        )  # fmt: skip
    memory = {t.data_ptr(): t for t in [*layers, *bufs.values()]}
    return layers, bufs, list(zip(ptrs, lens, items, strict=True)), memory


def transfer(
    *, splice: bool, page_size: int = PAGE_SIZE, pages: int = PAGES, seed: int = 0
) -> list[str]:
    """A PD transfer of :data:`MOVES`' pages of a prefill engine's MHA pool into a decode
    engine's, over the ``(ptr, len, item_len)`` lists a transfer engine copies item by item
    (one page of each buffer an item), as SGLang's pool returns them: with ``splice``, through
    SGLang's own ``splice_kv_buf_info`` (its canary patch of ``get_contiguous_buf_infos``),
    which puts each canary buffer in the list; without, the KV layers alone. The slots whose
    records did not arrive with their KV, as lines."""
    mods = loading.splice_modules()
    rng = torch.Generator().manual_seed(seed)
    sizes = dict(splice=splice, page_size=page_size, slots=pages * page_size)
    src_layers, src_bufs, src_items, src_memory = _side(mods, rng, **sizes)
    dst_layers, dst_bufs, dst_items, dst_memory = _side(mods, rng, **sizes)
    for (sp, _, item), (dp, _, dst_item) in zip(src_items, dst_items, strict=True):
        assert item == dst_item
        source = src_memory[sp].view(-1)
        target = dst_memory[dp].view(-1)
        for a, b in MOVES:
            target[b * item : (b + 1) * item] = source[a * item : (a + 1) * item]
    lines = []
    for a, b in MOVES:
        for i in range(page_size):
            s, d = a * page_size + i, b * page_size + i
            kv = all(torch.equal(x[s], y[d]) for x, y in zip(src_layers, dst_layers, strict=True))
            records = all(torch.equal(src_bufs[n][s], dst_bufs[n][d]) for n in src_bufs)
            if kv and not records:
                lines.append(f"slot {s} -> {d}: the KV arrived, its records did not")
            elif not kv:
                lines.append(f"slot {s} -> {d}: the KV did not arrive")
    return lines
