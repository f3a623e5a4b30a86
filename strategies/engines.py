"""Engine configurations for the engine model (:mod:`engine_model`), drawn by Hypothesis.

The engine model itself is a simulator, not a strategy; this module only draws what it is
configured with, as :func:`strategies.layouts.source_layouts` draws what a source is.
"""

from __future__ import annotations

import dataclasses

import hypothesis.strategies as st

from engine_model import EngineConfig
from reference import RealKvHashMode

__all__ = ["engine_configs"]


@st.composite
def engine_configs(
    draw,
    *,
    max_pages: int = 24,
    max_context_len: int = 16,
    max_rows: int = 6,
    min_slots: int = 12,
    min_rows: int = 3,
    small_swa: bool = True,
    modes=tuple(int(m) for m in RealKvHashMode),
    page_sizes: tuple[int, ...] = (1, 2, 4),
    windows: tuple[int, ...] = (0, 0, 3, 5),
    allocators: str = "model",
) -> EngineConfig:
    """Engines of up to ``max_pages`` pages of ``page_sizes`` slots (default 1, 2 or 4) and ``max_rows``
    pool rows of up to ``max_context_len`` positions (the defaults run many steps under the
    interpreter), with a sliding window of ``windows`` (0: none) and without, with and without
    the EAGLE offset, in every hash mode, on the free lists ``allocators`` names (not drawn:
    :attr:`engine_model.EngineConfig.allocators`); a page size whose two pages do not fit in
    ``max_context_len`` gets a context of exactly two pages::

        engine_configs(max_pages=24, max_context_len=16)
    """
    page_size = draw(st.sampled_from(page_sizes), label="page_size")
    least_context = max(4, page_size * 2)
    context_len = draw(
        st.integers(least_context, max(least_context, max_context_len)), label="context_len"
    )
    num_pages = draw(
        st.integers(
            max(4, -(-min_slots // page_size)), max(4, max_pages, -(-min_slots // page_size))
        ),
        label="num_pages",
    )
    swa_window = draw(st.sampled_from(windows), label="swa_window")
    config = EngineConfig(
        page_size=page_size,
        num_pages=num_pages,
        pool_rows=draw(st.integers(min_rows, max(min_rows, max_rows)), label="pool_rows"),
        context_len=context_len,
        swa_window=swa_window,
        offset=draw(st.sampled_from((0, 1)), label="offset"),
        mode=draw(st.sampled_from(modes), label="mode"),
        seed=draw(st.integers(0, 2**16), label="seed"),
        allocators=allocators,
    )
    if not swa_window:
        return config
    # an SWA pool from a third of the full pool up: room for a whole row and a page, so
    # windows evict under pressure without starving the engine
    num_slots = num_pages * page_size
    least = min(num_slots, max(num_slots // 3, context_len + 2 * page_size))
    # with ``small_swa`` the smallest pool as often as any other, so that pressure comes about
    sizes = st.integers(least, num_slots)
    swa_slots = draw(st.one_of(st.just(least), sizes) if small_swa else sizes, label="swa_slots")
    return dataclasses.replace(config, swa_slots=swa_slots)
