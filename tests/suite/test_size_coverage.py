"""The engine-scale properties reach the sizes where scale bugs live, in the ``ci`` profile on
the CPU (the cheapest run the suite has): each boundary below is reached by the draws of the
property that names it, with the number of examples that property runs there.

| property (conformance/test_scale.py)                  | boundaries it reaches |
|-------------------------------------------------------|-----------------------|
| test_long_prefill_in_chunks_equals_reference          | a request of >= 8192 tokens; a chunked prefill: a second launch seeded from the first's last slot |
| test_many_requests_in_one_launch_equal_reference      | >= 256 requests in one launch (twice: a prefill and a decode step) |
| test_big_pages_and_pools_fingerprint_equals_reference | pages of 65 to 256 slots, one not a power of two; sources of > 2^16 slots and one of > 2^20; slots at every power-of-two edge of the capacity and of the in-page index |
| test_long_verify_sweep_equals_reference               | a verify plan of > 32,768 entries (512+ past that lap); a ring of >= 1024 rows; a canary buffer of > 2^16 slots; verified slots at every power-of-two edge of it |

Today's other properties (conformance/test_write_verify.py, test_fingerprint.py) draw worlds
of at most 24 slots, requests of at most 5 tokens, 3 requests a launch and pages of at most 8
on the CPU: none of these boundaries.
"""

from __future__ import annotations

import pytest
from hypothesis import settings

import strategies as st_kv
from conformance import profiles
from conformance import test_scale as scale
from tests.strategies.draws import collect


@pytest.fixture(autouse=True)
def cpu_sizes(monkeypatch):
    """Every check here draws with the CPU's sizes, whatever device loaded the profiles."""
    monkeypatch.setattr(profiles, "ON_CPU", True)


def ci_cpu_examples(weight: float) -> int:
    """The examples a scale property of ``weight`` runs in the ``ci`` profile on the CPU."""
    count = settings.get_profile("ci").max_examples * profiles.CPU_SCALE
    return max(1, round(count * profiles.SCALE_SHARE["cpu"] * weight))


def draws(strategy, weight: float) -> list:
    return collect(strategy, ci_cpu_examples(weight))


def test_the_prefill_property_reaches_8192_tokens_and_a_chunked_prefill():
    """A request of 8192+ tokens, and a second launch continuing its chain from its last slot."""
    for case in draws(scale.prefill_cases(), 1):
        first, second = case.writes
        longest = max(len([s for s in r.slots if s >= 0]) for r in first.requests)
        assert longest >= 8192, f"the longest request writes {longest} tokens"
        tail = max(st_kv.chains_written(first), key=lambda chain: len(chain.slots)).slots[-1]
        assert all(r.seed == tail for r in second.requests), (
            f"the second launch's seeds {[r.seed for r in second.requests]} are not the "
            f"prefill's last slot {tail}"
        )
        assert st_kv.chains_written(second), "the chunked prefill's second launch writes nothing"


def test_the_many_request_property_reaches_256_requests_in_one_launch():
    """Both launches of every draw hold more than 256 requests, all of them active."""
    for case in draws(scale.many_request_cases(), 1):
        for batch in case.writes:
            assert batch.active > 256, f"a launch of {batch.active} active requests"


def test_the_pool_property_reaches_big_pages_and_pools_and_every_edge():
    """Pages of 65 to 256 (one not a power of two), sources past 2^16 slots and one past
    2^20, and a slot at every power-of-two edge of the capacity and of the big page."""
    cases = draws(scale.pool_cases(), 3)
    pages = [layout.page_size for case in cases for layout in case.layouts[:1]]
    assert all(64 < page <= 256 for page in pages), f"big-page sources of pages {pages}"
    assert any(page & (page - 1) for page in pages), f"only powers of two among pages {pages}"
    capacities = [min(layout.capacity for layout in case.layouts) for case in cases]
    assert min(capacities) > 2**16, f"call capacities {capacities}"
    assert max(capacities) > 2**20, f"no call reads a source past 2^20 slots: {capacities}"
    for case, capacity in zip(cases, capacities, strict=True):
        page = case.layouts[0].page_size
        missing = set(st_kv.capacity_edges(capacity, page)) - set(case.slots)
        assert not missing, f"slots {sorted(missing)} at edges of {capacity} are not drawn"


def test_the_sweep_property_reaches_32768_entries_a_1024_row_ring_and_2_to_16_slots():
    """A plan past 32,768 entries, a ring of 1024+ rows, a buffer of 2^16+ slots, and every
    power-of-two edge of that buffer among the verified slots."""
    for case in draws(scale.sweep_cases(), 1):
        # a lap bug shows only where an entry past the lap reports: 512 of them, not one
        assert case.plan.active >= 32768 + 512, f"a sweep of {case.plan.active} active entries"
        assert case.world.ring_capacity >= 1024, f"a ring of {case.world.ring_capacity} rows"
        assert case.world.num_slots > 2**16, f"a buffer of {case.world.num_slots} slots"
        missing = set(st_kv.capacity_edges(case.world.num_slots)) - {0} - set(case.plan.slots)
        assert not missing, f"edge slots {sorted(missing)} are never verified"


def test_the_ci_profile_on_the_cpu_runs_each_scale_property_at_least_once():
    """The counts the checks above use are those of the ci profile on the CPU, at least one."""
    assert [ci_cpu_examples(w) for w in (1, 2, 3)] == [1, 2, 3]


@pytest.mark.parametrize(
    "strategy",
    [scale.prefill_cases, scale.many_request_cases, scale.sweep_cases, scale.pool_cases],
    ids=lambda strategy: strategy.__name__,
)
def test_a_failing_scale_example_prints_in_a_few_lines(strategy):
    """Hypothesis prints a failing example through its pretty printer; a scale case must
    print as its sizes, not its entries (77 kB for 257 requests, which Hypothesis refuses
    with a HypothesisWarning that turned the known-bad gate's kills into crashes)."""
    from hypothesis.internal.reflection import nicerepr

    (case,) = draws(strategy(), 1)[:1]
    text = nicerepr(case)
    assert len(text) < 2000, f"{len(text)} characters: {text[:200]}..."
