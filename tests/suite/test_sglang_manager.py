"""The per-forward leg (conformance.sglang_manager, its parts in conformance.sglang): SGLang's
per-forward runtime (SingleForwardManager, its launches, the expected-token scatter, the sweep
orchestrator) equals the reference after every step of an engine history, the leg fails where
SGLang's side is given a different forward, a fault made through it is reported alike, the
batch stand-in provides every field the runtime reads, and the CPU stand-ins of torch are put
back."""

from __future__ import annotations

import ast
import dataclasses
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from triton.runtime.errors import InterpreterError

import reference
from conformance import upstream
from conformance.engine_support import BITS, SLOT
from conformance.sglang import fired, histories, loading, manager_run, standins, trials, wiring
from engine_model import Engine
from engine_model.vocabulary import IDLE
from tests.suite.test_sglang_runtime import read_attributes


@pytest.mark.parametrize("index", [3, 9])  # no window and no offset; a window and the offset
def test_a_correct_history_is_equal_after_every_step(index):
    side = manager_run.run_history(index, steps=25)
    if side.cannot_start is not None:  # [28]: such a server does not start on this release
        assert upstream.reproduces_on(side.cannot_start.tag, upstream.installed_version())
        assert side.cannot_start.mode == "DRAFT_EXTEND_V2"
        return
    forwards = sum(n for label, n in side.step_counts.items() if label != "SWEEP")
    assert forwards >= 10, side.step_counts
    assert not side.not_managed, side.not_managed


@pytest.mark.parametrize("listed", [True, False])
def test_a_capture_stops_a_history_only_where_divergence_28_says_it_raises(monkeypatch, listed):
    """A draft extend graph's capture that raises ``AttributeError`` stops the history as a
    server that cannot start where [28] reproduces on the release, and fails the leg elsewhere."""

    def raising(run, manager, *args):
        if args[-1] == "DRAFT_EXTEND_V2":
            raise AttributeError("'NoneType' object has no attribute 'shape'")
        return capture(run, manager, *args)

    capture = manager_run.graphs.capture
    monkeypatch.setattr(manager_run.graphs, "capture", raising)
    monkeypatch.setattr(upstream, "reproduces_on", lambda tag, version: listed and tag == 28)
    if not listed:
        with pytest.raises(AttributeError):
            manager_run.run_history(9, steps=25)
        return
    side = manager_run.run_history(9, steps=25)
    assert side.cannot_start is not None and side.cannot_start.tag == 28


@pytest.mark.parametrize("index", [0, 6])  # the target model's engine; the draft model's
def test_an_eager_idle_step_changes_nothing_in_sglang_s_canary(monkeypatch, index):
    """Why the leg runs no eager idle step (``ManagerRun.idle_not_laid_out``): SGLang's canary
    given a batch of no row, by a manager of one row's capacity (SGLang's managers hold its
    largest batch), runs every launch and changes no canary record, ring row or counter of a
    slot. Able to fail: the same manager given the live batch of a decode changes them."""
    engine, reference_run, side = manager_run.sides(wiring.servable(histories.engine_config(index)))
    engine.admit(3)
    side.run(reference_run, engine.prefill(8))
    real_key = side.key
    monkeypatch.setattr(side, "key", lambda f: (*real_key(f)[:1], 1, 1, real_key(f)[3]))

    def state():
        return [
            t.clone()
            for w in side.worlds.values()
            for t in (w.canary_buf, w.violation_ring, w.violation_write_index, w.slot_run_counter)
        ]

    before = state()
    idle = engine._forward("idle", [], pad=0, forward_mode=IDLE, graph=False)
    assert idle is not None and len(idle.token_rows) == 0
    assert side.forward(idle) is idle  # SGLang's manager ran it
    assert all(torch.equal(a, b) for a, b in zip(before, state(), strict=True))
    decode = engine.decode(0)
    assert decode is not None and side.forward(decode) is decode
    assert not all(torch.equal(a, b) for a, b in zip(before, state(), strict=True))


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


def test_cpu_only_stands_in_for_each_call_of_the_runtime_that_a_cpu_build_cannot_make():
    """The calls of ``torch.cuda`` and the pinned factories in the source of SGLang's modules the
    leg runs are among those :func:`loading.cpu_only` stands in for (the releases up to 0.5.20
    call four of ``torch.cuda``'s; later ones none), and it stands in for no factory the source
    does not pin. Able to fail: a call it does not cover is named."""
    cuda, pinned = loading.torch_device_calls(loading.runtime_sources())
    assert cuda <= set(loading.CPU_CUDA_CALLS), cuda - set(loading.CPU_CUDA_CALLS)
    stood_in = {*loading.UNPINNED_FACTORIES, loading.UNPINNED_METHOD}
    assert pinned == stood_in, pinned ^ stood_in
    more = (
        "import torch\nx: torch.cuda.Stream\ntorch.cuda.synchronize()\n"
        "torch.ones(2, pin_memory=True)\ntorch.zeros(2, pin_memory=False)\n"
    )
    assert loading.torch_device_calls([more]) == ({"synchronize"}, {"ones"})


