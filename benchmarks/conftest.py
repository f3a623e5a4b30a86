"""pytest-benchmark set-up of the benchmarks: machine info, storage per GPU type, comparison
guard, shared pools and the GPU fixtures.

- ``machine_info`` gains ``gpu_type``, ``gpu`` (name, compute capability, driver, ... or
  ``"cpu"``) and the torch, Triton and numpy versions.
- Without ``--benchmark-storage``, runs are stored under ``.benchmarks/<gpu_type>``.
- ``--benchmark-compare`` against a run of another ``gpu_type`` is a usage error.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import machine, report, timing, workloads

# Small enough to build in a fraction of a second on a laptop; big enough for 8192 slots.
CPU_LAYOUT = workloads.PoolLayout(num_pages=4096, page_size=16, kv_heads=1, head_dim=64)
# 4M slots (+ page 0) of 512 bytes per token, K and V of 2 layers: an 8 GiB pool.
GPU_LAYOUT = workloads.PoolLayout(
    num_pages=(1 << 22) // 16 + 16, page_size=16, kv_heads=2, head_dim=128
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("canary benchmarks")
    group.addoption(
        "--bench-quick",
        action="store_true",
        default=False,
        help="GPU benchmarks: fewer rounds and shorter CUDA-event sampling (a smoke run)",
    )
    group.addoption(
        "--bench-cpu-threads",
        type=int,
        default=1,
        metavar="N",
        help="torch intra-op threads for the CPU benchmarks (default 1: every contender on one "
        "core; with more, a descheduled thread stalls each parallel region on a shared machine)",
    )


def pytest_configure(config: pytest.Config) -> None:
    # pytest-benchmark opens its storage in its own pytest_configure, which runs last.
    config.addinivalue_line("markers", "gpu: needs a GPU device (skipped without one)")
    torch.set_num_threads(config.getoption("--bench-cpu-threads"))
    facts = machine.machine_facts(machine.benchmark_device(config))
    facts["torch_cpu_threads"] = torch.get_num_threads()
    config._canary_bench_facts = facts
    if hasattr(config.option, "benchmark_storage"):
        config.option.benchmark_storage = machine.choose_storage(
            config.option.benchmark_storage,
            machine.command_line_args(config),
            config.rootpath,
            facts["gpu_type"],
        )


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict) -> None:
    facts = getattr(config, "_canary_bench_facts", None)
    if facts is None:
        facts = machine.machine_facts(machine.benchmark_device(config))
    machine_info.update(facts)


def pytest_benchmark_compare_machine_info(
    config, benchmarksession, machine_info, compared_benchmark
):
    machine.check_comparable(machine_info, compared_benchmark, f"in {benchmarksession.storage}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    facts = getattr(config, "_canary_bench_facts", None)
    if not facts:
        return []
    storage = getattr(config.option, "benchmark_storage", None)
    return [
        f"canary benchmarks: gpu_type={facts['gpu_type']}, storage {storage}, "
        f"torch CPU threads {facts['torch_cpu_threads']}"
    ]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The conformance plugin skips `gpu` tests on its CPU runs; this covers runs without it.
    if machine.benchmark_device(config) is not None:
        return
    skip = pytest.mark.skip(reason="needs a CUDA/ROCm GPU; this run has none")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter) -> None:
    lines = report.table(report.RESULTS)
    if not lines:
        return
    terminalreporter.section("canary throughput (figures also saved in extra_info)")
    for line in lines:
        terminalreporter.write_line(line)


# ---------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def cpu_pool() -> tuple[workloads.PoolLayout, torch.Tensor]:
    """The CPU pool (32 MiB) every CPU benchmark reads."""
    return CPU_LAYOUT, workloads.make_pool(CPU_LAYOUT, "cpu", seed=1)


@pytest.fixture(scope="session")
def gpu(pytestconfig: pytest.Config) -> torch.device:
    """The GPU of this run (made the current device, so Triton launches on it)."""
    device = machine.benchmark_device(pytestconfig)
    if device is None:
        pytest.skip("needs a CUDA/ROCm GPU; this run has none")
    torch.cuda.set_device(device)
    return device


@pytest.fixture(scope="session")
def gpu_clock(gpu: torch.device, pytestconfig: pytest.Config) -> timing.GpuClock:
    return timing.GpuClock(gpu, quick=pytestconfig.getoption("--bench-quick"))


@pytest.fixture(scope="session")
def gpu_pool(gpu: torch.device) -> tuple[workloads.PoolLayout, torch.Tensor]:
    """The GPU pool (8 GiB) every GPU benchmark reads."""
    free_bytes, _ = torch.cuda.mem_get_info(gpu)
    # the pool, and as much again for the copy and read baselines and working buffers
    if free_bytes < 2 * GPU_LAYOUT.pool_bytes:
        pytest.skip(
            f"the GPU pool needs {2 * GPU_LAYOUT.pool_bytes / 2**30:.0f} GiB free on {gpu}, "
            f"{free_bytes / 2**30:.1f} GiB are"
        )
    return GPU_LAYOUT, workloads.make_pool(GPU_LAYOUT, gpu, seed=1)
