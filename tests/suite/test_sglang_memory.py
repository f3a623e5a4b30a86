"""The engine model's allocators hold to SGLang's, run from their source beside them
(``conformance/sglang/memory.py``): the same pages and pool rows, and the same free lists, over
random allocations and frees."""

from __future__ import annotations

import pytest

from conformance.sglang import memory
from engine_model import Engine, EngineConfig


def _config(page_size: int) -> EngineConfig:
    return EngineConfig(page_size=page_size, num_pages=24, pool_rows=6, context_len=16)


@pytest.mark.parametrize("page_size", [1, 2, 4, 16])
def test_the_engine_allocates_pages_and_rows_as_sglang_does(page_size):
    for seed in range(4):
        assert memory.departures(_config(page_size), 150, seed) == []


def _fifo_pages(self, pages):
    self.free_pages.extend(pages)


def _front_row(self):
    return self.free_rows.pop(0)


@pytest.mark.parametrize(
    ("page_size", "patch"),
    [(2, ("_return_pages", _fifo_pages)), (1, ("_take_row", _front_row))],
    ids=["pages freed to the back", "rows taken from the front"],
)
def test_an_allocator_in_another_order_is_caught(page_size, patch, monkeypatch):
    """Able to fail: the engine's earlier orders (freed pages behind every free page, rows
    from the front of the list) depart from SGLang's."""
    monkeypatch.setattr(Engine, *patch)
    found = [memory.departures(_config(page_size), 150, seed) for seed in range(4)]
    assert any(found), found
