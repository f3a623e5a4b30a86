"""The per-forward leg's CUDA graphs (conformance.sglang.graphs): the capture batch is the one
SGLang's decode graph runner builds, field by field; a replay runs what the capture recorded and
no Python of SGLang's (a capture-time decision stays frozen across replays); a replay changes
the canary as an eager run of the same live batch does, and a kernel launch left out of the
opaque wrappers is caught; the token oracle stand-in answers afresh under a replay; a capture
leaves the canary's state alone."""

from __future__ import annotations

import ast
import dataclasses

import numpy as np
import pytest
import torch

from conformance import upstream
from conformance.graph_capture import capture as capture_graph
from conformance.sglang import graphs, loading, manager_run, standins
from engine_model import Engine
from engine_model.vocabulary import DECODE, IDLE
from tests.suite.test_sglang_manager import read_attributes

#: A history with DECODE and IDLE graph replays (no window, no offset) and one with a window.
HISTORY, STEPS = 3, 40


def _runner_call() -> tuple[str, set[str]]:
    """The installed release's decode graph runner and the keywords of its capture
    ``ForwardBatch(...)`` call, read here on their own (not through the leg's reader)."""
    base = loading.sglang_root() / "srt" / "model_executor"
    looked = []
    for name in graphs.RUNNER_FILES:
        path = base / name
        looked.append(f"srt/model_executor/{name}")
        if not path.is_file():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ForwardBatch":
                modes = [k.value for k in node.keywords if k.arg == "forward_mode"]
                if modes and getattr(modes[0], "attr", "") == "capture_forward_mode":
                    return name, {k.arg for k in node.keywords if k.arg}
    pytest.fail(
        f"sglang {upstream.installed_version()}: no capture ForwardBatch(forward_mode="
        f"self.capture_forward_mode, ...) in {', '.join(looked)}: the leg cannot model its graphs"
    )


def test_the_capture_batch_sets_exactly_the_fields_the_runners_call_passes():
    """Field by field: a field the runner's capture call does not pass is None in the stand-in
    (never more than the runner gives), and every field it passes that the canary reads is
    set, as the runner fills it at capture (every row padding, ``seq_lens`` the fill value)."""
    name, passed = _runner_call()
    buffers = graphs.StaticBuffers.allocate(3, 3)
    batch = graphs.capture_batch(buffers, loading.runtime().ForwardMode.DECODE)
    read = set()
    for module in ("single_forward_manager/manager.py", "runner/kernel_launcher.py"):
        read |= read_attributes("forward_batch", module)
    for module in ("plan_input.py", "token_oracle/oracle_manager.py"):
        read |= read_attributes("forward_batch", module)
    for field in dataclasses.fields(standins.ManagerBatchStandIn):
        value = getattr(batch, field.name)
        if field.name not in passed:
            assert value is None, f"{field.name}: set, but {name}'s capture call does not pass it"
        elif field.name in read and field.name != "spec_info":  # None: no speculative runner
            assert value is not None, f"{field.name}: {name} passes it, the stand-in leaves it"
    assert "req_all_ids_lens" not in passed and batch.req_all_ids_lens is None
    assert batch.seq_lens.tolist() == [graphs.SEQ_LEN_FILL_VALUE] * 3
    assert not batch.req_pool_indices.any() and not batch.positions.any()
    assert batch.batch_size == 3 and batch.forward_mode.name == DECODE


def test_fill_from_pads_the_tail_as_the_registry_does():
    """The live rows first; ``req_pool_indices``, ``positions`` and ``out_cache_loc`` padded 0,
    ``seq_lens`` the fill value, ``input_ids`` and ``rids_int`` left as the last replay left
    them (``FOREACH_COPY``)."""
    buffers = graphs.StaticBuffers.allocate(3, 3)
    for name in ("input_ids", "rids_int", "req_pool_indices", "positions", "out_cache_loc"):
        getattr(buffers, name).fill_(9)
    live = dict(
        req_pool_indices=torch.tensor([4]), positions=torch.tensor([7]), seq_lens=torch.tensor([8]),
        out_cache_loc=torch.tensor([5]), input_ids=torch.tensor([6]), rids_int=torch.tensor([4]),
    )  # fmt: skip
    graphs.StaticBuffers.fill_from(buffers, types_namespace(live), raw_bs=1, raw_tokens=1)
    assert buffers.req_pool_indices.tolist() == [4, 0, 0]
    assert buffers.positions.tolist() == [7, 0, 0] and buffers.out_cache_loc.tolist() == [5, 0, 0]
    assert buffers.seq_lens.tolist() == [8, graphs.SEQ_LEN_FILL_VALUE, graphs.SEQ_LEN_FILL_VALUE]
    assert buffers.input_ids.tolist() == [6, 9, 9] and buffers.rids_int.tolist() == [4, 9, 9]
    assert buffers.bootstrap_room_ids_int.tolist() == [-1, -1, -1]


