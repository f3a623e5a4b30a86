"""Refusals of the plan kernel and the scatter (CONTRACT §12 P1-P13, §13 S1-S11): each broken
argument raises the contract's exception, with its exact message where the contract gives one
and naming the argument where it does not, before any work: a refused launch changes nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import reference
from conformance.launches import assert_kv_canary_refusal
from conformance.plan_support import implementation_plans, plan_args
from strategies.batches import (
    FAULT_BATCH,
    FAULT_SCATTER,
    BatchFault,
    plan_faults,
    scatter_faults,
)

pytestmark = pytest.mark.plan

ERRORS = {"TypeError": TypeError, "ValueError": ValueError, "IndexError": IndexError}


def _changed(tensor, fault: BatchFault, impl, device):
    """``tensor`` (or an int) broken as ``fault`` says."""
    change, value = fault.change, fault.value
    if change == "kind":
        return {
            "None": None,
            "list": tensor.tolist() if isinstance(tensor, torch.Tensor) else [tensor],
            "ndarray": tensor.cpu().numpy()
            if isinstance(tensor, torch.Tensor)
            else np.array(tensor),
            "float": 4.0,
            "str": "7",
            "bool": True,
            "VerifyPlan": impl.VerifyPlan.allocate(verify_capacity=4, device=device),
        }[value]
    if change == "dtype":
        return tensor.to(getattr(torch, value))
    if change == "shape":
        if value == "2-D":
            return tensor.reshape(1, -1) if tensor.dim() == 1 else tensor.reshape(1, *tensor.shape)
        if value == "1-D":
            return tensor.reshape(-1)
        if value == "longer":
            return torch.cat([tensor, tensor[-1:]])
        return tensor[:-1]
    if change == "strided":
        return torch.stack([tensor, tensor], dim=-1)[..., 0]
    if change == "device":
        return tensor.to(value)
    if change == "set":
        out = tensor.clone()
        out[fault.index] = value
        return out
    if change == "int":
        return value
    if change == "drop":
        return None
    raise AssertionError(f"unknown change {change!r}")


def _replace_field(plan, field: str, value):
    fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
    return type(plan)(**{**fields, field: value})


def faulted_plan_call(impl, device, fault: BatchFault) -> dict:
    """The plan launch's keyword arguments with ``fault`` made."""
    batch = FAULT_BATCH
    if fault.change == "capacity":
        batch = dataclasses.replace(batch, write_req_capacity=fault.value)
    args = plan_args(batch)
    verify, write = implementation_plans(impl, args, device)
    kwargs = {"verify_plan_out": verify, "write_plan_out": write, **args.tensors(device)}
    if fault.change == "rows":
        n = fault.value
        for name in ("req_pool_indices", "prefix_lens", "extend_seq_lens",
                     "req_to_verify_expected_tokens_valid_lens"):  # fmt: skip
            kwargs[name] = torch.zeros(n, dtype=torch.int64, device=device)
        kwargs["write_plan_out"] = impl.WritePlan.allocate(write_req_capacity=n, device=device)
    elif fault.rule == "P13":
        lut = kwargs["full_to_swa_index_mapping"]
        kwargs["full_to_swa_index_mapping"] = lut[: translated_max(batch)].clone()
    elif fault.change != "capacity":
        if fault.rule in ("P10", "P11", "P12"):  # a read past a table must land in no buffer
            for name in ("req_to_token", "req_to_verify_expected_tokens"):
                if kwargs.get(name) is not None:
                    kwargs[name] = _guarded(kwargs[name])
        plan_name, _, field = fault.argument.partition(".")
        if field:
            plan = kwargs[plan_name]
            kwargs[plan_name] = _replace_field(
                plan, field, _changed(getattr(plan, field), fault, impl, device)
            )
        else:
            kwargs[fault.argument] = _changed(kwargs[fault.argument], fault, impl, device)
    return kwargs


def _guarded(table: torch.Tensor) -> torch.Tensor:
    """``table`` copied into the middle rows of a larger allocation: a read outside it (a row
    of -1, a row past the table, a prefix past its row) lands in guard rows that are no buffer
    of the call, so the CPU's memory watch (``conformance.bounds``) reports it whatever else the
    allocator put beside the table. Without them such a read could land in another argument's
    buffer, and pass unseen."""
    guard = table.shape[0] + 8
    padded = torch.zeros(
        (table.shape[0] + 2 * guard, *table.shape[1:]), dtype=table.dtype, device=table.device
    )
    middle = padded[guard : guard + table.shape[0]]
    middle.copy_(table)
    return middle


