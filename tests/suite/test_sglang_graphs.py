"""The per-forward leg's CUDA graphs (conformance.sglang.graphs): the capture batch is the one
SGLang's decode graph runner builds, field by field, in DECODE and in TARGET_VERIFY (its
``spec_info`` no more than ``get_spec_info`` passes); a replay runs what the capture recorded and
no Python of SGLang's (a capture-time decision, the valid lengths or a target verify's draft
count, stays frozen across replays); a replay changes the canary as an eager run of the same
live batch does, a target verify's too, and a kernel launch left out of the opaque wrappers is
caught; the token oracle stand-in answers afresh under a replay; a capture leaves the canary's
state alone."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import sys

import numpy as np
import pytest
import torch

import reference
from conformance import upstream
from conformance.graph_capture import capture as capture_graph
from conformance.sglang import graphs, loading, manager_run, standins, trials
from conformance.sglang.histories import GRAPH_DRAFT_TOKENS
from engine_model import Engine
from engine_model.faults import Due
from engine_model.vocabulary import DECODE, IDLE, TARGET_VERIFY
from tests.suite.test_sglang_manager import read_attributes

#: A history with DECODE and IDLE graph replays (no window, no offset, no EAGLE).
HISTORY, STEPS = 0, 40
#: The steps after a warm-up that replay TARGET_VERIFY graphs (or make room for them).
VERIFY_STEPS = 10


def _runner_call() -> tuple[str, set[str]]:
    """The installed release's decode graph runner and the keywords of its capture
    ``ForwardBatch(...)`` call, read here on their own (not through the leg's reader)."""
    base = loading.sglang_root() / "srt"
    looked = []
    for name in graphs.DECODE_RUNNER.files:
        path = base / name
        looked.append(f"srt/{name}")
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


def _registry_policies() -> dict[str, tuple[str, str | int | None]]:
    """Each slot of SGLang's ``build_decode_registry`` (the decode graph runner's static
    buffers), its padding policy and pad value, read from the installed source: the
    ``GraphSlot(...)`` calls, a name bound by a ``for`` over a tuple of names counted once per
    name, the policy ``FOREACH_COPY`` where the call sets none (``GraphSlot``'s default)."""
    path = loading.sglang_root() / "srt" / "model_executor" / "cuda_graph_buffer_registry.py"
    tree = ast.parse(path.read_text())
    build = next(
        n for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "build_decode_registry"
    )  # fmt: skip
    loops = {
        node.target.id: [e.value for e in node.iter.elts if isinstance(e, ast.Constant)]
        for node in ast.walk(build)
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name)
        and isinstance(node.iter, ast.Tuple)
    }  # fmt: skip
    out: dict[str, tuple[str, str | int | None]] = {}
    for call in ast.walk(build):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", "") == "GraphSlot"):
            continue
        keywords = {k.arg: k.value for k in call.keywords}
        name = call.args[0] if call.args else keywords.get("name")
        names = (
            [name.value]
            if isinstance(name, ast.Constant)
            else loops.get(getattr(name, "id", ""), [])
        )
        policy = keywords.get("padding_policy")
        value = keywords.get("pad_value")
        pad = value.id if isinstance(value, ast.Name) else getattr(value, "value", None)
        for one in names:
            out[one] = (policy.attr if isinstance(policy, ast.Attribute) else "FOREACH_COPY", pad)
    return out


def _padding_departures() -> list[str]:
    """Where ``StaticBuffers.PADDING`` departs from :func:`_registry_policies`."""
    source = _registry_policies()
    as_leg = {"ZERO": 0, "FOREACH_COPY": None}
    out = []
    for name, pad in graphs.StaticBuffers.PADDING.items():
        if name == "extend_seq_lens":  # the draft extend runner's own registry
            continue
        policy, value = source.get(name, ("absent", None))
        if policy == "FILL_SENTINEL":
            same = value == "seq_len_fill_value" and pad == graphs.SEQ_LEN_FILL_VALUE
        else:
            same = policy in as_leg and as_leg[policy] == pad
        if not same:
            out.append(f"{name}: the leg pads {pad!r}, the registry declares {policy} {value}")
    return out


