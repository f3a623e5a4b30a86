"""EAGLE drafting a tree (``conformance/sglang/tree.py``): a target verify as SGLang's tree
verify launches it, the accepted path's KV moved, and the support matrix's tree row ([27])."""

from __future__ import annotations

import dataclasses
import functools
import types

import numpy as np
import pytest

import reference
from conformance.sglang import histories, loading, manager_run, matrix, tree
from engine_model import Engine, Forward, Move
from engine_model.vocabulary import TARGET_VERIFY

ROW = next(r for r in matrix.ROWS if "tree" in r.option)
TARGET = ROW.models[0]


@functools.cache
def _verifies(**config):
    """The chain verifies of history 0 of the tree row's target model (``config``: fields of
    its engine's configuration changed), and the tree steps made of them."""
    engine = Engine(dataclasses.replace(matrix._config(ROW, TARGET, 0), **config))
    made = []
    real = tree.as_tree

    def spy(engine, forward, records=False):
        steps = real(engine, forward, records)
        made.append((forward, steps))
        return steps

    tree.as_tree = spy
    try:
        histories.history(0, engine=engine, scheduling=matrix.served(TARGET.scheduling))
    finally:
        tree.as_tree = real
    return made


def test_a_tree_verify_writes_each_node_at_its_depth_in_the_engine_s_slots():
    made = _verifies()
    assert made
    for chain, (verify, *moves) in made:
        assert verify.mode == TARGET_VERIFY
        assert (verify.groups[0].out_cache_loc == chain.groups[0].out_cache_loc).all()
        for b, row in enumerate(chain.plan["req_pool_indices"].tolist()):
            at = np.flatnonzero(chain.token_rows == b)
            if row == 0:
                assert (verify.write["positions"][at] == chain.write["positions"][at]).all()
                continue
            prefix = int(chain.plan["prefix_lens"][b])
            depths = [tree.depth(j) for j in range(len(at))]
            assert verify.write["positions"][at].tolist() == [prefix + d for d in depths]
            ids, path = verify.write["input_ids"][at], chain.write["input_ids"][at]
            for j in range(1, len(at)):  # the path's node holds the chain's token, a sibling not
                assert (ids[j] == path[depths[j]]) == (j % 2 == 1)
        for save, load in zip(moves[::2], moves[1::2], strict=True):
            assert save.save and not load.save and save.key == load.key
            assert (load.groups[0].records_from == -1).all()


def _misplaced_moves(made) -> tuple[list, int]:
    """The moves of the tree steps ``made`` that do not take the path's node ``2d - 1`` to the
    slot of depth ``d`` (``d >= 2``) of one row, and how many moves there were."""
    wrong, moved = [], 0
    for chain, (_, *moves) in made:
        rows = [chain.groups[0].out_cache_loc[chain.token_rows == b].tolist()
                for b in range(len(chain.plan["req_pool_indices"]))]  # fmt: skip
        for save, load in zip(moves[::2], moves[1::2], strict=True):
            pairs = zip(save.groups[0].slots.tolist(), load.groups[0].slots.tolist(), strict=True)
            for source, target in pairs:
                row = [r for r in rows if target in r and source in r]
                if len(row) != 1 or not (
                    row[0].index(target) >= 2
                    and row[0].index(source) == 2 * row[0].index(target) - 1
                ):
                    wrong.append((source, target))
                moved += 1
    return wrong, moved


def test_the_accepted_path_s_kv_goes_to_the_slots_of_its_depths():
    """The moves SGLang's ``move_accept_tokens_to_target_kvcache`` (run) chooses after each
    tree verify take the path's node of depth ``d`` to the window's slot ``d``."""
    wrong, moved = _misplaced_moves(_verifies())
    assert moved, "no accepted path of history 0 went past depth 1"
    assert wrong == []


def test_a_move_of_other_slots_is_caught(monkeypatch):
    """Able to fail: a mover whose moves run the other way (the window's slot to the path's
    node) is caught."""
    real = tree._accept_mover()
    monkeypatch.setattr(
        tree,
        "_accept_mover",
        lambda: lambda forward, accept: [(t, s) for s, t in real(forward, accept)],
    )
    wrong, moved = _misplaced_moves(_verifies.__wrapped__())
    assert moved and len(wrong) == moved


