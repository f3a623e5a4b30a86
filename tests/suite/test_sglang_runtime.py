"""The runtime leg (conformance.sglang_runtime, its parts in conformance.sglang): SGLang's
PlanInput equals the engine model's plan inputs in every forward mode, the stand-ins provide
every field SGLang's code reads, a plan input off by one in any mode is caught, SGLang's
TokenOracleManager takes its expected inputs where the engine model does (the token oracle's or
the input ids, per mode), SGLang's perturbations are judged by their classes, a PD transfer over
SGLang's spliced buffer list moves each page's records with its KV (and, without the splice,
does not), and the histories' seeds and step labels are what the legs say."""

from __future__ import annotations

import ast
import copy
import dataclasses
import re

import numpy as np
import pytest

from conformance import sglang_runtime
from conformance.sglang import compare, histories, loading, splice, standins, trials
from engine_model import faults
from engine_model.vocabulary import FORWARD_MODES, ORACLE_MODES


def test_sglang_plan_input_equals_the_engine_models_in_every_mode(capsys):
    assert sglang_runtime.main([]) == 0
    out = capsys.readouterr().out
    for name in histories.REQUIRED:
        assert re.search(rf"  {re.escape(name)}: [1-9]\d* forwards equal", out), (name, out)
    line = next(x for x in out.splitlines() if x.startswith("TokenOracleManager"))
    assert line.endswith("forwards equal"), line
    for mode in histories.EXPECTED_INPUTS_REQUIRED:
        assert re.search(rf"{mode} [1-9]", line), (mode, line)


def read_attributes(name: str, module: str = "plan_input.py") -> set[str]:
    """The attributes a module of SGLang's kv_canary reads of a variable called ``name`` (or of
    ``forward_batch.<name>``)."""
    source = (loading.sglang_root() / "srt" / "kv_canary" / module).read_text()
    out = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == name:
            out.add(node.attr)
        if isinstance(base, ast.Attribute) and base.attr == name:
            out.add(node.attr)
    return out


ORACLE_MANAGER = "token_oracle/oracle_manager.py"


def test_the_stand_ins_provide_every_field_sglang_reads():
    plan = read_attributes("forward_batch")
    fields = set(standins.FORWARD_BATCH_FIELDS)
    assert plan == fields, plan ^ fields
    oracle = read_attributes("forward_batch", ORACLE_MANAGER) - plan
    assert oracle == set(standins.TOKEN_ORACLE_FIELDS), oracle ^ set(standins.TOKEN_ORACLE_FIELDS)
    assert set(standins.FORWARD_BATCH_FIELDS + standins.TOKEN_ORACLE_FIELDS) == {
        f.name for f in dataclasses.fields(standins.ForwardBatchStandIn)
    }
    spec = read_attributes("spec_info") | read_attributes("spec_info", ORACLE_MANAGER)
    assert spec == {f.name for f in dataclasses.fields(standins.SpecInfoStandIn)}, spec


def _one_of_each_mode() -> dict:
    seen: dict = {}
    for index in range(sglang_runtime.HISTORIES):
        for forward in histories.history(index):
            if compare.compare_plan_inputs(forward) is not None:
                seen.setdefault(str(histories.step_label(forward)), forward)
    return seen


# SGLang copies ``req_pool_indices`` and the valid lengths from the batch, which the stand-in
# takes from the plan: the leg compares the fields SGLang derives per mode
@pytest.mark.parametrize("field", ["prefix_lens", "extend_seq_lens"])
def test_a_plan_input_off_by_one_is_caught_in_every_mode(field):
    seen = _one_of_each_mode()
    assert set(histories.REQUIRED) <= set(seen)
    for name, forward in seen.items():
        plan = dict(forward.plan)
        plan[field] = np.asarray(plan[field]) + 1
        wrong = dataclasses.replace(forward, plan=plan)
        lines = compare.compare_plan_inputs(wrong)
        assert lines, (name, field)


@pytest.mark.parametrize("mode", ["DRAFT_EXTEND_V2", "DECODE", "EXTEND", "TARGET_VERIFY"])
def test_expected_inputs_from_the_wrong_source_are_caught(monkeypatch, mode):
    """The leg holds the engine model's choice of expected inputs (the token oracle's or the
    input ids) to what SGLang's TokenOracleManager takes: the other choice in a mode fails."""
    forward = _one_of_each_mode()[mode]
    assert compare.expected_inputs(forward) == []
    flipped = set(ORACLE_MODES) ^ {mode}
    monkeypatch.setattr(compare, "ORACLE_MODES", tuple(flipped))
    assert compare.expected_inputs(forward), mode


def test_the_tree_stand_in_provides_what_sglangs_sweep_reads():
    module = "sweep_plan_builder.py"
    assert read_attributes("radix_cache", module) == {"req_to_token_pool"}
    assert read_attributes("walk_result", module) == {
        "slot_indices", "positions", "prev_slot_indices"
    }  # fmt: skip
    # req_to_token_pool is what SGLang reads; walk, unlocked and lut are the stand-in walker's
    assert {f.name for f in dataclasses.fields(standins.RadixCacheStandIn)} == {
        "req_to_token_pool", "walk", "unlocked", "lut"
    }  # fmt: skip
    # the unused-cache perturbation reads the tree only through the walker
    assert read_attributes("radix_cache", "perturb/real_kv_unused_cache.py") == set()


def _a_sweep(window: bool):
    found: list = []

    def keep(engine, sweep):  # the engine as it is at the sweep (its SWA table changes after)
        if (engine.lut is not None) == window:
            found.append((copy.deepcopy(engine), sweep))

    for index in range(sglang_runtime.HISTORIES):
        histories.history(index, on_sweep=keep)
        if found:
            return found[0]
    raise AssertionError("no sweep")