def test_the_static_buffers_pad_each_slot_as_sglang_s_decode_registry_declares():
    """``StaticBuffers.PADDING``, the leg's policy per slot, is the policy SGLang's
    ``build_decode_registry`` declares for that slot, read from the installed source:
    ``ZERO`` for 0, ``FILL_SENTINEL`` with ``seq_len_fill_value`` for the fill value, and
    ``FOREACH_COPY`` (the tail kept) for None; the draft extend runner's ``extend_seq_lens``
    (its own registry) aside."""
    assert _padding_departures() == []


def test_a_slot_padded_otherwise_than_the_registry_is_caught(monkeypatch):
    """Able to fail: the leg zeroing ``input_ids``' tail, which the registry keeps."""
    monkeypatch.setitem(graphs.StaticBuffers.PADDING, "input_ids", 0)
    assert any(d.startswith("input_ids") for d in _padding_departures())


@pytest.mark.parametrize("index", [HISTORY, 4, 9])  # no window; a window; the draft model's
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
    captured = max(
        (c for (_, mode), c in side.graphs.items() if mode == DECODE),
        key=lambda c: c.buffers.req_pool_indices.shape[0],
    )
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


def test_the_token_oracle_stand_in_is_called_and_answers_as_hash_oracle():
    """Held to SGLang's ``HashOracle`` (``token_oracle/oracle.py``, run): the same keyword-only
    call, an ``int32`` answer of the positions' shape, and tensor work alone in both, so a
    captured call of either answers each replay as an eager call of the inputs then does (the
    stand-in claims no property SGLang's oracle lacks). Able to fail: an oracle that reads a
    value to the host freezes the capture's answer."""
    import inspect

    hash_oracle = loading.token_oracle_modules().token_oracle.HashOracle(vocab_size=50_000)
    engine = Engine(manager_run.histories.engine_config(HISTORY))
    stand_in = standins.EngineTokenOracle(engine)
    table = stand_in.table
    table.copy_(torch.arange(1, table.numel() + 1).reshape(table.shape))  # distinct, non-zero
    for name in ("generalized_req_ids", "positions"):
        for oracle in (hash_oracle, stand_in):
            kind = inspect.signature(oracle.expected_tokens).parameters[name].kind
            assert kind is inspect.Parameter.KEYWORD_ONLY, (oracle, name)
    ids, positions = torch.tensor([3, 1, 2], dtype=torch.int64), torch.tensor([0, 5, 9])

    class HostRead:
        def expected_tokens(self, *, generalized_req_ids, positions):
            first = int(positions[0])  # a host read: frozen at capture
            return (generalized_req_ids * 0 + first).to(torch.int32)

    for oracle in (hash_oracle, stand_in, HostRead()):
        graph = capture_graph(
            lambda o=oracle: o.expected_tokens(generalized_req_ids=ids, positions=positions)
        )
        assert graph.output.dtype == torch.int32 and graph.output.shape == positions.shape
        positions.add_(1)
        eager = oracle.expected_tokens(generalized_req_ids=ids, positions=positions)
        assert eager.all(), oracle  # the rows and positions are inside what it knows
        fresh = torch.equal(graph.replay(), eager)
        assert fresh != isinstance(oracle, HostRead), oracle
        positions.sub_(1)


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
    counts it under IDLE and captures no graph of its own mode; a graph's capture batch has the
    mode it is kept under (DECODE, or TARGET_VERIFY)."""
    side = manager_run.run_history(HISTORY, steps=STEPS)
    assert side.step_counts[IDLE] > 0
    assert all(c.batch.forward_mode.name == mode for (_, mode), c in side.graphs.items())
    assert {mode for _, mode in side.graphs} <= {DECODE, TARGET_VERIFY}


def test_an_eagle_target_s_idle_steps_replay_its_target_verify_graph():
    """Under EAGLE the target model's runner captures TARGET_VERIFY alone, so an IDLE step
    replays that graph (its padded size, rows of the draft count): the leg's EAGLE target
    history (index 1) captures no DECODE graph, its idle steps run through TARGET_VERIFY
    graphs whose rows are :data:`GRAPH_DRAFT_TOKENS` wide, and the history stays silent."""
    side = manager_run.run_history(1, steps=STEPS)
    assert side.step_counts[IDLE] > 0
    assert {mode for _, mode in side.graphs} == {TARGET_VERIFY}
    assert all(tokens == rows * GRAPH_DRAFT_TOKENS for (_, rows, tokens, _), _ in side.graphs)
    engine = Engine(side.engine.config)
    idle = engine.idle(2, GRAPH_DRAFT_TOKENS)
    assert idle is not None and graphs.capture_mode(idle) == TARGET_VERIFY
    assert graphs.capture_mode(Engine(side.engine.config).idle(2)) == DECODE


def test_an_eagle_target_s_idle_step_replayed_through_decode_is_caught(monkeypatch):
    """Able to fail: a leg whose idle steps are one token a row under EAGLE (the old leg's)
    replays them through a DECODE graph in the EAGLE target history."""
    real = Engine.idle
    monkeypatch.setattr(Engine, "idle", lambda self, pad, width=1: real(self, pad))
    side = manager_run.run_history(1, steps=STEPS)
    assert DECODE in {mode for _, mode in side.graphs}


@pytest.mark.parametrize(
    ("file", "cls"),
    [("eagle_draft_cuda_graph_runner.py", "EAGLEDraftCudaGraphRunner"),
     ("eagle_draft_extend_cuda_graph_runner.py", "EAGLEDraftExtendCudaGraphRunner")],
    ids=["draft decode", "draft extend"],
)  # fmt: skip
def test_sglang_s_runners_admit_an_idle_batch_to_their_graphs(file, cls):
    """SGLang's own decisions, run from source: ``ForwardMode.is_cuda_graph`` is true of IDLE
    (the decode graph runner replays an idle batch through its capture mode's graph), and each
    of the draft model's runners' ``can_run_graph`` admits the idle batch of a DP-attention
    rank (no request of its own, the ranks' largest batch within its captured sizes, every
    rank able to replay) and refuses it where a rank cannot, which SGLang then runs eagerly
    (``_draft_forward_idle``, not modelled)."""
    assert loading.runtime().ForwardMode.IDLE.is_cuda_graph()
    path = loading.sglang_root() / "srt" / "speculative" / file
    can_run = loading.methods_from_source(path, cls, ("can_run_graph",), {})["can_run_graph"]
    runner = types_namespace(dict(captured_req_width=1, require_mlp_tp_gather=True,
                                  disable_padding=False, max_bs=8, require_mlp_sync=True))  # fmt: skip
    idle = dict(spec_info=None, original_global_num_tokens_cpu=[0, 3], batch_size=0,
                seq_lens=torch.zeros(0), can_run_decode_cuda_graph=True,
                can_run_dp_draft_cuda_graph=True)  # fmt: skip
    assert can_run(runner, types_namespace(idle))
    assert not can_run(runner, types_namespace(dict(idle, can_run_decode_cuda_graph=False)))


def _capture_mode_of_sglang_s_decode_runner(speculative: bool) -> str:
    """The mode SGLang's decode graph runner captures (and so replays every batch it takes,
    an idle one included), run from its source: the statements of its ``__init__`` that set
    ``capture_forward_mode``, over a model runner that is speculative (a target model's under
    EAGLE) or not."""
    cls = next(
        n for n in ast.walk(_runner_tree())
        if isinstance(n, ast.ClassDef) and n.name == "DecodeCudaGraphRunner"
    )  # fmt: skip
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    sets = [
        statement for statement in init.body
        if any(isinstance(n, ast.Attribute) and n.attr == "capture_forward_mode"
               and isinstance(n.ctx, ast.Store) for n in ast.walk(statement))
    ]  # fmt: skip
    assert sets, "the runner's __init__ sets no capture_forward_mode"
    spec = types_namespace(dict(is_speculative=lambda: speculative,
                                supports_target_verify_for_draft=lambda: True))  # fmt: skip
    scope = {
        "ForwardMode": loading.runtime().ForwardMode,
        "model_runner": types_namespace(dict(spec_algorithm=spec, is_draft_worker=False)),
        "self": types_namespace(dict(is_dllm=False)),
    }
    scope["self"].model_runner = scope["model_runner"]
    exec(
        compile(ast.Module(body=sets, type_ignores=[]), "decode_cuda_graph_runner.py", "exec"),
        scope,
    )
    return scope["self"].capture_forward_mode.name


def test_the_decode_runner_captures_the_mode_the_leg_replays_an_idle_step_through():
    """SGLang's decode graph runner captures ``DECODE``, or ``TARGET_VERIFY`` on a speculative
    server (run from its source), and the leg replays an idle step through that graph: a
    decode graph's idle rows one token wide, a target verify graph's the draft count."""
    engine = Engine(manager_run.histories.engine_config(1))
    assert _capture_mode_of_sglang_s_decode_runner(False) == DECODE
    assert graphs.capture_mode(engine.idle(2)) == DECODE
    assert _capture_mode_of_sglang_s_decode_runner(True) == TARGET_VERIFY
    assert graphs.capture_mode(engine.idle(2, GRAPH_DRAFT_TOKENS)) == TARGET_VERIFY


def _runner_tree() -> ast.AST:
    """The installed release's decode graph runner, parsed."""
    name, _ = _runner_call()
    return ast.parse((loading.sglang_root() / "srt" / name).read_text())


def _spec_info_keywords() -> set[str]:
    """The fields the runner's ``get_spec_info`` passes to the ``EagleVerifyInput(...)`` it
    builds for the capture batch under EAGLE, read here from its source."""
    for node in ast.walk(_runner_tree()):
        if isinstance(node, ast.FunctionDef) and node.name == "get_spec_info":
            for call in ast.walk(node):
                if (
                    isinstance(call, ast.Call)
                    and getattr(call.func, "id", "") == "EagleVerifyInput"
                ):
                    return {k.arg for k in call.keywords if k.arg}
    pytest.fail("the decode graph runner's get_spec_info builds no EagleVerifyInput(...)")


def test_the_runner_captures_target_verify_under_speculative_decoding():
    """The runner's source sets ``capture_forward_mode`` to ``TARGET_VERIFY`` (under speculative
    decoding) and passes the capture call the ``spec_info`` of ``self.get_spec_info``, so the
    leg's TARGET_VERIFY graphs are the runner's."""
    tree = _runner_tree()
    modes = {
        node.value.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "attr", "") == "capture_forward_mode" for t in node.targets)
        and isinstance(node.value, ast.Attribute)
    }
    assert {DECODE, TARGET_VERIFY} <= modes, modes
    spec = {
        node.value.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", "") == "spec_info" for t in node.targets)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
    }
    assert "get_spec_info" in spec and "spec_info" in _runner_call()[1]


