"""engine_model.engine: the engine model keeps an engine's invariants over any history (no slot
owned twice, page 0 and slot 0 never handed out, a page table that names what each request
wrote), its steps produce launches the reference accepts, its faults are made where the next
step can see them, and the same calls give the same arrays."""

from __future__ import annotations

import dataclasses
from collections import Counter

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

from conformance.engine_support import TAGS, OracleRun, inject_and_settle, missing, settle, warm_up
from engine_model import FULL, SWA, Engine, EngineConfig, Forward, faults
from engine_model.faults import FAULT_KINDS, Due, tags
from reference import FailReason, RealKvHashMode, ViolationField
from strategies.engines import engine_configs

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ("admit", "prefill", "decode", "finish", "retract", "readmit", "sweep")
            + ("relocate", "backup", "restore", "receive", "twin", "insert", "draft_extend")
        ),
        st.integers(0, 9),
        st.integers(0, 3),
    ),
    max_size=40,
)


def step(engine: Engine, op: str, a: int, b: int):
    if op == "admit":
        return engine.admit(a + 1, b)
    if op == "prefill":
        return engine.prefill(a + 1)
    if op == "decode":
        return engine.decode(b)
    if op == "sweep":
        return engine.sweep()
    if op == "receive":
        return engine.receive(a + 1)
    if op == "draft_extend":
        return engine.draft_extend(b + 1)
    if op == "twin":
        return engine.admit_twin(a, b + 1)
    return getattr(engine, op)(a)


