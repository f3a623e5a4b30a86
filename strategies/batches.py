"""Engine batch state for the plan (CONTRACT §12) and the scatter (§13), as plain descriptions.

A :class:`EngineBatch` is what an engine hands the plan kernel on one forward step: a
``req_to_token`` page table, the batch's rows (prefill, chunked prefill, decode, idle and
padding rows, in any order), an optional sliding window with its full-to-SWA slot table, an
optional expected-token pool with its valid lengths and position offset, and the capacities of
the two plans. The description holds only what was drawn (small ints and a seed); the arrays
are made from it, deterministically, by :meth:`EngineBatch.arrays`, so a failing example's
``repr`` rebuilds it exactly and an engine-scale batch (4096 rows, prefixes of 8k+ tokens) is
drawn in microseconds. Torch-free, like every description: the suite makes tensors of it.

Test data is non-zero and distinct where it matters: the live slots of a batch are distinct and
never the padding slot 0 (an evicted SWA slot is the one 0 on purpose), and tokens are distinct
and non-zero.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import hypothesis.strategies as st
import numpy as np

from reference.plan import MAX_PLAN_REQS, plan_entries
from strategies.sizes import check_int, sizes

__all__ = [
    "ROW_KINDS",
    "TABLE_KINDS",
    "FAULT_BATCH",
    "FAULT_SCATTER",
    "BatchArrays",
    "BatchFault",
    "EngineBatch",
    "RowSpec",
    "ScatterBatch",
    "distinct_values",
    "engine_batches",
    "plan_faults",
    "scatter_faults",
    "scatter_batches",
]

#: What a row of a batch is doing this step.
ROW_KINDS = ("prefill", "chunked", "decode", "idle", "padding")
#: How the page table lays slots out: one run per row, a random permutation of every slot,
#: pages of ``page_size`` slots in random order, and pages whose rows were recycled from a longer
#: previous owner, whose stale slots stay in the row's tail.
TABLE_KINDS = ("linear", "permuted", "paged", "recycled")
#: The full-to-SWA table: the identity, a permutation, or a permutation with evicted (0) slots.
SWA_TABLES = ("identity", "permuted", "evicted")


@dataclass(frozen=True)
class RowSpec:
    """One row of a batch: its pool row (0: padding), its prefix and extend lengths and the
    valid length of its expected-token pool row. A padding row's lengths are stale values that
    the plan must ignore, negative ones included."""

    kind: str
    pool_row: int
    prefix: int
    extend: int
    valid_len: int


@dataclass(frozen=True)
class BatchArrays:
    """An :class:`EngineBatch` made into numpy arrays, with the plan's argument names."""

    req_to_token: np.ndarray  # int32 [pool_rows, context_len]
    req_pool_indices: np.ndarray  # int64 [bs]
    prefix_lens: np.ndarray  # int64 [bs]
    extend_seq_lens: np.ndarray  # int64 [bs]
    full_to_swa_index_mapping: np.ndarray | None  # int64 [num_slots]
    req_to_verify_expected_tokens: np.ndarray | None  # int32 [pool_rows, context_len]
    req_to_verify_expected_tokens_valid_lens: np.ndarray | None  # int64 [bs]


@dataclass(frozen=True)
class EngineBatch:
    """One forward step's plan inputs (CONTRACT §12), as an engine builds them.

    Example draw::

        EngineBatch(rows=(RowSpec('decode', 2, 7, 1, 8), RowSpec('padding', 0, 3, 1, 0),
                          RowSpec('prefill', 1, 0, 5, 5)),
                    pool_rows=4, context_len=12, table='paged', page_size=4, swa_window=0,
                    swa_table=None, pool=True, offset=1, verify_capacity=7,
                    write_req_capacity=3, seed=11)
    """

    rows: tuple[RowSpec, ...]
    pool_rows: int
    context_len: int
    table: str
    page_size: int
    swa_window: int
    swa_table: str | None
    pool: bool
    offset: int
    verify_capacity: int
    write_req_capacity: int
    seed: int

    @property
    def bs(self) -> int:
        return len(self.rows)

    @property
    def num_slots(self) -> int:
        """Slots of the full KV pool: every slot the table holds is below it (slot 0 is the
        padding slot); also the length of the full-to-SWA table."""
        return _layout(self)[0]

    def arrays(self) -> BatchArrays:
        """The plan's arguments, made from the description (the same every time)."""
        return _arrays(self)

    def entries(self):
        """The batch's verify entries before the capacity and the SWA table are applied, and
        without expected tokens (``reference.plan_entries``)."""
        a = self.arrays()
        return plan_entries(
            req_pool_indices=a.req_pool_indices,
            prefix_lens=a.prefix_lens,
            req_to_token=a.req_to_token,
            swa_window_size=self.swa_window,
            full_to_swa_index_mapping=None,
            req_to_verify_expected_tokens=None,
            req_to_verify_expected_tokens_valid_lens=None,
            kv_token_id_vs_position_offset=0,
        )

    def total_verify(self) -> int:
        """How many verify entries the batch asks for (before the capacity is applied)."""
        return int(self.entries().slots.shape[0])

    def kinds(self) -> str:
        """The rows' kinds in batch order, for labels: ``'decode,padding,prefill'``."""
        return ",".join(row.kind for row in self.rows)