def test_the_target_verify_capture_batch_holds_no_more_than_the_runner_passes():
    """Field by field in TARGET_VERIFY: the capture batch sets the fields of the runner's call
    and no other; its ``spec_info`` stand-in holds every field ``get_spec_info``'s
    ``EagleVerifyInput(...)`` passes that the canary reads (``draft_token_num``), and none it
    does not pass; the token-axis buffers hold ``bs * draft_token_num`` tokens."""
    name, passed = _runner_call()
    spec = graphs.CaptureSpecInfo(draft_token_num=3)
    buffers = graphs.StaticBuffers.allocate(2, 6)
    batch = graphs.capture_batch(buffers, loading.runtime().ForwardMode.TARGET_VERIFY, spec)
    read = set()
    for module in ("single_forward_manager/manager.py", "runner/kernel_launcher.py"):
        read |= read_attributes("forward_batch", module)
    for module in ("plan_input.py", "token_oracle/oracle_manager.py"):
        read |= read_attributes("forward_batch", module)
    for field in dataclasses.fields(standins.ManagerBatchStandIn):
        value = getattr(batch, field.name)
        if field.name not in passed:
            assert value is None, f"{field.name}: set, but {name}'s capture call does not pass it"
        elif field.name in read:
            assert value is not None, f"{field.name}: {name} passes it, the stand-in leaves it"
    assert batch.spec_info is spec and batch.forward_mode.name == TARGET_VERIFY
    keywords = _spec_info_keywords()
    canary_reads = read_attributes("spec_info") | read_attributes(
        "spec_info", "token_oracle/oracle_manager.py"
    )
    held = {f.name for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None}
    assert held <= keywords, f"the stand-in holds {held - keywords}, get_spec_info passes none"
    assert canary_reads & keywords <= held, canary_reads & keywords - held
    assert buffers.positions.shape[0] == buffers.input_ids.shape[0] == 6
    assert batch.batch_size == 2 and batch.seq_lens.tolist() == [graphs.SEQ_LEN_FILL_VALUE] * 2