def translated_max(batch) -> int:
    """The largest slot the plan of ``batch`` translates through its SWA table."""
    a = batch.arrays()
    entries = reference.plan_entries(
        req_pool_indices=a.req_pool_indices, prefix_lens=a.prefix_lens,
        req_to_token=a.req_to_token, swa_window_size=batch.swa_window,
        full_to_swa_index_mapping=None, req_to_verify_expected_tokens=None,
        req_to_verify_expected_tokens_valid_lens=None, kv_token_id_vs_position_offset=0,
    )  # fmt: skip
    live = (a.req_pool_indices != 0) & (a.extend_seq_lens > 0) & (a.prefix_lens > 0)
    seeds = a.req_to_token[a.req_pool_indices[live], a.prefix_lens[live] - 1]
    return int(max(entries.slots.max(), entries.prev_slots.max(), seeds.max()))


def _host(value):
    if isinstance(value, torch.Tensor):
        return value.cpu().numpy().copy()
    if dataclasses.is_dataclass(value):
        return type(value).__name__, {
            f.name: _host(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    return value


def reference_message(fault: BatchFault, kwargs: dict, call) -> str:
    """The exact message of a rule the contract words, as the reference gives it (contiguity,
    which numpy has no word for, as the contract writes it)."""
    if fault.rule in ("P7",) or fault.rule == "S9":
        return f"kv-canary: {fault.argument} must be contiguous"
    with pytest.raises(ERRORS[fault.error]) as caught:
        call({k: _host(v) for k, v in kwargs.items()})
    return str(caught.value)


def _reference_plan(kwargs: dict) -> None:
    verify, write = kwargs.pop("verify_plan_out"), kwargs.pop("write_plan_out")
    reference.plan(reference.VerifyPlan(**verify[1]), reference.WritePlan(**write[1]), **kwargs)


def _snapshot(kwargs: dict) -> list:
    """Every tensor a launch may write, as host copies (none of a tensor on ``meta``)."""
    out = []
    for value in kwargs.values():
        tensors = (
            [getattr(value, f.name) for f in dataclasses.fields(value)]
            if dataclasses.is_dataclass(value)
            else [value]
        )
        out += [t.cpu().numpy().copy() for t in tensors
                if isinstance(t, torch.Tensor) and t.device.type != "meta"]  # fmt: skip
    return out


def check_refusal(launch, kwargs: dict, fault: BatchFault, message: str | None) -> None:
    __tracebackhide__ = True
    before = _snapshot(kwargs)
    if message is None:
        assert_kv_canary_refusal(lambda: launch(**kwargs), ERRORS[fault.error], fault.words)
    else:
        with pytest.raises(Exception) as caught:
            launch(**kwargs)
        got = caught.value
        assert (type(got).__name__, str(got)) == (fault.error, message), (
            f"{fault.id}: raised {type(got).__name__}: {got}; "
            f"CONTRACT requires {fault.error}: {message}"
        )
    after = _snapshot(kwargs)
    changed = [i for i, (b, a) in enumerate(zip(before, after)) if not np.array_equal(b, a)]
    assert not changed, f"{fault.id}: a refused launch changed its tensors {changed}"


@pytest.mark.parametrize("fault", plan_faults(), ids=lambda f: f.id)
def test_plan_refuses_each_broken_argument(impl, device, fault):
    """Each broken plan argument raises the contract's exception and message, and the plans
    stay as they were."""
    kwargs = faulted_plan_call(impl, device, fault)
    message = None if fault.words else reference_message(fault, kwargs, _reference_plan)
    check_refusal(impl.launch_canary_plan_kernels, kwargs, fault, message)


def faulted_scatter_call(impl, device, fault: BatchFault) -> dict:
    flat, offsets, rows, pool = FAULT_SCATTER.arrays()
    kwargs = {
        "flat_in": torch.from_numpy(flat).to(device),
        "offsets": torch.from_numpy(offsets).to(device),
        "req_pool_indices": torch.from_numpy(rows).to(device),
        "pool_out": torch.from_numpy(pool).to(device),
    }
    if fault.change == "rows":
        n = fault.value
        kwargs["req_pool_indices"] = torch.zeros(n, dtype=torch.int64, device=device)
        kwargs["offsets"] = torch.zeros(n + 1, dtype=torch.int64, device=device)
        kwargs["flat_in"] = torch.zeros(0, dtype=torch.int64, device=device)
    else:
        kwargs[fault.argument] = _changed(kwargs[fault.argument], fault, impl, device)
    return kwargs


@pytest.mark.parametrize("fault", scatter_faults(), ids=lambda f: f.id)
def test_scatter_refuses_each_broken_argument(impl, device, fault):
    """Each broken scatter argument raises the contract's exception and message, and the pool
    stays as it was."""
    kwargs = faulted_scatter_call(impl, device, fault)
    message = (
        None if fault.words else reference_message(fault, kwargs, lambda k: reference.scatter(**k))
    )
    check_refusal(impl.launch_scatter_req_token_ids_kernel, kwargs, fault, message)