@pytest.mark.parametrize("field", ["slots", "positions", "prev_slots"])
def test_an_swa_sweep_entry_off_by_one_is_caught(field):
    """SGLang's sweep plans over the engine model's cache walk equal the model's sweep in both
    groups (without a window too), and an entry of the SWA group off by one in any field is
    caught (the FULL group's plan is the walk itself, which the stand-in supplies)."""
    assert compare.compare_sweep(*_a_sweep(False)) == []
    engine, sweep = _a_sweep(True)
    assert compare.compare_sweep(engine, sweep) == []
    group = sweep.group("SWA")
    wrong = dataclasses.replace(group, **{field: getattr(group, field) + 1})
    groups = tuple(wrong if g is group else g for g in sweep.groups)
    assert compare.compare_sweep(engine, dataclasses.replace(sweep, groups=groups)), field


def test_the_perturbation_stand_in_provides_what_sglangs_perturbation_reads():
    read = set()
    for module in ("slot_picker.py", "req_to_token.py", "utils.py"):
        read |= read_attributes("maybe_inaccurate_forward_batch", f"perturb/{module}")
    fields = {f.name for f in dataclasses.fields(standins.PerturbBatchStandIn)}
    assert read and read <= fields, read - fields


def test_the_perturbation_trials_are_fault_classes_of_the_engine_model():
    """Each of SGLang's five perturbations is judged by the fault class of its name."""
    assert len(trials.PERTURBATION_TRIALS) == 5
    assert set(trials.PERTURBATION_TRIALS) <= set(faults.FAULTS)


def test_sglangs_req_to_token_perturbation_is_judged_by_the_class(monkeypatch):
    """SGLang's own perturbation, made on the engine model, is reported where the req_to_token
    class predicts; a prediction at a slot no report names fails the trial."""
    assert trials.req_to_token_trial(0) == ("reported", [])
    cls = faults.FAULTS[trials.REQ_TO_TOKEN]
    monkeypatch.setattr(cls, "due", lambda engine, fault, buffers: ([faults.Due(10**6, 1)], False))
    outcome, problems = trials.req_to_token_trial(0)
    assert outcome == "reported" and problems, problems


@pytest.mark.parametrize("fault_class", sorted(trials.KV_PERTURBATIONS))
def test_sglangs_kv_perturbations_are_judged_by_their_class(monkeypatch, fault_class):
    """SGLang's real_kv_used, real_kv_post_forward and real_kv_unused_cache perturbations, made by its own code on
    copies of the reference's KV pools, flip the byte their class predicts is reported (history
    1: hash mode PARTIAL, which reads byte 0); a prediction at a slot no report names fails."""
    assert trials.kv_perturbation_trial(fault_class, 1) == ("reported", [])
    monkeypatch.setattr(
        faults.FAULTS[fault_class], "due",
        lambda engine, fault, buffers: ([faults.Due(10**6, 4)], False),
    )  # fmt: skip
    outcome, problems = trials.kv_perturbation_trial(fault_class, 1)
    assert problems, outcome


def test_sglangs_next_token_swap_is_judged_by_the_class(monkeypatch):
    """SGLang's sampler hook swaps two of the engine's sampled tokens, reported where the
    next_token_swap class predicts (WRITE_TOKEN at the slots the decodes write them to); a
    prediction at a slot no report names fails the trial."""
    assert trials.swap_trial(0) == ("reported", [])
    monkeypatch.setattr(
        faults.FAULTS[trials.NEXT_TOKEN_SWAP], "due_after_settle",
        lambda engine, fault: [faults.Due(10**6, 8)],
    )  # fmt: skip
    outcome, problems = trials.swap_trial(0)
    assert outcome == "reported" and problems, problems


def test_a_pd_transfer_over_sglangs_splice_moves_each_pages_records_with_its_kv():
    assert splice.transfer(splice=True) == []
    lost = splice.transfer(splice=False)  # the KV layers alone
    assert len(lost) == splice.SLOTS_MOVED and all("records did not" in x for x in lost), lost


def test_without_sglang_the_leg_says_so_and_fails(monkeypatch, capsys):
    def missing():
        raise ImportError("sglang is not installed; pip install --no-deps sglang==X (0.5.13+)")

    monkeypatch.setattr(loading, "runtime", missing)
    assert sglang_runtime.main([]) == 2
    assert "sglang is not installed" in capsys.readouterr().err


def test_the_legs_seeds_never_meet():
    """No two kinds of the legs' engines share a seed at the indices the legs use (every index
    below 200), so that a trial is never a history under another name."""
    seeds = histories.SEEDS
    engines = [
        seeds.history, seeds.req_to_token_trial, seeds.kv_perturbation_trial,
        seeds.fault_trial, seeds.next_token_swap_trial, seeds.shared_prefix_trial,
    ]  # fmt: skip
    used = [{seed(index) for index in range(200)} for seed in engines]
    assert all(a.isdisjoint(b) for i, a in enumerate(used) for b in used[i + 1 :])


def test_the_step_labels_are_the_vocabularys():
    """The labels the runtime leg requires cover every forward mode, and read as the leg
    printed them before they were derived from the vocabulary."""
    assert {label.mode for label in histories.REQUIRED_STEPS} == set(FORWARD_MODES)
    assert set(histories.EXPECTED_INPUTS_REQUIRED) == set(FORWARD_MODES)
    assert "DECODE replaying a graph" in histories.REQUIRED
    assert "DECODE of the draft model" in histories.REQUIRED
    assert "EXTEND on the prefill engine" in histories.REQUIRED