def _target_verify_graphs(side) -> list:
    return [c for (_, mode), c in side.graphs.items() if mode == TARGET_VERIFY]


def _verify_snapshots(replays: bool, monkeypatch, index: int) -> tuple[list, object]:
    """An engine of the leg's ``index`` (the target model's canary) after the warm-up, then
    target verifies replaying graphs (or run eagerly: ``replays``), a request finished and
    another admitted and prefilled where none has room (and at the end, where none has room
    for another verify); SGLang's canary buffers, ring and write
    index after each step (each step compared with the reference as the leg compares it)."""
    monkeypatch.setattr(manager_run.ManagerRun, "replays_graphs", replays)
    config = manager_run.histories.engine_config(index, eagle_offset=0)
    trial = trials.start(config, through_sglang=True)
    engine, side = trial.engine, trial.side
    seen = []
    room = config.context_len - GRAPH_DRAFT_TOKENS
    for k in range(VERIFY_STEPS + 1):
        if k < VERIFY_STEPS:
            step = engine.target_verify(GRAPH_DRAFT_TOKENS, k, k % 3, graph=True)
        elif any(0 < r.written <= room for r in engine.running.values()):
            break
        else:
            step = None
        # where no row has room (a row without room sits a target verify out), and at the
        # end where none has room for another, a request finishes and another comes
        if step is None:
            engine.finish(0)
            engine.admit(2 + k % 3)
            step = engine.prefill(config.context_len)
        if step is not None:
            trial.run(step)
            seen.append(
                (
                    [side.canary_buf(key).numpy().copy() for key in side.worlds],
                    side.made.violation_ring.numpy().copy(),
                    side.index(),
                )
            )
    monkeypatch.undo()
    return seen, side


