"""The per-forward leg (conformance.sglang_manager, its parts in conformance.sglang): SGLang's
per-forward runtime (SingleForwardManager, its launches, the expected-token scatter, the sweep
orchestrator) equals the reference after every step of an engine history, the leg fails where
SGLang's side is given a different forward, a fault made through it is reported alike, the
batch stand-in provides every field the runtime reads, and the CPU stand-ins of torch are put
back."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch

import reference
from conformance import upstream
from conformance.engine_support import BITS, SLOT
from conformance.sglang import fired, histories, loading, manager_run, standins, trials
from engine_model import Engine
from tests.suite.test_sglang_runtime import read_attributes


@pytest.mark.parametrize("index", [3, 9])  # no window and no offset; a window and the offset
def test_a_correct_history_is_equal_after_every_step(index):
    side = manager_run.run_history(index, steps=25)
    forwards = sum(n for label, n in side.step_counts.items() if label != "SWEEP")
    assert forwards >= 10, side.step_counts
    assert not side.not_managed, side.not_managed


def test_the_leg_fails_where_sglang_is_given_another_forward(monkeypatch):
    real = manager_run.manager_batches

    def swapped(forward, mods):  # two tokens' slots exchanged in the batch SGLang sees
        outside, inside = real(forward, mods)
        loc = inside.out_cache_loc.clone()
        if loc.shape[0] >= 2:
            loc[[0, 1]] = loc[[1, 0]]
        return outside, dataclasses.replace(inside, out_cache_loc=loc)

    monkeypatch.setattr(manager_run, "manager_batches", swapped)
    with pytest.raises(AssertionError, match="canary buffer differs"):
        manager_run.run_history(3, steps=25)


def test_a_fault_through_sglangs_runtime_is_reported_as_the_reference_reports_it():
    outcome, problems, side = trials.fault_trial("page_swap", 0, "DECODE")
    assert (outcome, problems) == ("reported", [])
    assert sum(side.fired.values()) > 0


def test_the_batch_stand_in_provides_every_field_the_runtime_reads():
    read = set()
    for module in (
        "single_forward_manager/manager.py",
        "runner/kernel_launcher.py",
        "req_to_expected_token_ids_manager.py",
    ):
        read |= read_attributes("forward_batch", module)
        read |= read_attributes("maybe_inaccurate_forward_batch", module)
    fields = {f.name for f in dataclasses.fields(standins.ManagerBatchStandIn)}
    assert read <= fields, read - fields


def test_the_reports_left_out_are_only_those_of_divergence_20():
    loading.manager_modules()
    engine = Engine(histories.engine_config(6))  # the offset 1
    forwards = [*histories.history(6, engine=engine)]
    extend = next(f for f in forwards if f.mode == "DRAFT_EXTEND_V2")
    decode = next(f for f in forwards if f.mode == "DECODE" and f.kind == "decode")
    slot = int(extend.groups[0].out_cache_loc[0])
    rows = np.zeros((3, 8), dtype=np.int64)
    rows[:, SLOT] = slot
    rows[:, BITS] = [8, 8 | 1, 16]
    assert manager_run.draft_extend_reports(engine, extend, rows).tolist() == [True, False, False]
    assert not manager_run.draft_extend_reports(engine, decode, rows).any()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the stand-ins apply without CUDA only")
def test_the_cpu_stand_ins_of_torch_are_put_back():
    with loading.cpu_only():
        assert torch.zeros(2, pin_memory=True).tolist() == [0, 0]
        assert torch.cuda.is_current_stream_capturing() is False
    with pytest.raises(RuntimeError):
        torch.zeros(2, pin_memory=True)


def test_sglangs_violation_reporter_must_log_every_row_of_its_ring():
    outcome, problems, side = trials.fault_trial("page_swap", 0, "DECODE")
    assert problems == [] and side.logged, problems
    side.logged[:] = side.logged[1:]  # one row's message lost
    assert manager_run.logged_problems(side), "a lost message must fail the trial"


def test_a_flipped_cached_byte_is_reported_by_a_sharing_extend_through_sglang():
    """Among the shared-prefix trials a one-trial run of the leg makes, some share the flipped
    slot and report it (others share a prefix that does not hold it, or have no unused cached
    slot to flip)."""
    from conformance.sglang_manager import SHARED_PREFIX_TRIALS

    real_kv = int(reference.FailReason.VERIFY_REAL_KV_HASH_MISMATCH)
    fired = [trials.shared_prefix_trial(i).fired for i in range(SHARED_PREFIX_TRIALS)]
    assert any(m == "EXTEND" and b & real_kv for f in fired for m, _, b in f), fired


def test_divergence_20_is_expected_on_every_listed_release():
    assert upstream.reproduces_on(20, upstream.installed_version()) in (True, None)


def test_the_leg_compares_sglangs_plans_with_the_references(monkeypatch):
    mods = loading.manager_modules()
    real = mods.manager.invoke_plan

    def off_by_one(**kwargs):  # SGLang's plan, then one seed changed
        real(**kwargs)
        kwargs["write_plan"].write_seed_slot_indices[0] += 1

    monkeypatch.setattr(mods.manager, "invoke_plan", off_by_one)
    with pytest.raises(AssertionError, match="write_seed_slot_indices"):
        manager_run.run_history(3, steps=25)


def test_the_readmes_table_of_fired_checks_is_read_and_compared_both_ways():
    """The leg holds the README's table to its run: a cell that says a check cannot fire is
    one that never fired, and the other way round (the leg reports each difference)."""
    release, cannot = fired.readme_never_cells()
    assert release.count(".") >= 2, release
    assert ("TOKEN", "SWEEP") in cannot and ("CHAIN", "DECODE") not in cannot
    assert ("WRITE_TOKEN", "DECODE of the draft model") in cannot  # the header's "draft DECODE"
    chain, token = int(fired.CHECKS["CHAIN"]), int(fired.CHECKS["TOKEN"])
    reports = Counter({("DECODE", 0, chain | token): 2, ("SWEEP", 0, chain): 1})
    never = {cell for cell, n in fired.fired_counts(reports).items() if n == 0}
    assert ("TOKEN", "SWEEP") in never and ("REAL_KV", "DECODE") in never
    assert ("CHAIN", "DECODE") not in never and ("TOKEN", "DECODE") not in never
    assert fired.table_problems(reports, never) == []
    # a cell said to fire that never did, and one said not to fire that did
    wrong = (never - {("REAL_KV", "DECODE")}) | {("CHAIN", "DECODE")}
    assert fired.table_problems(reports, wrong) == [
        "REAL_KV never fired in DECODE, which the README says it does",
        "CHAIN fired in DECODE, which the README says it cannot",
    ]
    assert "| TOKEN | 2 | never |" in fired.fired_table(reports)


def _pool_and_request_fields(monkeypatch) -> tuple[set, list, set, list]:
    """What SGLang's manager reads of its request pool and ``compute_req_all_ids_info`` of
    each request (read from the installed source), and the fields of the leg's stand-ins of
    ``ReqToTokenPool`` and ``Req`` as a history runs them."""
    module = "single_forward_manager/manager.py"
    pool_read = read_attributes("_req_to_token_pool", module) | read_attributes(
        "req_to_token_pool", module
    )
    req_read = read_attributes("req", "req_to_expected_token_ids_manager.py")
    mods = loading.manager_modules()
    real, seen = mods.scatter.compute_req_all_ids_info, []

    def spy(reqs):
        seen.extend(set(vars(r)) for r in reqs)
        return real(reqs)

    monkeypatch.setattr(mods.scatter, "compute_req_all_ids_info", spy)
    side = manager_run.run_history(0, steps=10)
    pools = [set(vars(m._req_to_token_pool)) for m in side.managers.values()]
    return pool_read, pools, req_read, seen


def test_the_pool_and_request_stand_ins_provide_what_the_runtime_reads(monkeypatch):
    """Of the request pool it is given, the manager reads ``req_to_token`` alone, and of each
    request ``compute_req_all_ids_info`` reads ``origin_input_ids`` and ``output_ids``: the
    leg's stand-ins of ``ReqToTokenPool`` and ``Req`` hold those fields."""
    pool_read, pools, req_read, seen = _pool_and_request_fields(monkeypatch)
    assert pool_read and pools and all(pool_read <= pool for pool in pools), (pool_read, pools)
    assert req_read and seen and all(req_read <= fields for fields in seen), (req_read, seen[:1])