def distinct_values(rng: np.random.Generator, count: int) -> np.ndarray:
    """``count`` distinct values in ``[1, 2^31 - 1)``, in random order, in O(count): an affine
    bijection modulo the prime 2^31 - 1 (no permutation of a huge range is drawn)."""
    prime = 2**31 - 1
    if count >= prime:
        raise ValueError(f"{count} distinct values do not fit below 2^31")
    a, b = (int(x) for x in rng.integers(1, prime - 1, size=2))
    return 1 + (np.arange(count, dtype=np.int64) * a + b) % prime % (prime - 1)


def _needs(batch: EngineBatch) -> dict[int, int]:
    """Positions each live pool row's request occupies, one more for its next decode, within
    the row."""
    return {
        spec.pool_row: min(batch.context_len, max(spec.prefix, 0) + max(spec.extend, 0) + 1)
        for spec in batch.rows
        if spec.kind != "padding"
    }


@functools.lru_cache(maxsize=8)
def _layout(batch: EngineBatch) -> tuple[int, dict[int, np.ndarray]]:
    """``(num_slots, the slots of each live pool row's occupied positions)``: whole pages of
    ``page_size`` slots, one run per row in pool-row order (linear) or pages in random order,
    a third of the pool left free between them."""
    rng = np.random.default_rng(batch.seed)
    page = batch.page_size
    needs = sorted(_needs(batch).items())
    pages = [-(-need // page) for _, need in needs]
    total = sum(pages)
    free = 0 if batch.table == "linear" else total // 2 + 1
    order = np.arange(total) if batch.table == "linear" else rng.permutation(total + free)[:total]
    slots, first = {}, 0
    for (row, need), n in zip(needs, pages):
        ids = order[first : first + n]
        first += n
        slots[row] = (1 + ids[:, None] * page + np.arange(page)[None, :]).reshape(-1)[:need]
    return 1 + (total + free) * page, slots


@functools.lru_cache(maxsize=8)
def _arrays(batch: EngineBatch) -> BatchArrays:
    rng = np.random.default_rng(batch.seed + 1)
    rows, cols = batch.pool_rows, batch.context_len
    _, row_slots = _layout(batch)
    table = np.zeros((rows, cols), dtype=np.int32)  # a fresh table is zero: the padding slot
    for row, slots in row_slots.items():
        table[row, : slots.shape[0]] = slots
    if batch.table == "recycled" and row_slots:
        # every row's tail still holds slots of a previous, longer owner: slots that are
        # now other positions' (made in pool-row order: the table must not depend on the
        # order of the batch)
        used = np.concatenate(list(row_slots.values()))
        for row in range(1, rows):
            start = row_slots[row].shape[0] if row in row_slots else 0
            table[row, start:] = rng.choice(used, size=cols - start)
    lut = None
    if batch.swa_table is not None:
        n = batch.num_slots
        if batch.swa_table == "identity":
            lut = np.arange(n, dtype=np.int64)
        else:
            lut = np.concatenate([[0], 1 + rng.permutation(n - 1)]).astype(np.int64)
            if batch.swa_table == "evicted":
                lut[rng.random(n) < 0.25] = 0
                lut[0] = 0
    pool = valid = None
    if batch.pool:
        # distinct non-zero tokens; a row's entries past its valid length are a stale tail
        pool = distinct_values(rng, rows * cols).astype(np.int32).reshape(rows, cols)
        valid = np.array([spec.valid_len for spec in batch.rows], dtype=np.int64)
    return BatchArrays(
        req_to_token=table,
        req_pool_indices=np.array([s.pool_row for s in batch.rows], dtype=np.int64),
        prefix_lens=np.array([s.prefix for s in batch.rows], dtype=np.int64),
        extend_seq_lens=np.array([s.extend for s in batch.rows], dtype=np.int64),
        full_to_swa_index_mapping=lut,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=valid,
    )


@st.composite
def _row_specs(draw, *, kinds: tuple[str, ...], pool_rows: int, context_len: int, bs: int):
    """``bs`` rows with distinct live pool rows, each within the context length."""
    live_rows = draw(st.permutations(range(1, pool_rows)), label="pool rows order")
    specs = []
    for i in range(bs):
        kind = draw(st.sampled_from(kinds), label=f"row {i} kind")
        if kind != "padding" and i >= len(live_rows):
            kind = "padding"
        if kind == "padding":
            stale = st.integers(-3, context_len + 3)
            specs.append(RowSpec("padding", 0, draw(stale), draw(stale), draw(stale)))
            continue
        pool_row = live_rows[i]
        if kind == "prefill":
            prefix, extend = 0, draw(st.integers(1, context_len))
        elif kind == "chunked":
            prefix = draw(st.integers(1, context_len - 1))
            extend = draw(st.integers(1, context_len - prefix))
        elif kind == "decode":
            prefix, extend = draw(st.integers(1, context_len - 1)), 1
        else:  # idle: a prefix to verify, nothing written (or a negative stale extend)
            prefix, extend = draw(st.integers(0, context_len)), draw(st.integers(-2, 0))
        valid = draw(st.integers(0, min(context_len, prefix + max(extend, 0) + 1)))
        specs.append(RowSpec(kind, pool_row, prefix, extend, valid))
    return tuple(specs)


def engine_batches(
    *,
    max_reqs: int = 6,
    max_context_len: int = 24,
    kinds: tuple[str, ...] = ROW_KINDS,
    swa: bool | None = None,
    pool: bool | None = None,
    overflow: bool | None = None,
) -> st.SearchStrategy[EngineBatch]:
    """Batches of up to ``max_reqs`` rows over rows of up to ``max_context_len`` tokens.

    ``swa``, ``pool`` and ``overflow`` force a sliding window, an expected-token pool and a
    verify capacity below what the batch needs (True), forbid them (False), or draw either
    (None). Capacities are drawn below, at and above the batch's need; the write plan holds at
    least ``bs`` requests (CONTRACT §12 P6). Row counts and context lengths are drawn by
    :func:`strategies.sizes`, so 2^k +- 1 edges come up often.

    Example draw from ``engine_batches(max_reqs=3)``: see :class:`EngineBatch`.
    """
    check_int("max_reqs", max_reqs, 1, MAX_PLAN_REQS)
    check_int("max_context_len", max_context_len, 2)
    return _engine_batches(max_reqs, max_context_len, kinds, swa, pool, overflow)


@st.composite
def _engine_batches(draw, max_reqs, max_context_len, kinds, swa, pool, overflow):
    bs = draw(sizes(max_reqs, min_size=1), label="bs")
    shortest = 3 if overflow is True else 2  # an overflow needs a row of two entries
    context_len = draw(sizes(max_context_len, min_size=shortest), label="context_len")
    pool_rows = bs + 1 + draw(st.integers(0, 2), label="spare pool rows")
    rows = draw(_row_specs(kinds=kinds, pool_rows=pool_rows, context_len=context_len, bs=bs))
    table = draw(st.sampled_from(TABLE_KINDS), label="table")
    page_size = 1 if table in ("linear", "permuted") else draw(st.sampled_from((1, 2, 4, 16, 64)))
    use_swa = draw(st.booleans(), label="swa") if swa is None else swa
    swa_window = draw(st.integers(1, context_len + 1), label="swa_window") if use_swa else 0
    swa_table = draw(st.sampled_from(SWA_TABLES), label="swa_table") if use_swa else None
    use_pool = draw(st.booleans(), label="pool") if pool is None else pool
    offset = draw(st.sampled_from((0, 1)), label="offset") if use_pool else 0
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    draft = EngineBatch(
        rows, pool_rows, context_len, table, page_size, swa_window, swa_table, use_pool, offset,
        1, bs, seed,
    )  # fmt: skip
    need = draft.total_verify()
    if overflow is True and need < 2:
        # an overflow needs two entries: the first live row verifies its whole context, with
        # no window to cut it short
        first = next((i for i, r in enumerate(rows) if r.kind != "padding"), None)
        if first is None:
            rows = (RowSpec("decode", 1, context_len - 1, 1, 0),) + rows[1:]
            first = 0
        spec = rows[first]
        rows = (
            rows[:first]
            + (RowSpec(spec.kind, spec.pool_row, context_len - 1, 1, spec.valid_len),)
            + rows[first + 1 :]
        )
        swa_window, swa_table = 0, None
        draft = EngineBatch(
            rows, pool_rows, context_len, table, page_size, swa_window, swa_table, use_pool,
            offset, 1, bs, seed,
        )  # fmt: skip
        need = draft.total_verify()
    if overflow is True:
        capacity = draw(st.integers(max(1, need - 3), need - 1), label="verify_capacity")
    elif overflow is False:
        capacity = draw(st.sampled_from((need, need + 1, need + 7)), label="verify_capacity")
    else:
        capacity = draw(
            st.sampled_from((need - 1, need, need + 1, need + 7)), label="verify_capacity"
        )
    capacity = max(capacity, 1)
    write_capacity = bs + draw(st.integers(0, 2), label="spare write rows")
    return EngineBatch(
        rows, pool_rows, context_len, table, page_size, swa_window, swa_table, use_pool, offset,
        capacity, write_capacity, seed,
    )  # fmt: skip


@dataclass(frozen=True)
class ScatterBatch:
    """One expected-token scatter (CONTRACT §13): per request its pool row and token count.

    The tokens are made from ``seed``: distinct, non-zero, with some above 2^31 so that the
    32-bit cut shows. The pool starts full of other distinct non-zero tokens, so a write where
    none belongs shows. Example draw::

        ScatterBatch(pool_rows=(3, 1), lengths=(4, 9), num_rows=5, context_len=6, seed=2)
    """

    pool_rows: tuple[int, ...]
    lengths: tuple[int, ...]
    num_rows: int
    context_len: int
    seed: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(flat_in, offsets, req_pool_indices, pool_out)`` as the scatter takes them."""
        rng = np.random.default_rng(self.seed)
        total = sum(self.lengths)
        flat = (1 + rng.permutation(8 * total + 8)[:total]).astype(np.int64)
        flat[rng.random(total) < 0.25] += 2**32  # the cut keeps the low 32 bits
        flat[rng.random(total) < 0.1] *= -1
        offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        cells = self.num_rows * self.context_len
        pool = (1 + rng.permutation(4 * cells + 4)[:cells]).astype(np.int32)
        return (
            flat,
            offsets,
            np.array(self.pool_rows, dtype=np.int64),
            pool.reshape(self.num_rows, self.context_len),
        )


def scatter_batches(
    *, max_reqs: int = 6, max_context_len: int = 24, max_tokens_per_req: int | None = None
) -> st.SearchStrategy[ScatterBatch]:
    """Scatters of up to ``max_reqs`` requests to distinct pool rows (row 0 among them), with
    empty requests and requests longer than a pool row (their tail is dropped).

    Example draw: see :class:`ScatterBatch`.
    """
    check_int("max_reqs", max_reqs, 1, MAX_PLAN_REQS)
    check_int("max_context_len", max_context_len, 1)
    longest = max_tokens_per_req if max_tokens_per_req is not None else max_context_len + 3
    return _scatter_batches(max_reqs, max_context_len, longest)


@st.composite
def _scatter_batches(draw, max_reqs, max_context_len, longest):
    bs = draw(sizes(max_reqs, min_size=0), label="bs")
    num_rows = bs + draw(st.integers(1, 3), label="spare pool rows")
    context_len = draw(sizes(max_context_len, min_size=1), label="context_len")
    rows = draw(st.permutations(range(num_rows)), label="pool rows")[:bs]
    lengths = draw(st.lists(sizes(longest), min_size=bs, max_size=bs), label="lengths")
    seed = draw(st.integers(0, 2**32 - 1), label="seed")
    return ScatterBatch(tuple(rows), tuple(lengths), num_rows, context_len, seed)


# ---------------------------------------------------------------------------------------------
# Invalid plan and scatter launches: one fault at a time, for every check of CONTRACT §12, §13


@dataclass(frozen=True)
class BatchFault:
    """One broken argument of a plan or scatter launch, as data the suite applies to tensors.

    ``change`` is one of: ``"kind"`` (the argument becomes ``value``: ``"None"``, ``"list"``,
    ``"ndarray"``, ``"float"``, ``"str"``, ``"bool"``, or ``"VerifyPlan"``), ``"dtype"`` (cast to
    the torch dtype named ``value``), ``"shape"`` (``value`` is ``"2-D"``, ``"1-D"``,
    ``"longer"`` or ``"shorter"``), ``"strided"`` (a non-contiguous view of the same values),
    ``"device"`` (moved to the device ``value``), ``"set"`` (entry ``index`` of the array becomes
    ``value``), ``"int"`` (the int argument becomes ``value``), ``"capacity"`` (the plan named by
    ``argument`` is allocated with ``value`` entries), ``"drop"`` (the argument becomes None) and
    ``"rows"`` (a batch of ``value`` padding rows). ``words`` are what the message must name when
    the contract gives no exact message.
    """

    rule: str
    argument: str
    change: str
    value: object = None
    index: int = 0
    error: str = "ValueError"
    words: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        detail = "" if self.value is None else f"={self.value}"
        where = f"[{self.index}]" if self.change == "set" else ""
        return f"{self.rule}: {self.argument}{where} {self.change}{detail}"


#: The valid batch every plan fault breaks: a decode, a padding row whose stale lengths are out
#: of every range (never read), a chunked prefill and a prefill, with a sliding window over a
#: permuted table and an expected-token pool read at offset +1.
FAULT_BATCH = EngineBatch(
    rows=(
        RowSpec("decode", 1, 6, 1, 7),
        RowSpec("padding", 0, 99, 2, 99),
        RowSpec("chunked", 2, 3, 4, 3),
        RowSpec("prefill", 3, 0, 4, 4),
    ),
    pool_rows=5,
    context_len=12,
    table="paged",
    page_size=4,
    swa_window=4,
    swa_table="permuted",
    pool=True,
    offset=1,
    verify_capacity=7,
    write_req_capacity=4,
    seed=2026,
)


def plan_faults() -> tuple[BatchFault, ...]:
    """Every plan check of CONTRACT §12 broken on its own (P1 to P13), on :data:`FAULT_BATCH`."""
    f = BatchFault
    return (
        f("P1", "verify_plan_out", "kind", "None", error="TypeError", words=("verify_plan_out",)),
        f("P1", "write_plan_out", "kind", "VerifyPlan", error="TypeError", words=("write_plan_out",)),
        f("P1", "req_to_token", "kind", "list", error="TypeError", words=("req_to_token",)),
        f("P1", "prefix_lens", "kind", "ndarray", error="TypeError", words=("prefix_lens",)),
        f("P1", "full_to_swa_index_mapping", "kind", "list", error="TypeError",
          words=("full_to_swa_index_mapping",)),
        f("P1", "swa_window_size", "kind", "float", error="TypeError", words=("swa_window_size",)),
        f("P1", "swa_window_size", "kind", "bool", error="TypeError", words=("swa_window_size",)),
        f("P1", "verify_capacity", "kind", "str", error="TypeError", words=("verify_capacity",)),
        f("P1", "kv_token_id_vs_position_offset", "kind", "None", error="TypeError",
          words=("kv_token_id_vs_position_offset",)),
        f("P2", "full_to_swa_index_mapping", "drop"),
        f("P3", "req_to_verify_expected_tokens_valid_lens", "drop"),
        f("P4", "req_pool_indices", "rows", MAX_PLAN_REQS + 1),
        f("P5", "verify_capacity", "int", FAULT_BATCH.verify_capacity + 1),
        f("P6", "write_plan_out", "capacity", FAULT_BATCH.bs - 1),
        f("P7", "req_to_token", "strided"),
        f("P7", "prefix_lens", "strided"),
        f("P7", "req_to_verify_expected_tokens", "strided"),
        f("P7", "verify_plan_out.verify_expected_tokens", "strided"),
        f("P7", "write_plan_out.write_offsets", "strided"),
        f("P8", "swa_window_size", "int", -1, words=("swa_window_size", "-1")),
        f("P9", "req_to_token", "dtype", "int64", words=("req_to_token",)),
        f("P9", "prefix_lens", "dtype", "int32", words=("prefix_lens",)),
        f("P9", "full_to_swa_index_mapping", "dtype", "int32", words=("full_to_swa_index_mapping",)),
        f("P9", "req_to_verify_expected_tokens", "dtype", "int64",
          words=("req_to_verify_expected_tokens",)),
        f("P9", "req_to_verify_expected_tokens_valid_lens", "shape", "longer",
          words=("req_to_verify_expected_tokens_valid_lens",)),
        f("P9", "extend_seq_lens", "shape", "shorter", words=("extend_seq_lens",)),
        f("P9", "req_pool_indices", "shape", "2-D", words=("req_pool_indices",)),
        f("P9", "req_to_token", "shape", "1-D", words=("req_to_token",)),
        f("P9", "verify_plan_out.enable", "dtype", "int64", words=("verify_plan_out.enable",)),
        f("P9", "write_plan_out.write_num_valid_reqs", "shape", "longer",
          words=("write_plan_out.write_num_valid_reqs",)),
        f("P9", "req_to_token", "device", "meta", words=("req_to_token",)),
        f("P10", "req_pool_indices", "set", FAULT_BATCH.pool_rows, index=2, error="IndexError",
          words=("req_pool_indices[2]", str(FAULT_BATCH.pool_rows))),
        f("P10", "req_pool_indices", "set", -1, index=0, error="IndexError",
          words=("req_pool_indices[0]", "-1")),
        f("P11", "prefix_lens", "set", FAULT_BATCH.context_len + 1, index=0,
          words=("prefix_lens[0]", str(FAULT_BATCH.context_len + 1))),
        f("P12", "req_to_verify_expected_tokens_valid_lens", "set", FAULT_BATCH.context_len + 1,
          index=3, words=("req_to_verify_expected_tokens_valid_lens[3]",
                          str(FAULT_BATCH.context_len + 1))),
        f("P13", "full_to_swa_index_mapping", "shape", "shorter"),
    )  # fmt: skip


#: The valid scatter every scatter fault breaks: three requests, one of them empty, one longer
#: than its pool row.
FAULT_SCATTER = ScatterBatch(
    pool_rows=(2, 0, 3), lengths=(5, 0, 9), num_rows=4, context_len=7, seed=7
)


def scatter_faults() -> tuple[BatchFault, ...]:
    """Every scatter check of CONTRACT §13 broken on its own (S1 to S11), on :data:`FAULT_SCATTER`."""
    f = BatchFault
    return (
        f("S1", "flat_in", "kind", "None", error="TypeError", words=("flat_in",)),
        f("S1", "pool_out", "kind", "ndarray", error="TypeError", words=("pool_out",)),
        f("S2", "flat_in", "shape", "2-D"),
        f("S3", "offsets", "shape", "2-D"),
        f("S4", "req_pool_indices", "shape", "2-D"),
        f("S5", "pool_out", "shape", "1-D"),
        f("S6", "flat_in", "dtype", "int32", error="TypeError"),
        f("S6", "offsets", "dtype", "int32", error="TypeError"),
        f("S6", "req_pool_indices", "dtype", "int32", error="TypeError"),
        f("S6", "pool_out", "dtype", "int64", error="TypeError"),
        f("S7", "offsets", "shape", "longer"),
        f("S8", "req_pool_indices", "rows", MAX_PLAN_REQS + 1),
        f("S9", "pool_out", "strided", words=("pool_out",)),
        f("S9", "flat_in", "strided", words=("flat_in",)),
        f("S9", "offsets", "device", "meta", words=("offsets",)),
        f("S10", "offsets", "set", 1, index=0, words=("offsets",)),
        f("S10", "offsets", "set", 4, index=2, words=("offsets",)),
        f("S10", "offsets", "set", 13, index=3, words=("offsets",)),
        f("S11", "req_pool_indices", "set", 4, index=2, error="IndexError",
          words=("req_pool_indices[2]", "4")),
        f("S11", "req_pool_indices", "set", -1, index=0, error="IndexError",
          words=("req_pool_indices[0]", "-1")),
    )  # fmt: skip