def types_namespace(values: dict):
    import types

    return types.SimpleNamespace(**values)


def _snapshots(replays: bool, monkeypatch, index: int = HISTORY) -> tuple[list, object]:
    """The canary buffers, ring and counters of SGLang's side after every step of history
    ``index``, its graph forwards replayed (``replays``) or run eagerly."""
    monkeypatch.setattr(manager_run.ManagerRun, "replays_graphs", replays)
    seen = []
    real = manager_run.ManagerRun.run_here

    def run_here(self, reference_run, step):
        real(self, reference_run, step)
        seen.append(
            (
                [self.canary_buf(key).numpy().copy() for key in self.worlds],
                self.made.violation_ring.numpy().copy(),
                self.index(),
            )
        )

    monkeypatch.setattr(manager_run.ManagerRun, "run_here", run_here)
    side = manager_run.run_history(index, steps=STEPS)
    monkeypatch.undo()
    return seen, side


def _equal(a: list, b: list) -> bool:
    return len(a) == len(b) and all(
        all(np.array_equal(x, y) for x, y in zip(u[0], v[0], strict=True))
        and np.array_equal(u[1], v[1])
        and u[2] == v[2]
        for u, v in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("index", [HISTORY, 9])  # no window; a window and the EAGLE offset
def test_a_replay_changes_the_canary_as_an_eager_run_of_the_live_batch(index, monkeypatch):
    """A healthy history whose decodes replay captured graphs leaves SGLang's canary buffers
    and ring, after every step, as the same history run eagerly (SGLang's Python afresh on
    each live batch); both also equal the reference after every step."""
    replayed, side = _snapshots(True, monkeypatch, index)
    assert sum(c.replays for c in side.graphs.values()) >= 2, side.step_counts
    eager, _ = _snapshots(False, monkeypatch, index)
    assert _equal(replayed, eager)


@pytest.mark.parametrize("dropped", range(4), ids=lambda i: f"launcher{i}")
def test_a_launcher_left_out_of_the_opaque_wrappers_is_caught(dropped, monkeypatch):
    """Each kernel launch of the inside-the-graph ops must be opaque: without the wrapper a
    replay misses its writes (or reruns its torch reference's frozen host reads), and the
    history no longer equals the eager run, or fails outright."""
    mods = loading.manager_modules()
    launchers = graphs.opaque_launchers(mods)
    assert len(launchers) == 4
    eager, _ = _snapshots(False, monkeypatch)
    kept = launchers[:dropped] + launchers[dropped + 1 :]
    monkeypatch.setattr(graphs, "opaque_launchers", lambda mods: kept)
    try:
        replayed, _ = _snapshots(True, monkeypatch)
    except Exception as error:  # the phase checker (its device assert), or the leg's compare
        assert str(error)
        return
    assert not _equal(replayed, eager), f"{launchers[dropped][1]} was not needed"


def test_the_opaque_launchers_are_the_kernels_the_leg_binds():
    """The opaque wrappers name each launcher ``loading.manager_modules`` binds for the inside
    of the graph (the adapter's launchers, the interpreted phase-check kernel)."""
    mods = loading.manager_modules()
    names = {name for _, name in graphs.opaque_launchers(mods)}
    assert names == {
        "launch_canary_plan_kernels", "launch_canary_verify_kernel",
        "launch_canary_write_kernel", "_phase_check_kernel",
    }  # fmt: skip
    for owner, name in graphs.opaque_launchers(mods):
        assert getattr(owner, name) is not None


def test_a_capture_time_decision_stays_frozen_across_replays_in_the_leg(monkeypatch):
    """The capture batch carries no ``req_all_ids_lens``, so SGLang's ``PlanInput`` took no
    valid lengths at capture; a replay over a live batch that carries them keeps the capture's
    decision (no verify entry gathers a token), where an eager call on the same live batch
    gathers them ([21]). And a replay reruns no Python of SGLang's: with
    ``fill_from_forward_batch`` broken after the capture, the replays still run."""
    side = manager_run.run_history(HISTORY, steps=STEPS)
    assert side.token_unchecked > 0
    captured = max(side.graphs.values(), key=lambda c: c.buffers.req_pool_indices.shape[0])
    assert not captured.valid_lens
    engine = side.engine
    live = [r for r in engine.running.values()][: captured.buffers.req_pool_indices.shape[0]]
    assert live, "the history ends with no running request"
    rows = torch.tensor([r.row for r in live])
    positions = torch.tensor([r.written for r in live])
    batch = dataclasses.replace(
        captured.batch, req_pool_indices=rows, positions=positions,
        req_all_ids_lens=torch.tensor([len(r.tokens) for r in live]),
        seq_lens=positions + 1, batch_size=len(live), rids_int=rows, input_ids=positions,
        out_cache_loc=torch.zeros_like(positions),
    )  # fmt: skip
    side.table.copy_(torch.from_numpy(engine.req_to_token))
    captured.buffers.fill_from(batch, len(live), len(live))
    plan_input = loading.runtime().plan_input.PlanInput
    monkeypatch.setattr(plan_input, "fill_from_forward_batch", _python_ran)
    with loading.cpu_only():
        captured.manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=batch)
        made = captured.pre.replay()
        replayed = made.verify_plans[0].verify_expected_tokens.clone()
        n = int(made.verify_plans[0].verify_num_valid[0])
        monkeypatch.undo()
        eager = loading.runtime().plan_input.PlanInput.allocate(bs_capacity=len(live), device="cpu")
        eager.fill_from_forward_batch(forward_batch=batch)
    assert n > 0 and (replayed[:n] == -1).all(), replayed[:n]
    assert eager.req_to_verify_expected_tokens_valid_lens.tolist() == [len(r.tokens) for r in live]


