"""The expected-token scatter (CONTRACT §13): each request's tokens land in its pool row, cut to
32 bits and dropped past the row's end, and nothing else of the pool changes."""

from __future__ import annotations

import pytest
from hypothesis import given, target

from conformance import profiles
from conformance.assertions import to_numpy
from conformance.driver import assert_same_pool
from conformance.plan_support import reference_scatter, scatter_snippet, scatter_tensors
from conformance.profiles import examples
from strategies.batches import ScatterBatch, scatter_batches

pytestmark = pytest.mark.plan


def scatter_sizes() -> dict:
    if profiles.ON_CPU:
        return dict(max_reqs=8, max_context_len=24)
    return dict(max_reqs=512, max_context_len=2048)


def check_scatter(impl, impl_name, device, batch: ScatterBatch) -> None:
    __tracebackhide__ = True
    tensors = scatter_tensors(batch, device)
    impl.launch_scatter_req_token_ids_kernel(**tensors)
    assert_same_pool(
        to_numpy(tensors["pool_out"]),
        reference_scatter(batch),
        what="launch_scatter_req_token_ids_kernel",
        config=f"{batch.num_rows} pool rows x {batch.context_len}, requests to rows "
        f"{list(batch.pool_rows)[:12]} with {list(batch.lengths)[:12]} tokens",
        repro=scatter_snippet(impl_name, device, batch),
    )


@examples(0.5)
@given(batch=scatter_batches(**scatter_sizes()))
def test_scatter_equals_reference(impl, impl_name, device, batch):
    """Every request's tokens land in its pool row as the reference puts them, and every other
    pool entry keeps its value."""
    target(float(sum(batch.lengths)), label="tokens")
    check_scatter(impl, impl_name, device, batch)


@pytest.mark.parametrize("bs", [511, 512, 4096])
def test_scatter_takes_every_batch_the_plan_takes(impl, impl_name, device, bs):
    """A scatter of up to 4096 requests (the plan's cap) is taken and lands as the reference's,
    past SGLang's 511 too (CONTRACT §13 S8)."""
    lengths = tuple((3 * i) % 7 for i in range(bs))
    batch = ScatterBatch(
        pool_rows=tuple(range(1, bs + 1)), lengths=lengths, num_rows=bs + 1, context_len=5, seed=bs
    )
    check_scatter(impl, impl_name, device, batch)
