"""Golden plan and scatter vectors (conformance/golden/plan.json): the implementation makes
every stored plan and pool exactly, the 4096-row, 70,000-entry batch among them."""

from __future__ import annotations

import pytest

from conformance import golden
from conformance.assertions import fail, to_numpy
from conformance.plan_support import (
    implementation_plan,
    plan_args,
    plan_differences,
    reference_plan,
    scatter_tensors,
)

pytestmark = pytest.mark.plan

VECTORS = golden.load(golden.PLAN_FILE)
PLANS = [v for v in VECTORS if "expected" in v and "pool_out" not in v["expected"]]
SCATTERS = [v for v in VECTORS if "pool_out" in v["expected"]]


def _stored_differences(got: dict, vector: dict) -> list[str]:
    return [
        f"{name}: got {golden.stored_array(value)}, stored {vector['expected'][name]}"
        for name, value in got.items()
        if golden.stored_array(value) != vector["expected"][name]
    ]


@pytest.mark.parametrize("vector", PLANS, ids=[v["id"] for v in PLANS])
def test_plan_vector(impl, device, vector):
    """launch_canary_plan_kernels makes every field of both stored plans, exactly."""
    batch = golden.batch_of(vector)
    args = plan_args(batch)
    got = implementation_plan(impl, args, device)
    problems = _stored_differences({name: value for (_, name), value in got.items()}, vector)
    if problems:
        # name the entries too: the reference makes what is stored
        detail = plan_differences(got, reference_plan(args))
        fail(
            f"golden vector {vector['id']} ({vector['what']}): the plans differ from "
            f"conformance/golden/{golden.PLAN_FILE}:\n  " + "\n  ".join(problems + detail)
        )


@pytest.mark.parametrize("vector", SCATTERS, ids=[v["id"] for v in SCATTERS])
def test_scatter_vector(impl, device, vector):
    """launch_scatter_req_token_ids_kernel leaves the stored pool, exactly."""
    tensors = scatter_tensors(golden.scatter_of(vector), device)
    impl.launch_scatter_req_token_ids_kernel(**tensors)
    got = golden.stored_array(to_numpy(tensors["pool_out"]))
    if got != vector["expected"]["pool_out"]:
        fail(
            f"golden vector {vector['id']} ({vector['what']}): pool_out differs from "
            f"conformance/golden/{golden.PLAN_FILE}: got {got}"
        )