def _python_ran(*args, **kwargs):
    raise AssertionError("a replay ran SGLang's Python")


def test_the_token_oracle_stand_in_answers_afresh_under_a_replay():
    """``EngineTokenOracle`` is tensor work alone: a call captured once answers each replay from
    the table as :meth:`refresh` left it (a host read would freeze the capture's answer), and
    answers 0 outside what a request knows."""
    engine = Engine(manager_run.histories.engine_config(HISTORY))
    oracle = standins.EngineTokenOracle(engine)
    ids, positions = torch.tensor([1, 0, 1]), torch.tensor([0, 0, 10_000])
    graph = capture_graph(
        lambda: oracle.expected_tokens(generalized_req_ids=ids, positions=positions)
    )
    assert graph.output.tolist() == [0, 0, 0]
    oracle.table[1, 0] = 77
    assert graph.replay().tolist() == [77, 0, 0]


def test_a_capture_leaves_the_canary_state_alone_and_counts_its_warm_up(monkeypatch):
    """The capture's runs (SGLang's two warm-ups) write no canary buffer or ring row; their
    launches are counted apart (``warm_up``), two per tag for each of HEAD and TAIL."""
    side = manager_run.run_history(HISTORY, steps=STEPS)
    assert side.graphs
    for captured in side.graphs.values():
        kernels = captured.warm_up["kernel_run_counters"]
        assert set(kernels[kernels > 0].tolist()) == {4}  # verify and write, two runs each
        assert not captured.warm_up["slot_run_counters"].any()


def test_idle_steps_replay_the_decode_graph_of_their_size():
    """An IDLE step replays the DECODE graph of its padded size (``is_cuda_graph``): the leg
    counts it under IDLE and captures no graph of its own mode."""
    side = manager_run.run_history(HISTORY, steps=STEPS)
    assert side.step_counts[IDLE] > 0
    assert all(c.batch.forward_mode.name == DECODE for c in side.graphs.values())