def check_invariants(engine: Engine) -> None:
    c = engine.config
    owner: dict[int, int] = {}
    for req in engine.running.values():
        assert 0 < req.row < c.pool_rows
        assert all(t != 0 for t in req.tokens)
        assert len(req.tokens) <= c.context_len + c.offset
        for pos in range(req.written):
            full = engine.full_slot(req, pos)
            assert full // c.page_size != 0, "page 0 handed out"
            assert engine.req_to_token[req.row, pos] == full, (req.rid, pos)
            page = full // c.page_size
            assert engine.req_refs[page] >= 1 and page not in engine.free_pages
            if engine.cache_refs[page] == 0 and engine.req_refs[page] == 1:  # unshared: one owner
                assert owner.setdefault(full, req.rid) == req.rid, f"slot {full} owned twice"
    rows = [r.row for r in engine.running.values()]
    assert len(rows) == len(set(rows)) and not set(rows) & set(engine.free_rows)
    # every reference is counted once: a request's pages, the cache's paths
    held = Counter(page for r in engine.running.values() for page in r.pages)
    cached = Counter(page for e in engine.cache for page in set(e.pages))
    for page in range(c.num_pages):
        assert engine.req_refs[page] == held[page], f"page {page}: request refs"
        assert engine.cache_refs[page] == cached[page], f"page {page}: cache refs"
        assert (page in engine.free_pages) == (not held[page] and not cached[page]) or page == 0
    if engine.lut is not None:
        p = c.page_size
        mapped = engine.lut[engine.lut != 0]
        free = engine.swa_allocator.order()
        assert len(mapped) == len(set(mapped.tolist())), "an SWA slot mapped twice"
        assert not set((mapped // p).tolist()) & set(free), "a mapped SWA page is free"
        assert 0 not in free
        swa_pages = c.group_slots(SWA) // p
        assert len(mapped) + len(free) * p == (swa_pages - 1) * p, "an SWA page lost"
        assert (engine.lut < swa_pages * p).all(), "an SWA slot past the SWA pool"
        # whole pages, as SGLang's SWA allocator pages the two pools in step: a full page's
        # slots all map to one SWA page, slot k to its slot k, or none does
        for page in range(c.num_pages):
            row = engine.lut[page * p : (page + 1) * p]
            assert not row.any() or (row == row[0] + np.arange(p)).all() and row[0] % p == 0, (
                f"page {page}: SWA slots {row.tolist()}"
            )


def check_forward(engine: Engine, forward: Forward) -> None:
    c = engine.config
    assert [g.group for g in forward.groups] == list(c.groups)
    assert forward.stages == ("HEAD", "TAIL")
    for group in forward.groups:
        slots = group.out_cache_loc
        assert slots.shape == forward.write["input_ids"].shape
        assert len(set(slots.tolist())) == slots.shape[0], "a step writes one slot twice"
        assert ((slots > 0) & (slots < c.group_slots(group.group))).all()
        assert (group.kv_bytes != 0).all()
        assert len({bytes(row) for row in group.kv_bytes}) == group.kv_bytes.shape[0]
        assert (group.swa_window_size, group.full_to_swa_index_mapping is None) == (
            (c.swa_window, False) if group.group == SWA else (0, True)
        )
    if c.swa_window:  # the SWA group writes the SWA slots of the full slots the FULL group writes
        full, swa = forward.group(FULL).out_cache_loc, forward.group(SWA).out_cache_loc
        assert np.array_equal(forward.group(SWA).full_to_swa_index_mapping[full], swa)
    assert (forward.write["input_ids"] != 0).all()
    rows = forward.plan["req_pool_indices"]  # each token's row: a live row's extend tokens
    counts = np.bincount(forward.token_rows, minlength=rows.shape[0])
    live = rows != 0
    assert np.array_equal(counts[live], forward.plan["extend_seq_lens"][live])
    assert forward.token_rows.shape == forward.write["positions"].shape
    offsets = forward.scatter["offsets"]
    assert offsets[-1] == forward.scatter["flat_in"].shape[0]


@settings(max_examples=150, deadline=None)
@given(config=engine_configs(), ops=OPS)
def test_any_history_keeps_the_engine_invariants_and_is_silent(config, ops):
    engine = Engine(config)
    oracle = OracleRun(engine)
    for op, a, b in ops:
        out = step(engine, op, a, b)
        for one in out if isinstance(out, list) else [out]:
            if isinstance(one, Forward):
                check_forward(engine, one)
            if one is not None and not isinstance(one, (int, str)):
                oracle.forward_or_sweep(one)  # the reference accepts every launch
        check_invariants(engine)
        if engine.peer is not None:
            check_invariants(engine.peer)
    assert oracle.silence_problem() == ""


@settings(max_examples=40, deadline=None)
@given(config=engine_configs(min_slots=48), ops=OPS)
def test_the_same_calls_give_the_same_arrays(config, ops):
    runs = []
    for _ in range(2):
        engine = Engine(config)
        arrays = []
        for op, a, b in ops:
            out = step(engine, op, a, b)
            if isinstance(out, Forward):
                arrays += [out.plan["req_to_token"]] + [
                    a for g in out.groups for a in (g.out_cache_loc, g.kv_bytes)
                ]
        runs.append(arrays)
    assert len(runs[0]) == len(runs[1])
    assert all(np.array_equal(x, y) for x, y in zip(*runs))


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_every_fault_has_a_place_after_the_warm_up(kind):
    config = EngineConfig(
        page_size=2, num_pages=32, pool_rows=6, context_len=16, mode=RealKvHashMode.ALL, seed=5
    )
    engine = Engine(config)
    warm_up(engine, OracleRun(engine).forward_or_sweep)
    fault = faults.make(engine, kind, pick=3, byte=7)
    assert fault is not None and fault.kind == kind
    # a place: slots or entries, or the next forward (a fault of the forward itself)
    assert fault.slots or fault.entries or engine.hooks.positions_fault or engine.hooks.accept_fault


def _a_twin_after_the_warm_up():
    """An engine after the warm-up with a request admitted with its first cached prefix's tokens
    (computed again): ``(engine, oracle, that prefix, the request's id)``."""
    config = EngineConfig(
        page_size=2, num_pages=32, pool_rows=6, context_len=16, mode=RealKvHashMode.ALL, seed=9
    )
    engine = Engine(config)
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    entry = engine.cache[0]
    return engine, oracle, entry, engine.admit_twin(0, 1, entry=entry)


def test_an_insert_rebinds_a_row_that_computed_a_cached_prefix_again():
    """A request admitted with a cached prefix's tokens computes them again into pages of its
    own; its insert rebinds its row to the cache's pages and frees its own (the duplicates),
    and the canary stays silent over the rest of the history."""
    engine, oracle, entry, rid = _a_twin_after_the_warm_up()
    oracle.forward_or_sweep(engine.prefill(16, insert=False))
    req = engine.running[rid]
    own = list(req.pages[: len(entry.pages)])
    assert not set(own) & set(entry.pages)
    engine.insert(0, rid=rid)
    assert req.pages[: len(entry.pages)] == list(entry.pages)
    p = engine.config.page_size
    for pos in range(entry.length):
        assert engine.req_to_token[req.row, pos] == entry.pages[pos // p] * p + pos % p
    assert set(own) <= set(engine.free_pages), "the duplicates are freed"
    assert engine.events["an insert rebound a row to the cache's pages"] == 1
    check_invariants(engine)
    settle(engine, oracle.forward_or_sweep)
    check_invariants(engine)
    assert oracle.silence_problem() == ""


def test_a_prefill_inserts_what_it_wrote_as_sglang_s_scheduler_does():
    """After an extend forward each prompt row's written prefix is in the prefix cache (SGLang's
    ``cache_unfinished_req`` after every chunk), a row that computed a cached prefix again
    rebound to the cache's pages; a retraction then caches nothing new."""
    engine, oracle, entry, rid = _a_twin_after_the_warm_up()
    before = engine.events["a prefill inserted into the prefix cache"]
    oracle.forward_or_sweep(engine.prefill(3))  # a first chunk
    req = engine.running[rid]
    assert engine.events["a prefill inserted into the prefix cache"] > before
    assert req.pages[:1] == list(entry.pages[:1]), "the chunk's page rebound to the cache's"
    oracle.forward_or_sweep(engine.prefill(16))  # the rest
    assert req.pages[: len(entry.pages)] == list(entry.pages)
    cached = [(e.tokens, e.pages, e.length) for e in engine.cache]
    assert engine.retract(0) is not None
    assert [(e.tokens, e.pages, e.length) for e in engine.cache] == cached
    check_invariants(engine)
    settle(engine, oracle.forward_or_sweep)
    check_invariants(engine)
    assert oracle.silence_problem() == ""


def test_a_draft_extend_expects_the_oracles_tokens_so_its_input_assert_can_fire():
    """The draft model's draft extend (``DRAFT_EXTEND_V2``) writes the accepted tokens' positions
    with the token oracle's expected inputs and the input assert on: silent over a correct
    history, and a sampled token swapped before it is reported by each ``HEAD`` and ``TAIL``
    write with ``WRITE_TOKEN``."""
    config = EngineConfig(
        page_size=2, num_pages=32, pool_rows=6, context_len=16, offset=1,
        mode=RealKvHashMode.ALL, seed=3,
    )  # fmt: skip
    for swap in (False, True):
        engine = Engine(config)
        oracle = OracleRun(engine)
        warm_up(engine, oracle.forward_or_sweep)
        if swap:
            assert faults.make(engine, "next_token_swap", 0) is not None
        forward = engine.draft_extend(3)
        assert forward is not None and forward.mode == "DRAFT_EXTEND_V2"
        assert forward.write["enable_write_input_assert"]
        rows = forward.plan["req_pool_indices"]
        assert (forward.plan["extend_seq_lens"][rows != 0] == 3).all()
        since = oracle.index
        oracle.forward_or_sweep(forward)
        reported = oracle.rows(since)
        if not swap:
            assert not len(reported)
            continue
        stamped = {
            int(r[ViolationField.KERNEL_KIND])
            for r in reported
            if int(r[ViolationField.FAIL_REASON_BITS]) & int(FailReason.WRITE_TOKEN_MISMATCH)
        }
        assert stamped == set(tags(FULL, "HEAD", "TAIL")), stamped


def test_a_target_verify_replaying_a_graph_pads_its_tail_as_the_runner_does():
    """A target verify that replays a CUDA graph puts its padding rows at the tail, each with
    the draft count of tokens at position 0 and slot 0 (the runner pads ``bs *
    num_tokens_per_bs`` tokens), one extend length for every row, a verify capacity fixed by its
    batch size; it is counted as its own situation, and the reference runs it silently; outside
    a graph a target verify has no padding rows."""
    config = EngineConfig(
        page_size=2, num_pages=32, pool_rows=6, context_len=16, mode=RealKvHashMode.ALL, seed=5,
    )  # fmt: skip
    engine = Engine(config)
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    with pytest.raises(ValueError, match="only when it replays a graph"):
        engine.target_verify(3, 0, pad=1)
    forward = engine.target_verify(3, 0, pad=2, graph=True)
    assert forward is not None and forward.graph and forward.mode == "TARGET_VERIFY"
    rows = np.asarray(forward.plan["req_pool_indices"])
    live = int((rows != 0).sum())
    assert live and rows[live:].tolist() == [0, 0] and (rows[:live] != 0).all()
    assert forward.token_rows[-6:].tolist() == [live] * 3 + [live + 1] * 3
    assert forward.write["positions"][-6:].tolist() == [0] * 6
    assert forward.group(FULL).out_cache_loc[-6:].tolist() == [0] * 6
    assert (np.asarray(forward.plan["extend_seq_lens"]) == 3).all()
    assert forward.group(FULL).verify_capacity == (live + 2) * config.context_len
    assert engine.events["forward TARGET_VERIFY replaying a graph"] == 1
    since = oracle.index
    oracle.forward_or_sweep(forward)
    assert oracle.index == since


def test_a_fault_without_a_place_is_none():
    engine = Engine(EngineConfig())
    transfers = ("transfer_page_left_out", "transfer_pages_swapped")
    for kind in set(FAULT_KINDS) - set(transfers):
        assert faults.make(engine, kind, 0, 0) is None
    # a transfer's place is a free row and free pages for the request it receives
    while engine.free_rows:
        engine._take_row()
    for kind in transfers:
        assert faults.make(engine, kind, 0, 0) is None
    with pytest.raises(ValueError, match="unknown fault"):
        faults.make(engine, "bit_flip", 0, 0)


@pytest.mark.parametrize(
    "bad",
    [
        dict(page_size=0),
        dict(num_pages=1),
        dict(offset=2),
        dict(mode=3),
        dict(swa_window=-1),
        dict(swa_window=3, swa_slots=1),
        dict(swa_window=3, num_pages=4, swa_slots=5),
    ],
)
def test_a_config_out_of_range_is_refused(bad):
    with pytest.raises(Exception, match="page_size|num_pages|offset|swa_window|swa_slots"):
        EngineConfig(**bad)


def test_a_recycled_row_keeps_its_old_owners_tail():
    engine = Engine(EngineConfig(page_size=1, num_pages=32, pool_rows=2, context_len=12))
    engine.admit(10)
    engine.prefill(12)
    tail = engine.req_to_token[1, 2:9].copy()
    engine.finish(0)
    engine.admit(3)
    engine.prefill(12)
    assert np.array_equal(engine.req_to_token[1, 3:9], tail[1:]), "the stale tail was cleared"


def _a_freed_page_shared_in_one_decode(engine: Engine) -> list[Forward]:
    """Request A holds positions 0..8 (its third page: 8..11) when that page is freed while in
    use; request B's prompt of 4 takes it, so B's last prompt slot is the slot of A's position
    11. A decodes 9 and 10 first, B prefills, then one decode would have A write position 11
    and B seed its position 4 from that very slot."""
    a = engine.admit(9)
    forwards = [engine.prefill(9)]
    fault = next(
        f
        for pick in range(8)
        if (f := faults.make(engine, "freed_while_referenced", pick, 0)) is not None
        and f"request {a} positions 8..11" in f.what
    )
    assert fault is not None
    b = engine.admit(4)
    forwards += [engine.decode(), engine.decode(), engine.prefill(4), engine.decode()]
    assert b is not None and all(f is not None for f in forwards)
    return forwards


def _races_of(engine: Engine, forwards: list[Forward]) -> list[str]:
    from conformance.driver import write_races

    oracle = OracleRun(engine)
    return [
        race
        for forward in forwards
        for group in forward.groups
        for race in write_races(oracle.plan(forward, group)[1], group.out_cache_loc)
    ]


def test_a_forward_never_makes_a_write_whose_requests_race(monkeypatch):
    """CONTRACT §6: a write in which a request seeds from a slot another request writes has no
    defined result (on a GPU the writes race). A page freed while in use can bring two running
    requests there; the engine then runs one of them a forward later, and the driver's check
    (``write_races``) stays silent. Without the engine's guard the driver's check fires."""
    config = EngineConfig(page_size=4, num_pages=16, pool_rows=4, context_len=16, seed=3)
    engine = Engine(config)
    forwards = _a_freed_page_shared_in_one_decode(engine)
    assert _races_of(engine, forwards) == []
    assert forwards[-1].write["input_ids"].shape[0] == 1, "one of the two waits"

    monkeypatch.setattr(Engine, "_writes_and_seed", lambda self, req, e, group: (set(), set()))
    unguarded = Engine(config)
    forwards = _a_freed_page_shared_in_one_decode(unguarded)
    races = _races_of(unguarded, forwards)
    assert len(races) == 1 and "seeds from slot" in races[0], races


def test_the_driver_names_each_race_of_a_write():
    """``write_races``: a slot two requests write, a seed another request writes; a request
    that writes nothing, a skipped entry (slot < 0) and a seed the request itself writes race
    with nothing."""
    from conformance.driver import write_races
    from reference import WritePlan

    plan = WritePlan(
        write_offsets=np.array([0, 2, 3, 3, 4, 5], np.int64),
        write_seed_slot_indices=np.array([-1, 6, 8, 3, 7], np.int64),
        write_num_valid_reqs=np.array([5], np.int32),
    )
    slots = np.array([5, 6, 5, -1, 7], np.int64)
    assert write_races(plan, slots) == [
        "slot 5 written by requests 0 and 1",
        "request 1 seeds from slot 6, which request 0 writes",
    ]
    plan.write_num_valid_reqs[0] = 1
    assert write_races(plan, slots) == []


def test_each_warm_up_step_runs_under_its_own_label():
    """The histories label a failing launch with the engine's step count and last log line
    when it runs: in the warm-up each forward is made just before it runs, so a prefill that
    fails is named as that prefill, not as the decode made after it."""
    engine = Engine(EngineConfig(page_size=2, num_pages=32, pool_rows=6, context_len=16, seed=5))
    oracle = OracleRun(engine)
    labels = []

    def run(step):
        labels.append((step.kind, engine.steps, engine.log[-1]))
        oracle.forward_or_sweep(step)

    warm_up(engine, run)
    assert [kind for kind, _, _ in labels] == [
        "prefill", "decode", "target_verify", "prefill", "decode"
    ]  # fmt: skip
    for kind, _, line in labels:
        assert line.startswith(f"{kind}: "), (kind, line)
    assert [steps for _, steps, _ in labels] == [1, 2, 3, 4, 5]


WINDOWED = EngineConfig(
    page_size=2, num_pages=32, pool_rows=6, context_len=16, swa_window=5, swa_slots=40, seed=5
)


def _settled(kind: str, group: str):
    """A fault of ``kind`` made in ``group`` after the warm-up of a windowed engine, settled on
    the reference: ``(fault, problems, rows stored since the fault)``."""
    for pick in range(64):
        engine = Engine(WINDOWED)
        oracle = OracleRun(engine)
        warm_up(engine, oracle.forward_or_sweep)
        made = inject_and_settle(engine, oracle, kind, pick, 3, oracle.forward_or_sweep)
        if made is not None and made[0].group == group:
            return made[0], made[1], oracle.rows(0)
    raise AssertionError(f"no place for {kind} in {group}")


def test_a_kv_byte_changed_in_the_swa_pool_is_reported_by_the_swa_tail_alone():
    """A forward is bracketed per group: the HEAD launches read no KV, so a KV byte changed in
    the SWA pool is reported by TAIL_K_SWA (or its sweep) at the SWA slot, and a prediction
    that named a HEAD launch or the FULL group would fail."""
    fault, problems, rows = _settled("kv_used", SWA)
    assert problems == []
    _, slot, _ = fault.flip
    kinds = {int(r[ViolationField.KERNEL_KIND]) for r in rows}
    assert kinds and kinds <= set(tags(SWA, "TAIL", "SWEEP")), kinds
    assert {int(r[ViolationField.SLOT_IDX]) for r in rows} == {slot}
    for wrong in (tags(SWA, "HEAD"), tags(FULL, "TAIL")):
        assert missing(
            [Due(slot, FailReason.VERIFY_REAL_KV_HASH_MISMATCH, tags=wrong)], rows, fault
        )


def test_a_page_table_fault_under_a_window_is_promised_of_both_full_launches():
    """The FULL group reads every position of a running request: a changed page-table entry is
    promised of its HEAD and its TAIL verify even under a window, each with the bits its own
    buffer's records give."""
    engine = Engine(WINDOWED)
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    fault = faults.make(engine, "req_to_token", 5, 0)
    assert fault is not None
    dues, silent = faults.FAULTS["req_to_token"].due(engine, fault, oracle.buffers())
    assert not silent
    assert {t for d in dues for t in d.tags} == set(tags(FULL, "HEAD", "TAIL"))
    since = oracle.index
    settle(engine, oracle.forward_or_sweep)
    assert missing(dues, oracle.rows(since), fault) == []


def test_every_endpoint_stamps_its_own_tag_and_counts_its_own_launches():
    """One ring for all endpoints; each launch stamps its endpoint's tag and counts in its
    endpoint's counters: after a forward and a sweep of a windowed engine the HEAD and TAIL
    endpoints of both groups counted one launch per forward (a verify and a write each), the
    sweeps one each."""
    engine = Engine(WINDOWED)
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    sweep = engine.sweep()
    assert sweep is not None and [g.group for g in sweep.groups] == [FULL, SWA]
    oracle.forward_or_sweep(sweep)
    counts = {key: int(s.kernel_run_counter[0]) for key, s in oracle.states.items()}
    forwards = engine.steps - 1
    for group in (FULL, SWA):
        assert counts[(group, "HEAD")] == counts[(group, "TAIL")] == 2 * forwards, counts
        assert counts[(group, "SWEEP")] == 1
    assert {int(s.kernel_kind) for s in oracle.states.values()} == set(TAGS.values())
    assert oracle.index == 0


def test_a_small_swa_pool_evicts_cached_windows_under_pressure():
    """With an SWA pool a fraction of the full pool, allocation takes the SWA slots of cached
    positions no request uses, and the engine keeps its invariants (no SWA slot lost or mapped
    twice)."""
    config = dataclasses.replace(WINDOWED, swa_slots=22)
    engine = Engine(config)
    oracle = OracleRun(engine)
    for _ in range(6):
        engine.admit(12)
        for step in (engine.prefill(16), engine.decode(), engine.sweep()):
            if step is not None:
                oracle.forward_or_sweep(step)
        engine.finish(0)
        check_invariants(engine)
    assert engine.events["swa slot of a cached position evicted under pressure"] > 0
    assert oracle.index == 0


def test_the_invariants_catch_an_swa_page_out_of_step():
    """Able to fail: a full page whose slots map to SWA slots of two pages (the engine's old
    slot-by-slot SWA pool) breaks the whole-page invariant."""
    config = EngineConfig(page_size=2, num_pages=16, pool_rows=4, context_len=12, swa_window=3,
                          swa_slots=24, seed=3)  # fmt: skip
    engine = Engine(config)
    engine.admit(6, 0)
    engine.prefill(6)
    check_invariants(engine)
    req = next(iter(engine.running.values()))
    first, second = engine.full_slot(req, 4), engine.full_slot(req, 5)
    engine.lut[first], engine.lut[second] = engine.lut[second], engine.lut[first]
    with pytest.raises(AssertionError, match="SWA slots"):
        check_invariants(engine)
