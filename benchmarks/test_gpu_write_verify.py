"""GPU write and verify: canary's launchers on the launches an engine runs, ALL mode over K and
V of one layer (256 B each) of the 8 GiB pool.

Timed through the public launchers, host-side launch checks included: that is what an engine
pays per step. Each figure is set against the time needed to read, once and contiguously,
the bytes the launch must read (plan columns, canary records, KV windows), measured in the
same run. Target shown (never asserted): ``read_ratio <= 2`` for both.
"""

from __future__ import annotations

import pytest

import canary
from benchmarks import report, workloads

pytestmark = pytest.mark.gpu

NUM_SOURCES = 2
READ_BYTES = 256
MODE = canary.RealKvHashMode.ALL
TARGET_READ_RATIO = 2.0

SCENARIOS = workloads.engine_scenarios(sweep_requests=256, sweep_length=4096)
WRITE_SCENARIOS = [name for name in SCENARIOS if not name.startswith("sweep")]


class Prepared:
    """A scenario on the GPU after its setup write and its write: ready to time either launch."""

    def __init__(self, scenario: workloads.Scenario, layout, pool, device):
        self.scenario = scenario
        sources = workloads.kv_sources(canary, pool, layout, NUM_SOURCES, READ_BYTES)
        self.windows = workloads.read_bytes_per_source(sources, MODE)
        self.context = workloads.make_context(
            canary, sources, MODE, num_slots=layout.capacity, device=device
        )
        self._write(scenario.setup, device)()
        self.write = self._write(scenario.write, device) if scenario.write else None
        if self.write is not None:
            self.write()
        arguments = workloads.verify_arguments(canary, scenario.verify, device)
        self.verify = lambda: canary.launch_canary_verify_kernel(context=self.context, **arguments)
        self.verify()

    def _write(self, batch: workloads.WriteBatch, device):
        arguments = workloads.write_arguments(canary, batch, device)
        return lambda: canary.launch_canary_write_kernel(context=self.context, **arguments)

    def violations(self) -> int:
        return int(self.context.violation_write_index.item())


@pytest.fixture(scope="module")
def prepared(gpu, gpu_pool):
    layout, pool = gpu_pool
    cache: dict[str, Prepared] = {}

    def get(name: str) -> Prepared:
        if name not in cache:
            cache[name] = Prepared(SCENARIOS[name](layout), layout, pool, gpu)
        return cache[name]

    yield get
    cache.clear()


def _measure(benchmark, gpu_clock, state: Prepared, operation: str, fn, bytes_read, entries):
    assert state.violations() == 0, "a clean workload reported violations"
    gpu_clock.wall_rounds(benchmark, fn)
    seconds = gpu_clock.device_seconds(fn)
    read_seconds = gpu_clock.read_seconds(bytes_read)
    copy_seconds = gpu_clock.copy_seconds(bytes_read)
    assert state.violations() == 0, "a clean workload reported violations"
    read_ratio = seconds / read_seconds
    report.record(
        benchmark,
        operation=operation,
        scenario=state.scenario.name,
        entries=entries,
        bytes_read=bytes_read,
        device_time_s=seconds,
        gbps=bytes_read / seconds / report.GB,
        copy_gbps=bytes_read / copy_seconds / report.GB,
        copy_ratio=copy_seconds / seconds,
        read_ratio=read_ratio,
        target=f"read_ratio <= {TARGET_READ_RATIO:g}",
        meets_target=read_ratio <= TARGET_READ_RATIO,
    )


@pytest.mark.parametrize("scenario_name", WRITE_SCENARIOS)
def test_write(benchmark, gpu_clock, prepared, scenario_name):
    """One write launch: device time against reading the bytes it must read."""
    state = prepared(scenario_name)
    batch = state.scenario.write
    benchmark.group = "gpu write"
    _measure(
        benchmark,
        gpu_clock,
        state,
        "write",
        state.write,
        workloads.write_bytes_read(batch, state.windows),
        batch.num_entries,
    )


@pytest.mark.parametrize("scenario_name", list(SCENARIOS))
def test_verify(benchmark, gpu_clock, prepared, scenario_name):
    """One verify launch: device time against reading the bytes it must read."""
    state = prepared(scenario_name)
    batch = state.scenario.verify
    benchmark.group = "gpu verify"
    _measure(
        benchmark,
        gpu_clock,
        state,
        "verify",
        state.verify,
        workloads.verify_bytes_read(batch, state.windows),
        batch.num_entries,
    )
