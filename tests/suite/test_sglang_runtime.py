"""conformance.sglang_runtime: SGLang's PlanInput equals the engine model's plan inputs in every
forward mode, the stand-ins provide every field SGLang's code reads, a plan input off by one
in any mode is caught, SGLang's TokenOracleManager takes its expected inputs where the
engine model does (the token oracle's or the input ids, per mode), and a PD transfer over SGLang's spliced buffer list moves each page's
records with its KV (and, without the splice, does not)."""

from __future__ import annotations

import ast
import copy
import dataclasses
import re

import numpy as np
import pytest

from conformance import sglang_runtime as sr


def test_sglang_plan_input_equals_the_engine_models_in_every_mode(capsys):
    assert sr.main([]) == 0
    out = capsys.readouterr().out
    for name in sr.REQUIRED:
        assert re.search(rf"  {re.escape(name)}: [1-9]\d* forwards equal", out), (name, out)
    line = next(x for x in out.splitlines() if x.startswith("TokenOracleManager"))
    assert line.endswith("forwards equal"), line
    for mode in sr.ORACLE_MODES_REQUIRED:
        assert re.search(rf"{mode} [1-9]", line), (mode, line)


def _read_attributes(name: str, module: str = "plan_input.py") -> set[str]:
    """The attributes a module of SGLang's kv_canary reads of a variable called ``name`` (or of
    ``forward_batch.<name>``)."""
    source = (sr.sglang_root() / "srt" / "kv_canary" / module).read_text()
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
    plan = _read_attributes("forward_batch")
    assert plan == set(sr.FORWARD_BATCH_FIELDS), plan ^ set(sr.FORWARD_BATCH_FIELDS)
    oracle = _read_attributes("forward_batch", ORACLE_MANAGER) - plan
    assert oracle == set(sr.ORACLE_FIELDS), oracle ^ set(sr.ORACLE_FIELDS)
    assert set(sr.FORWARD_BATCH_FIELDS + sr.ORACLE_FIELDS) == {
        f.name for f in dataclasses.fields(sr.ForwardBatchStandIn)
    }
    spec = _read_attributes("spec_info") | _read_attributes("spec_info", ORACLE_MANAGER)
    assert spec == {f.name for f in dataclasses.fields(sr.SpecInfoStandIn)}, spec


def _one_of_each_mode() -> dict:
    seen: dict = {}
    for index in range(sr.HISTORIES):
        for forward in sr.history(index):
            if sr.compare(forward) is not None:
                seen.setdefault(sr.label(forward), forward)
    return seen


# SGLang copies ``req_pool_indices`` and the valid lengths from the batch, which the stand-in
# takes from the plan: the leg compares the fields SGLang derives per mode
@pytest.mark.parametrize("field", ["prefix_lens", "extend_seq_lens"])
def test_a_plan_input_off_by_one_is_caught_in_every_mode(field):
    seen = _one_of_each_mode()
    assert set(sr.REQUIRED) <= set(seen)
    for name, forward in seen.items():
        plan = dict(forward.plan)
        plan[field] = np.asarray(plan[field]) + 1
        wrong = dataclasses.replace(forward, plan=plan)
        lines = sr.compare(wrong)
        assert lines, (name, field)


@pytest.mark.parametrize("mode", ["DRAFT_EXTEND_V2", "DECODE", "EXTEND", "TARGET_VERIFY"])
def test_expected_inputs_from_the_wrong_source_are_caught(monkeypatch, mode):
    """The leg holds the engine model's choice of expected inputs (the token oracle's or the
    input ids) to what SGLang's TokenOracleManager takes: the other choice in a mode fails."""
    forward = _one_of_each_mode()[mode]
    assert sr.expected_inputs(forward) == []
    flipped = set(sr.ORACLE_MODES) ^ {mode}
    monkeypatch.setattr(sr, "ORACLE_MODES", tuple(flipped))
    assert sr.expected_inputs(forward), mode


def test_the_tree_stand_in_provides_what_sglangs_sweep_reads():
    module = "sweep_plan_builder.py"
    assert _read_attributes("radix_cache", module) == {"req_to_token_pool"}
    assert _read_attributes("walk_result", module) == {
        "slot_indices", "positions", "prev_slot_indices"
    }  # fmt: skip
    # req_to_token_pool is what SGLang reads; walk, unlocked and lut are the stand-in walker's
    assert {f.name for f in dataclasses.fields(sr.RadixCacheStandIn)} == {
        "req_to_token_pool", "walk", "unlocked", "lut"
    }  # fmt: skip
    # the unused-cache perturbation reads the tree only through the walker
    assert _read_attributes("radix_cache", "perturb/real_kv_unused_cache.py") == set()


