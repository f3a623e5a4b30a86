"""Breakable prefill CUDA graphs in the per-forward leg (conformance.sglang.prefill_graphs): the
replay batch holds, field by field, what the prefill graph runner's ``load_batch`` passes, padded
and moded as the runner makes it; the runner captures the body alone and runs the wrapped outer
forward at each replay (a changed source is caught); a correct history on that batch raises
with the token oracle on and, without it, plans no expected token ([24])."""

from __future__ import annotations

import ast
import dataclasses

import pytest

from conformance.sglang import histories, loading, manager_run, prefill_graphs, wiring
from conformance.sglang.manager_run import manager_batches
from engine_model import Engine
from engine_model.vocabulary import EXTEND, MIXED


def _load_batch_keywords() -> set[str]:
    """``load_batch``'s ``ForwardBatch(...)`` keywords, read here on their own."""
    tree = ast.parse(prefill_graphs.runner_file().read_text())
    (load,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "load_batch"
    ]
    (call,) = [
        n
        for n in ast.walk(load)
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ForwardBatch"
    ]
    return {k.arg for k in call.keywords if k.arg}


def _live(mode: str):
    """A live batch of ``mode`` (``EXTEND`` or ``MIXED``) as the leg makes it."""
    engine = Engine(histories.engine_config(0))
    for size in (3, 2, 4):
        engine.admit(size, 0)
    forward = engine.prefill(5)
    if mode == MIXED:
        forward = engine.mixed(2)
    assert forward is not None and forward.mode == mode
    return manager_batches(forward, loading.manager_modules())[1]


@pytest.mark.parametrize("mode", [EXTEND, MIXED])
def test_the_replay_batch_holds_what_load_batch_passes(mode):
    passed = _load_batch_keywords()
    assert not {"rids_int", "bootstrap_room_ids_int", "req_all_ids_lens"} & passed
    live = _live(mode)
    replay = prefill_graphs.replay_batch(live)
    assert replay is not None
    tokens = int(live.positions.shape[0])
    size = prefill_graphs.bucket(tokens)
    assert size is not None and size >= tokens
    for field in dataclasses.fields(replay):
        value = getattr(replay, field.name)
        if field.name not in passed and field.name != "batch_size":
            assert value is None, f"{field.name}: set, but load_batch's call does not pass it"
    for name, pad in (("positions", 0), ("out_cache_loc", 0), ("input_ids", None)):
        got = getattr(replay, name)
        assert got.shape[0] == size and got[:tokens].tolist() == getattr(live, name).tolist()
        if pad is not None:
            assert not got[tokens:].any(), name
    assert replay.forward_mode.name == EXTEND  # the graphs are captured in EXTEND
    assert replay.req_pool_indices.tolist() == live.req_pool_indices.tolist()


def test_a_forward_past_the_largest_bucket_runs_eagerly():
    assert prefill_graphs.bucket(max(prefill_graphs.TOKEN_BUCKETS) + 1) is None
    assert prefill_graphs.bucket(1) == min(prefill_graphs.TOKEN_BUCKETS)


def test_the_runner_captures_the_body_and_replays_the_wrapped_forward(tmp_path, monkeypatch):
    """The installed release is the shape the module models; a runner whose ``_run_forward``
    calls the outer forward (the canary's ops then inside the graph) is named as not."""
    assert prefill_graphs.why_not_modelled() is None
    changed = tmp_path / "prefill_cuda_graph_runner.py"
    text = prefill_graphs.runner_file().read_text()
    assert "output = self.layer_model.forward(" in text
    changed.write_text(
        text.replace(
            "output = self.layer_model.forward(", "output = self.model_runner.model.forward("
        )
    )
    monkeypatch.setattr(prefill_graphs, "runner_file", lambda: changed)
    prefill_graphs.replay_keywords.cache_clear()
    try:
        assert "_run_forward" in (prefill_graphs.why_not_modelled() or "")
    finally:
        prefill_graphs.replay_keywords.cache_clear()


def test_with_the_token_oracle_a_correct_history_raises_at_its_first_prefill(monkeypatch):
    monkeypatch.setattr(manager_run.ManagerRun, "prefill_graphs", True)
    with pytest.raises(TypeError, match="repeat_interleave"):
        manager_run.run_history(0, steps=10)


def test_without_the_token_oracle_no_prefill_graph_plans_an_expected_token(monkeypatch):
    """The runner given no oracle and the input assert off: SGLang's plan of a prefill on the
    replay batch gathers no expected token where the reference's gathers each."""
    config = histories.engine_config
    monkeypatch.setattr(wiring, "runner_gets_token_oracle", lambda draft: False)
    monkeypatch.setattr(
        manager_run.histories,
        "engine_config",
        lambda *a, **k: dataclasses.replace(config(*a, **k), write_input_assert=False),
    )
    monkeypatch.setattr(manager_run.ManagerRun, "prefill_graphs", True)
    with pytest.raises(
        AssertionError, match=r"verify_expected_tokens: SGLang \[-1(, -1)*\], the reference \[\d"
    ):
        manager_run.run_history(0, steps=40)