@pytest.mark.parametrize("index", [0, 4])  # pages of 1 slot, no window; pages of 2, a window
def test_a_target_verify_replay_changes_the_canary_as_an_eager_run(index, monkeypatch):
    """Target verifies that replay captured TARGET_VERIFY graphs (their padding rows at the
    tail, ``draft_token_num`` tokens each; a graph replayed again after other steps) leave
    SGLang's canary buffers and ring, after every step, as the same steps run eagerly; both
    equal the reference after every step."""
    replayed, side = _verify_snapshots(True, monkeypatch, index)
    verify = _target_verify_graphs(side)
    assert sum(c.replays for c in verify) >= 3 and max(c.replays for c in verify) >= 2, [
        c.replays for c in verify
    ]
    eager, _ = _verify_snapshots(False, monkeypatch, index)
    assert _equal(replayed, eager)


def test_a_target_verify_graph_keeps_its_captured_draft_count(monkeypatch):
    """The capture read ``spec_info.draft_token_num`` to the host (``PlanInput``, the token
    oracle manager): a replay over a live batch whose ``spec_info`` says another count still
    plans the captured count per row and gathers no expected token ([21]), and runs none of
    SGLang's Python; an eager call on the same live batch plans the live count and its valid
    lengths."""
    _, side = _verify_snapshots(True, monkeypatch, 0)
    captured = max(_target_verify_graphs(side), key=lambda c: c.replays)
    bs = int(captured.buffers.req_pool_indices.shape[0])
    drafts = captured.batch.spec_info.draft_token_num
    engine = side.engine
    room = engine.config.context_len - drafts
    live = [r for r in engine.running.values() if 0 < r.written <= room][:bs]
    assert live, "the history ends with no running request that wrote and has room"
    rows = torch.tensor([r.row for r in live])
    seq_lens = torch.tensor([r.written for r in live])
    positions = torch.cat([torch.arange(w, w + drafts - 1) for w in seq_lens.tolist()])
    batch = dataclasses.replace(
        captured.batch, req_pool_indices=rows, seq_lens=seq_lens, positions=positions,
        req_all_ids_lens=torch.tensor([len(r.tokens) for r in live]), batch_size=len(live),
        rids_int=rows, input_ids=positions, out_cache_loc=torch.zeros_like(positions),
        spec_info=standins.SpecInfoStandIn(draft_token_num=drafts - 1),
    )  # fmt: skip
    side.table.copy_(torch.from_numpy(engine.req_to_token))
    captured.buffers.fill_from(batch, len(live), int(positions.shape[0]))
    runtime = loading.runtime()
    monkeypatch.setattr(runtime.plan_input.PlanInput, "fill_from_forward_batch", _python_ran)
    with loading.cpu_only():
        captured.manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=batch)
        made = captured.pre.replay()
        monkeypatch.undo()
        eager = runtime.plan_input.PlanInput.allocate(bs_capacity=len(live), device="cpu")
        eager.fill_from_forward_batch(forward_batch=batch)
    offsets = made.write_plans[0].write_offsets[: len(live) + 1]
    assert torch.diff(offsets).tolist() == [drafts] * len(live), offsets
    assert eager.extend_seq_lens.tolist() == [drafts - 1] * len(live)
    n = int(made.verify_plans[0].verify_num_valid[0])
    assert n > 0 and (made.verify_plans[0].verify_expected_tokens[:n] == -1).all()
    assert eager.req_to_verify_expected_tokens_valid_lens.tolist() == [len(r.tokens) for r in live]


