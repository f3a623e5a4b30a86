"""CPU write and verify: canary_torch and the numpy reference on the launches an
engine runs (decode batches, prefill chunks, a sweep) and on those of the suite's
engine-scale tests (an 8192-token prefill, a 33,000-entry sweep), ALL mode, K and V of one
layer.

Each scenario's records are set up once; the timed launch rewrites (or re-checks) the same
records every round, so rounds are identical and must report no violation.
"""

from __future__ import annotations

import numpy as np
import pytest

import canary
import canary_torch
import reference
from benchmarks import report, workloads

NUM_SOURCES = 2
READ_BYTES = 128
MODE = reference.RealKvHashMode.ALL

SCENARIOS = {
    **workloads.engine_scenarios(sweep_requests=8, sweep_length=1024),
    **workloads.scale_scenarios(),
}
WRITE_SCENARIOS = [name for name in SCENARIOS if not name.startswith("sweep")]
IMPLS = ("torch_backend", "reference")


class Prepared:
    """A scenario's state after its setup write and its write: ready to time either launch."""

    def __init__(self, impl_name: str, scenario: workloads.Scenario, layout, pool):
        self.impl_name = impl_name
        self.scenario = scenario
        sources = workloads.kv_sources(canary, pool, layout, NUM_SOURCES, READ_BYTES)
        self.windows = workloads.read_bytes_per_source(sources, MODE)
        if impl_name == "reference":
            self.state = workloads.reference_state(
                workloads.reference_sources(sources), MODE, num_slots=layout.capacity
            )
        else:
            # canary_torch takes only its own RealKvSource (it shares no type with canary)
            own = workloads.kv_sources(canary_torch, pool, layout, NUM_SOURCES, READ_BYTES)
            self.state = workloads.make_context(
                canary_torch, own, MODE, num_slots=layout.capacity, device="cpu"
            )
        self._launch_write(scenario.setup)()
        self.write = self._launch_write(scenario.write) if scenario.write else None
        if self.write is not None:
            self.write()
        self.verify = self._launch_verify(scenario.verify)

    def _launch_write(self, batch: workloads.WriteBatch):
        if self.impl_name == "reference":
            plan, arguments = workloads.reference_write_arguments(batch)
            return lambda: reference.write(self.state, plan, **arguments)
        arguments = workloads.write_arguments(canary_torch, batch, "cpu")
        return lambda: canary_torch.launch_canary_write_kernel(context=self.state, **arguments)

    def _launch_verify(self, batch: workloads.VerifyBatch):
        if self.impl_name == "reference":
            plan = workloads.reference_verify_plan(batch)
            return lambda: reference.verify(self.state, plan, check_verify_expected_token=True)
        arguments = workloads.verify_arguments(canary_torch, batch, "cpu")
        return lambda: canary_torch.launch_canary_verify_kernel(context=self.state, **arguments)

    def violations(self) -> int:
        return int(np.asarray(self.state.violation_write_index).reshape(-1)[0])


@pytest.fixture(scope="module")
def prepared(cpu_pool):
    layout, pool = cpu_pool
    cache: dict[tuple[str, str], Prepared] = {}

    def get(impl_name: str, scenario_name: str) -> Prepared:
        key = (impl_name, scenario_name)
        if key not in cache:
            cache[key] = Prepared(impl_name, SCENARIOS[scenario_name](layout), layout, pool)
        return cache[key]

    return get


def _record(benchmark, prepared: Prepared, operation: str, bytes_read: int, entries: int):
    assert prepared.violations() == 0, "a clean workload reported violations"
    info = dict(
        implementation=prepared.impl_name,
        operation=operation,
        scenario=prepared.scenario.name,
        entries=entries,
        bytes_read=bytes_read,
    )
    seconds = report.median_seconds(benchmark)
    if seconds is not None:
        info.update(
            median_s=seconds,
            mb_per_s=bytes_read / seconds / report.MB,
            entries_per_s=entries / seconds,
        )
    report.record(benchmark, **info)


@pytest.mark.parametrize("impl_name", IMPLS)
@pytest.mark.parametrize("scenario_name", WRITE_SCENARIOS)
def test_write(benchmark, prepared, scenario_name, impl_name):
    """One write launch of the scenario (ALL, K and V of one layer, 128 B each)."""
    state = prepared(impl_name, scenario_name)
    batch = state.scenario.write
    benchmark.group = (
        f"cpu write: {scenario_name} ({batch.num_requests} requests, {batch.num_entries} tokens)"
    )
    benchmark(state.write)
    _record(
        benchmark,
        state,
        "write",
        workloads.write_bytes_read(batch, state.windows),
        batch.num_entries,
    )


@pytest.mark.parametrize("impl_name", IMPLS)
@pytest.mark.parametrize("scenario_name", list(SCENARIOS))
def test_verify(benchmark, prepared, scenario_name, impl_name):
    """One verify launch of the scenario's entries, expected tokens checked."""
    state = prepared(impl_name, scenario_name)
    batch = state.scenario.verify
    benchmark.group = f"cpu verify: {scenario_name} ({batch.num_entries} entries)"
    benchmark(state.verify)
    _record(
        benchmark,
        state,
        "verify",
        workloads.verify_bytes_read(batch, state.windows),
        batch.num_entries,
    )
