"""The per-forward leg's graphs of EAGLE's draft model (conformance.sglang.graphs): the capture
batches of the draft decode and draft extend graph runners hold, field by field, what each
runner's capture call passes and what EAGLE's ``draft_forward`` sets inside the graph, and their
``spec_info`` no more than its constructor passes; a draft model's history replays both graphs,
leaves SGLang's canary as the same history run eagerly, and plans no expected token in them
([21])."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from conformance import upstream
from conformance.sglang import graphs, loading, standins
from engine_model.vocabulary import DECODE, DRAFT_DECODE, DRAFT_EXTEND_V2
from tests.suite.test_sglang_graphs import _equal, _snapshots
from tests.suite.test_sglang_manager import read_attributes

#: A history of the draft model that replays both of its graphs (and runs both eagerly too).
DRAFT_HISTORY = 9
#: Each draft runner, the forward mode its capture batch has, its ``spec_info`` class, and a
#: row's tokens in the leg.
DRAFT_RUNNERS = (
    (graphs.DRAFT_DECODE_RUNNER, DECODE, "EagleDraftInput", 1),
    (graphs.DRAFT_EXTEND_RUNNER, DRAFT_EXTEND_V2, "EagleDraftExtendInput", 3),
)
IDS = ("draft decode", "draft extend")


def _capture_function(runner: graphs.Runner) -> ast.FunctionDef:
    """The runner's function that builds its capture ``ForwardBatch(...)``, read here on its own
    (not through the leg's reader): one whose name says it captures."""
    path = loading.sglang_root() / "srt" / runner.files[0]
    if not path.is_file():
        pytest.fail(f"sglang {upstream.installed_version()} has no srt/{runner.files[0]}")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef) and "capture" in node.name:
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "ForwardBatch":
                    return node
    pytest.fail(f"srt/{runner.files[0]}: no capture function builds a ForwardBatch(...)")


def _calls(function: ast.FunctionDef, name: str) -> list[ast.Call]:
    return [
        call
        for call in ast.walk(function)
        if isinstance(call, ast.Call) and getattr(call.func, "id", "") == name
    ]


def _canary_reads() -> set[str]:
    read = set()
    for module in (
        "single_forward_manager/manager.py",
        "runner/kernel_launcher.py",
        "plan_input.py",
        "token_oracle/oracle_manager.py",
    ):
        read |= read_attributes("forward_batch", module)
    return read


@pytest.mark.parametrize(("runner", "mode", "spec_class", "width"), DRAFT_RUNNERS, ids=IDS)
def test_a_draft_runner_s_capture_batch_holds_what_its_call_passes(runner, mode, spec_class, width):
    """Field by field: what the capture call does not pass (nor ``draft_forward`` set) is None,
    and every field it passes that the canary reads is set; ``req_all_ids_lens`` is not passed."""
    (call,) = _calls(_capture_function(runner), "ForwardBatch")
    passed = {k.arg for k in call.keywords if k.arg} | runner.set_in_graph
    spec = graphs.capture_spec_info(DRAFT_DECODE.name if mode == DECODE else mode, width)
    buffers = graphs.StaticBuffers.allocate(2, 2 * width)
    batch = graphs.capture_batch(buffers, loading.runtime().ForwardMode[mode], spec, runner)
    read = _canary_reads()
    for field in dataclasses.fields(standins.ManagerBatchStandIn):
        value = getattr(batch, field.name)
        if field.name not in passed:
            assert value is None, f"{field.name}: set, but {runner.name}'s call does not pass it"
        elif field.name in read:
            assert value is not None, f"{field.name}: {runner.name} passes it, the stand-in not"
    assert "req_all_ids_lens" not in passed and batch.req_all_ids_lens is None
    assert batch.forward_mode.name == mode and batch.spec_info is spec


def test_draft_forward_sets_the_fields_the_leg_sets_inside_the_graph():
    """EAGLE's ``draft_forward`` (which the draft decode runner captures) assigns
    ``forward_batch.input_ids`` and ``forward_batch.out_cache_loc`` before each step's forward:
    the runner's call passes ``input_ids=None``, and the canary reads the step's."""
    path = loading.sglang_root() / "srt" / "speculative" / "eagle_worker_v2.py"
    tree = ast.parse(path.read_text())
    (function,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "draft_forward"
    ]
    assigned = {
        target.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Attribute) and getattr(target.value, "id", "") == "forward_batch"
    }
    assert graphs.DRAFT_DECODE_RUNNER.set_in_graph <= assigned, assigned


@pytest.mark.parametrize(("runner", "mode", "spec_class", "width"), DRAFT_RUNNERS, ids=IDS)
def test_a_draft_runner_s_spec_info_holds_no_more_than_its_constructor_passes(
    runner, mode, spec_class, width
):
    """The stand-in's set fields are among those the runner's ``spec_info`` constructor passes,
    and it holds every one of those the canary reads (the draft extend's row width; nothing in
    the draft decode's ``DECODE``)."""
    calls = _calls(_capture_function(runner), spec_class)
    assert calls, f"{runner.name}: no {spec_class}(...) in its capture function"
    keywords = {k.arg for k in calls[0].keywords if k.arg}
    spec = graphs.capture_spec_info(DRAFT_DECODE.name if mode == DECODE else mode, width)
    held = {f.name for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None}
    reads = read_attributes("spec_info") | read_attributes(
        "spec_info", "token_oracle/oracle_manager.py"
    )
    assert held <= keywords, f"the stand-in holds {held - keywords}, {spec_class} passes none"
    if mode == DRAFT_EXTEND_V2:
        assert reads & keywords <= held and held == {"num_tokens_per_req"}, (reads, keywords)
    else:
        assert not held


def test_a_draft_graph_replay_changes_the_canary_as_an_eager_run(monkeypatch):
    """The draft model's history replays both of its graphs (and runs each mode eagerly too),
    and leaves SGLang's canary buffers, ring and write index after every step as the same
    history run eagerly; no replayed draft forward plans an expected token ([21])."""
    replayed, side = _snapshots(True, monkeypatch, DRAFT_HISTORY)
    eager, _ = _snapshots(False, monkeypatch, DRAFT_HISTORY)
    modes = {mode: c.replays for (_, mode), c in side.graphs.items() if c.replays}
    assert {DRAFT_DECODE.name, DRAFT_EXTEND_V2} <= modes.keys(), modes
    labels = set(side.step_counts)
    assert {"DECODE of the draft model", "DRAFT_EXTEND_V2"} <= labels, labels
    assert _equal(replayed, eager)
    assert side.unchecked_by_mode[DRAFT_DECODE.name] > 0