@pytest.mark.parametrize("topk", [1, 2])
def test_the_tree_row_reports_only_with_a_tree(topk):
    """History 0 of the tree row's target through SGLang's runtime: silent as a chain (the
    EAGLE chain row's target), and ``WRITE_POSITION`` in ``TARGET_VERIFY`` first as a tree
    even where the move carries the records: the write's own report (where the move leaves
    them, as SGLang's does, the row's history cell shows the same, run by
    ``test_the_docs_install_and_history_cells_are_today_s_runs``)."""
    for records in (True,) if topk == 2 else (False,):
        served = matrix.served(TARGET.scheduling)
        scheduling = dataclasses.replace(served, tree=topk == 2, tree_records=records)
        engine, reference_run, side = manager_run.sides(matrix._config(ROW, TARGET, 0))
        first = []

        def run(step, side=side, reference_run=reference_run, first=first):
            side.run(reference_run, step)
            if side.fired and not first:
                first.append(sorted(side.fired))

        histories.history(0, run=run, engine=engine, scheduling=scheduling)
        if topk == 1:
            assert not side.fired
            continue
        (label, _, bits), *_ = first[0]
        assert "TARGET_VERIFY" in label, first[0]
        assert bits == int(reference.FailReason.WRITE_POSITION_MISMATCH), first[0]


def test_a_step_that_is_no_target_verify_is_run_as_made():
    engine = Engine(matrix._config(ROW, TARGET, 0))
    engine.admit(3, 0)
    prefill = engine.prefill(6)
    assert isinstance(prefill, Forward)
    assert tree.verify(engine, prefill) == [prefill]
    assert tree.verify(engine, None) == []
    move = Move("accept", 1, True, ())
    assert tree.verify(engine, move) == [move]


def test_a_tree_s_expected_inputs_follow_its_inputs_where_they_were_the_inputs():
    """With the write's input assert on (a release whose draft runner has the token oracle,
    up to 0.5.17), a target verify expects its inputs themselves ([18]): the tree's expected
    inputs are the tree's inputs."""
    made = _verifies(write_input_assert=True)
    changed = 0
    for chain, (verify, *_) in made:
        write = verify.write
        assert (chain.write["expected_input_tokens"] == chain.write["input_ids"]).all()
        assert (write["expected_input_tokens"] == write["input_ids"]).all()
        assert (write["expected_input_positions"] == write["positions"]).all()
        changed += int((write["input_ids"] != chain.write["input_ids"]).any())
    assert changed


@pytest.mark.parametrize("records", [False, None], ids=["a tree server", "a chain server"])
def test_the_tree_row_s_fault_trials_verify_as_a_tree(monkeypatch, records):
    """The tree row's fired cells come from fault trials whose every target verify, the
    warm-up's and the settle's, is a tree verify (``trials.fault_trial(tree_records=...)``);
    able to fail: a trial of a chain server makes none."""
    from conformance.sglang import trials

    made: list[int] = []
    real = tree.as_tree

    def spy(engine, forward, records=False):
        made.append(len(forward.plan["req_pool_indices"]))
        return real(engine, forward, records)

    monkeypatch.setattr(tree, "as_tree", spy)
    (mode, _) = TARGET.settle_modes
    trials.fault_trial("page_swap", 0, mode, tree_records=records)
    if records is None:
        assert made == []
    else:  # the warm-up's verify and the settle's
        assert len(made) >= 2, made


def _tree_row():
    return next(r for r in matrix.ROWS if r.models == (matrix.TARGET_TREE, matrix.DRAFT_TREE))


def test_the_tree_row_s_draft_history_raises_in_sglang_s_plan_input():
    """[29]: the draft model's correct history, each draft decode step as a tree of
    ``topk`` gives it to the canary (``tree.widen``), raises ``RuntimeError`` in SGLang's
    ``PlanInput`` at its first draft decode step."""
    row = _tree_row()
    outcome = matrix._outcome.__wrapped__(row.page_size, row.window, True, matrix.DRAFT_TREE, 0)
    assert outcome.startswith("raises at step") and "RuntimeError" in outcome, outcome