def test_replayed_dues_promise_only_what_a_replay_can_report():
    """Under [21] a due needing all its bits loses ``TOKEN``, one of ``TOKEN`` alone is
    dropped, and so is one that any of its bits meets where ``TOKEN`` is among them (a record
    differing in its token alone is seen by no check a replay makes at its slot); each changed
    due is counted, and a due without ``TOKEN`` is kept as it is."""
    token, chain = graphs.TOKEN, int(reference.FailReason.VERIFY_CHAIN_HASH_MISMATCH)
    dues = [
        Due(slot=5, bits=chain | token), Due(slot=5, bits=token), Due(slot=-1, bits=chain | token),
        Due(slot=6, bits=chain | token, any_of=True), Due(slot=7, bits=chain),
    ]  # fmt: skip
    counted = [0]
    assert graphs.replayed_dues(dues, counted) == [Due(slot=5, bits=chain), Due(slot=7, bits=chain)]
    assert counted == [4]
    assert graphs.replayed_dues(None, counted) is None


def _capture_answers() -> list[tuple[bool, bool, bool]]:
    """``(capturing, the leg's stand-in, SGLang's own)`` of ``is_device_stream_capturing`` on
    a ``cuda`` device, outside and inside the leg's capture block: SGLang's function run from
    source on a GPU platform stand-in (graph capture supported, the device module's
    ``is_current_stream_capturing`` the capture state)."""
    capturing = [False]
    platform = types_namespace(dict(device_type="cuda",
                                    capabilities=types_namespace(dict(graph_capture=True))))  # fmt: skip
    module = types_namespace(dict(is_current_stream_capturing=lambda: capturing[0]))
    fake_torch = types_namespace(dict(get_device_module=lambda device: module))
    path = loading.sglang_root() / "srt" / "utils" / "common.py"
    scope = {"current_platform": platform, "torch": fake_torch}
    theirs = loading.from_source(path, ("is_device_stream_capturing",), scope)[
        "is_device_stream_capturing"
    ]
    loading.manager_modules()
    utils = sys.modules["sglang.srt.utils"]
    device = torch.device("cuda")
    out = []
    for state in (False, True):
        capturing[0] = state
        with graphs._stream_capturing() if state else contextlib.nullcontext():
            out.append((state, utils.is_device_stream_capturing(device), theirs(device)))
    return out


def test_the_stream_capture_stand_in_answers_as_sglang_s_own_on_a_gpu():
    """``is_device_stream_capturing``: SGLang's own is True while a stream captures, False
    otherwise; the leg's stand-in (``loading._stand_in_utils``, ``graphs._stream_capturing``),
    which SGLang's canary asks (``FutureTensors.device_to_host`` refuses to run in a capture),
    answers the same inside and outside the leg's captures."""
    assert all(state == mine == theirs for state, mine, theirs in _capture_answers())


def test_a_capture_the_stand_in_does_not_announce_is_caught(monkeypatch):
    """Able to fail: a capture block that leaves the stand-in saying False."""
    monkeypatch.setattr(graphs, "_stream_capturing", contextlib.nullcontext)
    assert any(mine != theirs for _, mine, theirs in _capture_answers())