def test_the_phase_checker_s_kernel_asserts_as_its_decorator_says(monkeypatch, capfd):
    """``DebugKernel`` launches SGLang's phase checker kernel with the ``debug`` of its own
    ``@triton.jit`` (read from the source): a phase mismatch raises, as on a GPU; launched as a
    kernel compiled without debug, the same mismatch passes with the phase stored, so the
    stand-in adds no check the decorator did not ask for."""
    mods = loading.manager_modules()
    source = (loading.sglang_root() / "srt" / "utils" / "phase_checker.py").read_text()
    node = next(
        n for n in ast.parse(source).body
        if isinstance(n, ast.FunctionDef) and n.name == "_phase_check_kernel"
    )  # fmt: skip
    declared = [
        ast.literal_eval(k.value)
        for d in node.decorator_list if isinstance(d, ast.Call)
        for k in d.keywords if k.arg == "debug"
    ]  # fmt: skip
    kernel = mods.phase._phase_check_kernel
    assert isinstance(kernel, loading.DebugKernel) and [kernel.debug] == declared == [True]
    with loading.cpu_only():  # up to 0.5.20 the checker asks torch.cuda
        checker = mods.phase.SimplePhaseChecker(initial_phase=1, device=torch.device("cpu"))
        checker.enable_assert()
        checker.update(expect_phase=1, next_phase=2)
        with pytest.raises(InterpreterError, match="AssertionError.*phase mismatch"):
            checker.update(expect_phase=1, next_phase=3)
        monkeypatch.setattr(
            mods.phase, "_phase_check_kernel", loading.DebugKernel(kernel.kernel, debug=False)
        )
        checker._phase.fill_(2)
        checker.update(expect_phase=1, next_phase=3)  # not compiled with debug: no assert
        assert int(checker._phase) == 3
    assert "SimplePhaseChecker FAIL" in capfd.readouterr().out  # its device_print still runs


def _from_env_reads(config_module) -> tuple[set[str], set[str]]:
    """The server options and the environment variables SGLang's ``CanaryConfig.from_env``
    reads, from its source."""
    tree = ast.parse(Path(config_module.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CanaryConfig")
    method = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "from_env")
    options, env = set(), set()
    for node in ast.walk(method):
        if isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if owner in ("get_observability()", "server_args"):
                options.add(node.attr)
            elif owner == "envs":
                env.add(node.attr)
    return options, env


def test_the_leg_s_canary_config_is_sglang_s_from_env_of_a_server_s_options(monkeypatch):
    """The leg's ``CanaryConfig`` is made by SGLang's own ``from_env`` from exactly the options
    and environment variables it reads (none left to the caller's environment: a ring capacity
    set there changes nothing), the server's options reaching it where the release reads them
    (``get_observability()`` or the server args); the stand-in of ``get_observability`` is put
    back, so that no other caller is answered."""
    mods = loading.manager_modules()
    options, env = _from_env_reads(mods.config)
    assert options == {"kv_canary", "kv_canary_real_data", "kv_canary_sweep_interval"}, options
    given: list[dict] = []
    real = loading.canary_config

    def recorded(module, **kwargs):
        given.append(kwargs)
        return real(module, **kwargs)

    monkeypatch.setattr(loading, "canary_config", recorded)
    monkeypatch.setenv("SGLANG_KV_CANARY_RING_CAPACITY", "7")
    side = manager_run.run_history(3, steps=2)
    assert given and all(set(g["options"]) == options for g in given)
    assert all(set(g["env"]) == env for g in given), env
    config = side.config
    assert config.mode == mods.config.CanaryMode.LOG and config.sweep_interval == 1
    assert config.ring_capacity == side.made.violation_ring.shape[0] != 7
    assert config.real_kv_hash_mode.name == given[0]["options"]["kv_canary_real_data"]
    assert os.environ["SGLANG_KV_CANARY_RING_CAPACITY"] == "7"
    saved = getattr(mods.config, "get_observability", loading._not_run)
    with pytest.raises(AssertionError, match="canary_config"):
        saved()


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


def test_a_release_reading_more_of_the_pool_or_request_is_caught(monkeypatch, tmp_path):
    """Able to fail: where a release's manager read a field of its request pool, and its
    scatter one of a request, that the leg's stand-ins lack, the comparison names both."""
    loading.manager_modules()
    installed = loading.sglang_root() / "srt" / "kv_canary"
    for module, extra in (
        ("single_forward_manager/manager.py", "self._req_to_token_pool.size"),
        ("req_to_expected_token_ids_manager.py", "req.fill_ids"),
    ):
        target = tmp_path / "srt" / "kv_canary" / module
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(
            (installed / module).read_text() + f"\n\ndef _more(self, req):\n    return {extra}\n"
        )
    monkeypatch.setattr(loading, "sglang_root", lambda: tmp_path)
    pool_read, pools, req_read, seen = _pool_and_request_fields(monkeypatch)
    assert {"size"} == set.union(*(pool_read - pool for pool in pools))
    assert {"fill_ids"} == set.union(*(req_read - fields for fields in seen))
