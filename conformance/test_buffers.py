"""The plans and the context (CONTRACT §5): the plans' ``allocate`` refuses a capacity below
one or of the wrong kind (CONTRACT §11) and makes tensors of the contract's shapes; the
context and both plans are frozen, keyword-only dataclasses; and a plan past 256 entries
launches like a small one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conformance.launches import STATE, assert_kv_canary_refusal, launch_of, world

pytestmark = pytest.mark.write_verify

#: The capacity keyword of each plan type's ``allocate``.
PLAN_CAPACITIES = {"VerifyPlan": "verify_capacity", "WritePlan": "write_req_capacity"}


def allocate(impl, device, plan_type: str, capacity):
    return getattr(impl, plan_type).allocate(
        **{PLAN_CAPACITIES[plan_type]: capacity, "device": device}
    )


@pytest.mark.parametrize("capacity", [0, -1])
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_refuses_a_capacity_below_one(impl, device, plan_type, capacity):
    """allocate with a capacity <= 0 is a ValueError naming the capacity and its value."""
    assert_kv_canary_refusal(
        lambda: allocate(impl, device, plan_type, capacity),
        ValueError,
        (PLAN_CAPACITIES[plan_type], str(capacity)),
    )


@pytest.mark.parametrize("capacity", [True, 2.0, None, "4"], ids=["True", "2.0", "None", "'4'"])
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_refuses_a_capacity_that_is_no_int(impl, device, plan_type, capacity):
    """A capacity that is not an int (a bool is no capacity either) is a TypeError naming it."""
    assert_kv_canary_refusal(
        lambda: allocate(impl, device, plan_type, capacity),
        TypeError,
        (PLAN_CAPACITIES[plan_type],),
    )


@pytest.mark.parametrize("numpy_int", [np.int16, np.int64, np.uint32], ids=lambda t: t.__name__)
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_takes_a_numpy_integer_capacity(impl, device, plan_type, numpy_int):
    """A numpy integer capacity is an int (CONTRACT §11): it makes the plan its Python int
    makes, and a numpy 0 is refused as 0 is, with a ValueError naming the capacity."""
    got = allocate(impl, device, plan_type, numpy_int(3))
    want = allocate(impl, device, plan_type, 3)
    for field in dataclasses.fields(want):
        tensor, expected = getattr(got, field.name), getattr(want, field.name)
        assert (tuple(tensor.shape), tensor.dtype) == (tuple(expected.shape), expected.dtype), (
            f"{field.name}: {tensor.shape} {tensor.dtype}, want {expected.shape} {expected.dtype}"
        )
    assert_kv_canary_refusal(
        lambda: allocate(impl, device, plan_type, numpy_int(0)),
        ValueError,
        (PLAN_CAPACITIES[plan_type], "0"),
    )


@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_takes_keywords_only(impl, device, plan_type):
    """allocate(capacity=, device=) by name only, as the contract spells it."""
    with pytest.raises(TypeError):
        getattr(impl, plan_type).allocate(3, device)
    with pytest.raises(TypeError):
        getattr(impl, plan_type).allocate(3, device=device)


@pytest.mark.parametrize("capacity", [1, 5])
def test_allocated_plans_have_the_contract_shapes(impl, device, capacity):
    """A fresh plan's tensors have CONTRACT §5's shapes, dtypes and device, and a verify plan is
    enabled; the values of the other entries are left to the caller to fill in."""
    verify = allocate(impl, device, "VerifyPlan", capacity)
    write = allocate(impl, device, "WritePlan", capacity)
    expected = {
        (verify, "verify_slot_indices"): ((capacity,), torch.int64),
        (verify, "verify_expected_tokens"): ((capacity,), torch.int64),
        (verify, "verify_expected_positions"): ((capacity,), torch.int64),
        (verify, "verify_prev_slot_indices"): ((capacity,), torch.int64),
        (verify, "verify_num_valid"): ((1,), torch.int32),
        (verify, "enable"): ((1,), torch.int32),
        (write, "write_offsets"): ((capacity + 1,), torch.int64),
        (write, "write_seed_slot_indices"): ((capacity,), torch.int64),
        (write, "write_num_valid_reqs"): ((1,), torch.int32),
    }
    for (plan, field), (shape, dtype) in expected.items():
        tensor = getattr(plan, field)
        assert (tuple(tensor.shape), tensor.dtype) == (shape, dtype), (
            f"{field}: {tensor.shape} {tensor.dtype}"
        )
        assert tensor.device.type == torch.device(device).type, f"{field} on {tensor.device}"
    assert int(verify.enable[0]) == 1, "a fresh VerifyPlan must be enabled"


@pytest.mark.parametrize("type_name", ["VerifyOrWriteContext", "VerifyPlan", "WritePlan"])
def test_context_and_plans_are_frozen_and_keyword_only(impl, device, type_name):
    """The context and both plans are frozen dataclasses whose fields are given by name."""
    cls = getattr(impl, type_name)
    fields = [field.name for field in dataclasses.fields(cls)]
    with pytest.raises(TypeError):
        cls(*range(len(fields)))
    if type_name == "VerifyOrWriteContext":
        instance = world(impl, device)[0].context(impl)
    else:
        instance = allocate(impl, device, type_name, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, fields[0], getattr(instance, fields[0]))


@pytest.mark.parametrize("kind", ["write", "verify"])
def test_plans_past_256_entries_are_accepted(impl, device, kind):
    """The same launch with its plan grown to 300 entries (the extra ones not valid) runs and
    does exactly what the small plan does: sizes past 256 are compared by value."""
    small_world, small = launch_of(kind, impl, device)
    small.run(impl)
    made, launch = launch_of(kind, impl, device)
    if kind == "write":
        plan = impl.WritePlan.allocate(write_req_capacity=300, device=device)
        plan.write_seed_slot_indices.fill_(-1)
    else:
        plan = impl.VerifyPlan.allocate(verify_capacity=300, device=device)
        plan.verify_slot_indices.zero_()
    for name, values in launch.plan.items():
        grown = getattr(plan, name)
        if grown.shape != values.shape:
            grown[values.shape[0] :] = values[-1] if name == "write_offsets" else 0
        grown[: values.shape[0]] = values
        launch.plan[name] = grown
    launch.run(impl)
    for name in STATE:
        assert torch.equal(getattr(made, name), getattr(small_world, name)), name
