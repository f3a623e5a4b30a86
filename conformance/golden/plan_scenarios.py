"""Golden plan and scatter scenarios (CONTRACT §12, §13): fixed engine batches and scatters,
listed by hand as :class:`strategies.batches.EngineBatch` and
:class:`strategies.batches.ScatterBatch` descriptions; their arrays come from each one's seed
alone. ``plan.json`` stores what the reference makes of them."""

from __future__ import annotations

import dataclasses

from strategies.batches import EngineBatch, RowSpec, ScatterBatch

__all__ = ["engine_scale", "plan_scenarios", "scatter_scenarios"]


def _batch(rows, **options) -> EngineBatch:
    defaults = dict(
        pool_rows=len(rows) + 2, context_len=16, table="paged", page_size=4, swa_window=0,
        swa_table=None, pool=False, offset=0, verify_capacity=64, write_req_capacity=len(rows),
        seed=1,
    )  # fmt: skip
    defaults.update(options)
    return EngineBatch(rows=tuple(RowSpec(*row) for row in rows), **defaults)


def engine_scale(rows: int = 4096, long_prefix: int = 8200, seed: int = 4096) -> EngineBatch:
    """``rows`` rows: one request with a prefix of ``long_prefix`` tokens, the rest decodes and
    chunked prefills of a few dozen, some padding rows among them (70,000+ verify entries at
    the defaults). Stored as this recipe: its arguments."""
    n = rows
    rows = [("chunked", 1, long_prefix, 64, 0)]
    for i in range(2, n + 1):
        if i % 97 == 0:
            rows.append(("padding", 0, 9999, 3, 0))
        elif i % 5 == 0:
            rows.append(("chunked", i, 11 + i % 13, 1 + i % 7, 0))
        else:
            rows.append(("decode", i, 15 + i % 11, 1, 0))
    batch = _batch(rows, pool_rows=n + 1, context_len=long_prefix + 100, page_size=64, seed=seed)
    return _sized(batch)


def _sized(batch: EngineBatch) -> EngineBatch:
    """``batch`` with a verify capacity of exactly what it needs."""
    return dataclasses.replace(batch, verify_capacity=batch.total_verify())


def plan_scenarios() -> list[dict]:
    """Every plan scenario: an ``id``, a one-line ``what`` and the ``batch``."""
    mixed = [("decode", 1, 9, 1, 10), ("padding", 0, 3, 2, 5), ("chunked", 2, 4, 5, 3),
             ("prefill", 3, 0, 6, 6), ("idle", 4, 5, 0, 2)]  # fmt: skip
    return [
        dict(id="plan-mixed", what="decode, padding, chunked prefill, prefill and idle rows",
             batch=_sized(_batch(mixed))),
        dict(id="plan-padding-first", what="padding rows first and last, stale lengths",
             batch=_sized(_batch([("padding", 0, -2, 7, 1)] + mixed[:1] + [("padding", 0, 99, 1, 0)],
                                 write_req_capacity=5))),
        dict(id="plan-swa-head", what="a sliding window: entries from the window start, the "
             "head naming its real predecessor", batch=_sized(_batch(
                 mixed, swa_window=3, swa_table="identity", table="linear", page_size=1))),
        dict(id="plan-swa-evicted", what="a permuted SWA table with evicted (0) slots",
             batch=_sized(_batch(mixed, swa_window=5, swa_table="evicted", seed=7))),
        dict(id="plan-expected-offset-1", what="expected tokens at offset +1 below valid "
             "lengths shorter than the prefix", batch=_sized(_batch(mixed, pool=True, offset=1))),
        dict(id="plan-recycled", what="rows recycled from longer owners: stale tails in the "
             "table and the pool", batch=_sized(_batch(mixed, table="recycled", pool=True, seed=3))),
        dict(id="plan-overflow", what="one entry short: disabled, entries untouched, writes made",
             batch=_batch(mixed, verify_capacity=_sized(_batch(mixed)).verify_capacity - 1)),
        dict(id="plan-engine-scale", what="4096 rows, a prefix of 8200, 70,000+ entries",
             recipe=dict(rows=4096, long_prefix=8200, seed=4096)),
    ]  # fmt: skip


def scatter_scenarios() -> list[dict]:
    """Every scatter scenario: an ``id``, a one-line ``what`` and the ``scatter``."""
    return [
        dict(id="scatter-rows", what="three requests, one empty, one past its row's end",
             scatter=ScatterBatch(pool_rows=(2, 0, 3), lengths=(5, 0, 9), num_rows=4,
                                  context_len=7, seed=7)),
        dict(id="scatter-one-row", what="one request filling its row exactly",
             scatter=ScatterBatch(pool_rows=(1,), lengths=(6,), num_rows=2, context_len=6,
                                  seed=11)),
        dict(id="scatter-4096", what="4096 requests, the plan's cap",
             scatter=ScatterBatch(pool_rows=tuple(range(1, 4097)),
                                  lengths=tuple(i % 9 for i in range(4096)), num_rows=4097,
                                  context_len=6, seed=4096)),
    ]  # fmt: skip