def _a_sweep(window: bool):
    found: list = []

    def keep(engine, sweep):  # the engine as it is at the sweep (its SWA table changes after)
        if (engine.lut is not None) == window:
            found.append((copy.deepcopy(engine), sweep))

    for index in range(sr.HISTORIES):
        sr.history(index, on_sweep=keep)
        if found:
            return found[0]
    raise AssertionError("no sweep")


@pytest.mark.parametrize("field", ["slots", "positions", "prev_slots"])
def test_an_swa_sweep_entry_off_by_one_is_caught(field):
    """SGLang's sweep plans over the engine model's cache walk equal the model's sweep in both
    groups (without a window too), and an entry of the SWA group off by one in any field is
    caught (the FULL group's plan is the walk itself, which the stand-in supplies)."""
    assert sr.compare_sweep(*_a_sweep(False)) == []
    engine, sweep = _a_sweep(True)
    assert sr.compare_sweep(engine, sweep) == []
    group = sweep.group("SWA")
    wrong = dataclasses.replace(group, **{field: getattr(group, field) + 1})
    groups = tuple(wrong if g is group else g for g in sweep.groups)
    assert sr.compare_sweep(engine, dataclasses.replace(sweep, groups=groups)), field


def test_the_perturbation_stand_in_provides_what_sglangs_perturbation_reads():
    read = set()
    for module in ("slot_picker.py", "req_to_token.py", "utils.py"):
        read |= _read_attributes("maybe_inaccurate_forward_batch", f"perturb/{module}")
    fields = {f.name for f in dataclasses.fields(sr.PerturbBatchStandIn)}
    assert read and read <= fields, read - fields


def test_sglangs_req_to_token_perturbation_is_judged_by_the_class(monkeypatch):
    """SGLang's own perturbation, made on the engine model, is reported where the req_to_token
    class predicts; a prediction at a slot no report names fails the trial."""
    assert sr.perturbation_trial(0) == ("reported", [])
    from engine_model import faults

    cls = faults.FAULTS["req_to_token"]
    monkeypatch.setattr(cls, "due", lambda engine, fault, buffers: ([faults.Due(10**6, 1)], False))
    outcome, problems = sr.perturbation_trial(0)
    assert outcome == "reported" and problems, problems


@pytest.mark.parametrize("kind", sorted(sr.KV_PERTURBATIONS))
def test_sglangs_kv_perturbations_are_judged_by_their_class(monkeypatch, kind):
    """SGLang's real_kv_used, real_kv_post_forward and real_kv_unused_cache perturbations, made by its own code on
    copies of the reference's KV pools, flip the byte their class predicts is reported (history
    1: mode PARTIAL, which reads byte 0); a prediction at a slot no report names fails."""
    assert sr.kv_perturbation_trial(kind, 1) == ("reported", [])
    from engine_model import faults

    monkeypatch.setattr(
        faults.FAULTS[kind], "due", lambda engine, fault, buffers: ([faults.Due(10**6, 4)], False)
    )
    outcome, problems = sr.kv_perturbation_trial(kind, 1)
    assert problems, outcome


def test_sglangs_next_token_swap_is_judged_by_the_class(monkeypatch):
    """SGLang's sampler hook swaps two of the engine's sampled tokens, reported where the
    next_token_swap class predicts (WRITE_TOKEN at the slots the decodes write them to); a
    prediction at a slot no report names fails the trial."""
    assert sr.swap_trial(0) == ("reported", [])
    from engine_model import faults

    monkeypatch.setattr(
        faults.FAULTS["next_token_swap"], "due_after_settle",
        lambda engine, fault: [faults.Due(10**6, 8)],
    )  # fmt: skip
    outcome, problems = sr.swap_trial(0)
    assert outcome == "reported" and problems, problems


def test_a_pd_transfer_over_sglangs_splice_moves_each_pages_records_with_its_kv():
    assert sr.transfer(splice=True) == []
    lost = sr.transfer(splice=False)  # the KV layers alone
    assert len(lost) == 12 and all("records did not" in line for line in lost), lost


def test_without_sglang_the_leg_says_so_and_fails(monkeypatch, capsys):
    def missing():
        raise ImportError("sglang is not installed; pip install --no-deps sglang==X (0.5.13+)")

    monkeypatch.setattr(sr, "runtime", missing)
    assert sr.main([]) == 2
    assert "sglang is not installed" in capsys.readouterr().err
