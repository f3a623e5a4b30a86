"""conformance.sglang_runtime: SGLang's PlanInput equals the engine model's plan inputs in every
forward mode, the stand-ins provide every field SGLang's code reads, a plan input off by one
in any mode is caught, and a PD transfer over SGLang's spliced buffer list moves each page's
records with its KV (and, without the splice, does not)."""

from __future__ import annotations

import ast
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


def _read_attributes(name: str) -> set[str]:
    """The attributes SGLang's plan_input.py reads of a variable called ``name``."""
    source = (sr.sglang_root() / "srt" / "kv_canary" / "plan_input.py").read_text()
    return {
        node.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == name
    }


def test_the_stand_ins_provide_every_field_sglang_reads():
    read = _read_attributes("forward_batch")
    assert read == set(sr.FORWARD_BATCH_FIELDS), read ^ set(sr.FORWARD_BATCH_FIELDS)
    assert set(sr.FORWARD_BATCH_FIELDS) == {
        f.name for f in dataclasses.fields(sr.ForwardBatchStandIn)
    }
    spec = _read_attributes("spec_info") - {"draft_token_num"}
    assert {f.name for f in dataclasses.fields(sr.SpecInfoStandIn)} == {"draft_token_num"}
    assert not spec, f"SGLang reads more of spec_info: {spec}"


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