def test_a_tree_draft_step_that_runs_through_is_caught(monkeypatch):
    """Able to fail: a draft decode step SGLang's canary takes (here, not widened) makes the
    leg say that it does not model a tree's draft decode past the plan input."""
    monkeypatch.setattr(tree, "widen", lambda batch, topk: batch)
    row = _tree_row()
    outcome = matrix._outcome.__wrapped__(row.page_size, row.window, True, matrix.DRAFT_TREE, 0)
    assert "does not model a tree's draft decode" in outcome, outcome


@pytest.mark.parametrize("steps", [1, 3])
def test_sglang_s_tree_kernel_builds_the_leg_s_tree_with_each_node_at_its_depth(steps):
    """SGLang's tree kernel (its Triton build, run) on the leg's tree: node ``j`` at
    ``seq_len + depth(j)``, the path's nodes ``2 d - 1`` linked from the root one after the
    other, each with its sibling ``2 d``. Able to fail: a chain's positions (node ``j`` at
    depth ``j``) are not the kernel's."""
    seq = np.array([7, 11, 2])
    positions, next_token, next_sibling = tree.sglang_tree(seq, steps)
    nodes = 1 + tree.TOPK * steps
    depths = np.array([tree.depth(j) for j in range(nodes)])
    assert (positions == seq[:, None] + depths).all(), positions
    assert steps == 1 or not (positions == seq[:, None] + np.arange(nodes)).all()
    path = [0]
    while next_token[0, path[-1]] != -1:
        path.append(int(next_token[0, path[-1]]))
    assert path == [0, *range(1, nodes, 2)]
    assert [int(next_sibling[0, j]) for j in range(1, nodes, 2)] == list(range(2, nodes, 2))
    assert (next_token == next_token[:1]).all() and (next_sibling == next_sibling[:1]).all()


def test_a_tree_draft_step_s_positions_are_sglang_s_and_its_branches_slots_are_not_modelled():
    """The widened draft step gives each request's position ``topk`` times, as SGLang's
    ``prepare_for_draft`` (run from source) does; SGLang gives each branch slots of its own
    (the row's ``topk * steps`` slots past ``seq_lens``, sliced per step by its
    ``per_step_draft_out_cache_loc``, run), where the widened step repeats the
    chain's, the leg's stated departure, which no launch reads before [29] raises."""
    import torch

    seq, rows = [5, 9], [1, 3]
    table = torch.arange(4 * 32, dtype=torch.int64).reshape(4, 32) + 1000
    positions, slots = tree.sglang_draft_batch(seq, rows, table, tree.TOPK, 3)
    chain = types.SimpleNamespace(  # the chain's first draft step: one token a request
        positions=torch.tensor(seq), input_ids=torch.tensor([7, 8]),
        out_cache_loc=torch.tensor([int(table[r, s]) for r, s in zip(rows, seq, strict=True)]),
    )  # fmt: skip
    wide = tree.widen(dataclass_of(chain), tree.TOPK)
    assert positions.tolist() == wide.positions.tolist() == [5, 5, 9, 9]
    assert positions.tolist() != chain.positions.tolist()  # able to fail: an unwidened step
    utils = loading.sglang_root() / "srt" / "speculative" / "eagle_utils.py"
    per_step = loading.from_source(utils, ("per_step_draft_out_cache_loc",), {})[
        "per_step_draft_out_cache_loc"
    ](slots, len(seq), tree.TOPK, 3)  # SGLang's own slicing of the steps, run
    assert per_step[0].tolist() == [1037, 1040, 1105, 1108]  # step 0: each branch its own
    assert wide.out_cache_loc.tolist() == [1037, 1037, 1105, 1105]


def dataclass_of(namespace):
    """A namespace as a dataclass instance (``tree.widen`` replaces its fields)."""
    fields = list(vars(namespace))
    return dataclasses.make_dataclass("Batch", fields)(**vars(namespace))
