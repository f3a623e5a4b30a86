"""CPU fingerprint: the numpy reference, canary.torch_backend and a per-slot pure-Python fold
side by side at 1 MiB of bytes read; then the reference against torch_backend by mode and
source count.

canary itself is not timed on the CPU: there it runs Triton's interpreter, a correctness
tool that folds a few MB/s.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest
import torch

import canary
import reference
from benchmarks import report, workloads
from canary import torch_backend

SLOTS = 8192
READ_BYTES = 128  # SLOTS x READ_BYTES = 1 MiB read per call
TARGET_SPEEDUP = 200  # the reference over the per-slot fold, shown, never asserted


class Case:
    """One slot set over the CPU pool, as torch sources, numpy sources and slot arrays."""

    def __init__(self, pool_and_layout, *, num_sources: int, mode, seed: int):
        layout, pool = pool_and_layout
        self.mode = mode
        self.sources = workloads.kv_sources(canary, pool, layout, num_sources, READ_BYTES)
        # torch_backend takes only its own RealKvSource (it shares no type with canary)
        self.torch_sources = workloads.kv_sources(
            torch_backend, pool, layout, num_sources, READ_BYTES
        )
        self.reference_sources = workloads.reference_sources(self.sources)
        self.slots = workloads.page_scattered_slots(SLOTS, layout, seed=seed)
        self.slots_tensor = torch.from_numpy(self.slots)
        self.windows = workloads.read_bytes_per_source(self.sources, mode)
        self.bytes_read = workloads.fingerprint_bytes_read(SLOTS, self.windows)

    def reference(self) -> np.ndarray:
        return reference.fingerprint(self.reference_sources, self.slots, self.mode)

    def torch_backend(self) -> np.ndarray:
        return torch_backend.fingerprint(
            self.torch_sources, self.slots_tensor, mode=self.mode
        ).numpy()

    def per_slot_python(self) -> np.ndarray:
        hashes = workloads.per_slot_fingerprint(
            self.reference_sources, self.slots.tolist(), self.windows
        )
        return np.array(hashes, dtype=np.uint64).view(np.int64)


@pytest.fixture(scope="module")
def one_mib(cpu_pool) -> Case:
    return Case(cpu_pool, num_sources=1, mode=reference.RealKvHashMode.ALL, seed=11)


@pytest.fixture(scope="module")
def per_slot_fold_seconds(one_mib: Case) -> float:
    """Median of three per-slot folds of the 1 MiB case: the denominator of every speedup."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        one_mib.per_slot_python()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


CONTENDERS = ("reference", "torch_backend", "per_slot_python")


@pytest.mark.parametrize("contender", CONTENDERS)
def test_fingerprint_one_mib(benchmark, one_mib: Case, per_slot_fold_seconds, contender):
    """reference vs torch_backend vs a per-slot Python fold: 8192 slots x 128 B, ALL, 1 source."""
    benchmark.group = "cpu fingerprint: 8192 slots x 128 B = 1 MiB, ALL, 1 source"
    got = benchmark(getattr(one_mib, contender))
    np.testing.assert_array_equal(got, one_mib.reference(), strict=True, err_msg=contender)

    seconds = report.median_seconds(benchmark)
    info = dict(contender=contender, slots=SLOTS, bytes_read=one_mib.bytes_read)
    if seconds is not None:
        speedup = per_slot_fold_seconds / seconds
        info.update(median_s=seconds, mb_per_s=one_mib.bytes_read / seconds / report.MB)
        info.update(speedup_vs_per_slot_fold=speedup)
        if contender == "reference":
            info.update(
                target=f"reference >= {TARGET_SPEEDUP}x the per-slot fold",
                meets_target=speedup >= TARGET_SPEEDUP,
            )
    report.record(benchmark, **info)


MODES_AND_SOURCES = [
    (reference.RealKvHashMode.PARTIAL, 1),
    (reference.RealKvHashMode.PARTIAL, 4),
    (reference.RealKvHashMode.ALL, 2),
    (reference.RealKvHashMode.ALL, 4),
]


@pytest.mark.parametrize("contender", CONTENDERS[:2])
@pytest.mark.parametrize(
    "mode, num_sources",
    MODES_AND_SOURCES,
    ids=[f"{mode.name}-{n}src" for mode, n in MODES_AND_SOURCES],
)
def test_fingerprint_by_mode_and_sources(benchmark, cpu_pool, mode, num_sources, contender):
    """reference vs torch_backend over 8192 slots, by mode and number of sources."""
    case = Case(cpu_pool, num_sources=num_sources, mode=mode, seed=12)
    benchmark.group = f"cpu fingerprint: 8192 slots, {mode.name}, {num_sources} sources"
    got = benchmark(getattr(case, contender))
    np.testing.assert_array_equal(got, case.reference(), strict=True, err_msg=contender)

    seconds = report.median_seconds(benchmark)
    info = dict(
        contender=contender,
        mode=mode.name,
        sources=num_sources,
        slots=SLOTS,
        bytes_read=case.bytes_read,
    )
    if seconds is not None:
        info.update(median_s=seconds, mb_per_s=case.bytes_read / seconds / report.MB)
    report.record(benchmark, **info)
