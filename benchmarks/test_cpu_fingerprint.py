"""CPU fingerprint: the numpy reference, canary_torch and a per-slot pure-Python fold
side by side at 1 MiB of bytes read; the reference beside SGLang 0.5.23's own reference hash
(4096 scattered slots x 256 B, ALL, page size 4), with numpy's floor for that work; then the
reference against torch_backend by mode and source count.

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
import canary_torch
import reference
from benchmarks import report, workloads
from reference.hashing import splitmix64_inplace

SLOTS = 8192
READ_BYTES = 128  # SLOTS x READ_BYTES = 1 MiB read per call

# The SGLang comparison: 4096 slots scattered over a pool of 256-byte tokens, pages of 4.
SGLANG_LAYOUT = workloads.PoolLayout(num_pages=4096, page_size=4, kv_heads=1, head_dim=128)
SGLANG_SLOTS = 4096
SGLANG_READ_BYTES = 256
TARGET_VS_SGLANG = 500  # the reference over SGLang 0.5.23's reference hash, shown, never asserted


class Case:
    """One slot set over the CPU pool, as torch sources, numpy sources and slot arrays."""

    def __init__(self, pool_and_layout, *, num_sources: int, mode, seed: int):
        layout, pool = pool_and_layout
        self.mode = mode
        self.sources = workloads.kv_sources(canary, pool, layout, num_sources, READ_BYTES)
        # canary_torch takes only its own RealKvSource (it shares no type with canary)
        self.torch_sources = workloads.kv_sources(
            canary_torch, pool, layout, num_sources, READ_BYTES
        )
        self.reference_sources = workloads.reference_sources(self.sources)
        self.slots = workloads.page_scattered_slots(SLOTS, layout, seed=seed)
        self.slots_tensor = torch.from_numpy(self.slots)
        self.windows = workloads.read_bytes_per_source(self.sources, mode)
        self.bytes_read = workloads.fingerprint_bytes_read(SLOTS, self.windows)

    def reference(self) -> np.ndarray:
        return reference.fingerprint(self.reference_sources, self.slots, self.mode)

    def torch_backend(self) -> np.ndarray:
        return canary_torch.fingerprint(
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
    report.record(benchmark, **info)


class SGLangCase:
    """SGLang's reference hash and the oracle on the same bytes: one source (K of layer 1)."""

    def __init__(self):
        from conformance.adapters import sglang  # SGLang's own kv_canary modules

        layout = SGLANG_LAYOUT
        self.layout = layout
        self.pool = workloads.make_pool(layout, "cpu", seed=21)
        (source,) = workloads.kv_sources(canary, self.pool, layout, 1, SGLANG_READ_BYTES)
        self.reference_sources = workloads.reference_sources([source])
        rng = np.random.default_rng(22)  # distinct slots scattered over the pool, slot 0 unused
        self.slots = rng.choice(np.arange(1, layout.capacity), SGLANG_SLOTS, replace=False)
        self.slots_tensor = torch.from_numpy(self.slots)
        # SGLang takes [rows, bytes] views only: the same rows, flattened
        view = self.pool[1, :, 0].reshape(layout.num_pages, -1)
        self.sglang = sglang
        self.sglang_sources = [
            sglang.RealKvSource(
                tensor=view,
                page_size=layout.page_size,
                num_bytes_per_token=layout.bytes_per_token,
                read_bytes=SGLANG_READ_BYTES,
            )
        ]
        self.bytes_read = workloads.fingerprint_bytes_read(SGLANG_SLOTS, [SGLANG_READ_BYTES])

    def reference(self) -> np.ndarray:
        return reference.fingerprint(
            self.reference_sources, self.slots, reference.RealKvHashMode.ALL
        )

    def sglang_reference(self) -> np.ndarray:
        mode = self.sglang.RealKvHashMode.ALL
        return self.sglang.fingerprint(self.sglang_sources, self.slots_tensor, mode=mode).numpy()

    def numpy_floor(self) -> dict:
        """numpy's floor for this work: the median seconds of the two steps it cannot do
        without, one fancy-index gather of the slots' read windows and the fold of their words
        (9 in-place ufuncs per word over every slot, the words already contiguous), timed
        round by round alternately with the reference itself, so that load on the machine
        weighs on both alike."""
        (source,) = self.reference_sources
        data, page = source.data, self.layout.page_size
        windows = np.lib.stride_tricks.as_strided(
            data,
            shape=(data.shape[0], page, SGLANG_READ_BYTES),
            strides=(data.strides[0], source.num_bytes_per_token, 1),
            writeable=False,
        )
        rows, tokens = np.divmod(self.slots, page)
        words = np.ascontiguousarray(windows[rows, tokens].view("<u8").T)

        def fold():
            acc = np.zeros(SGLANG_SLOTS, dtype=np.uint64)
            scratch = np.empty_like(acc)
            for word in words:
                acc ^= word
                splitmix64_inplace(acc, scratch)
            return acc

        calls = {"gather_s": lambda: windows[rows, tokens], "fold_s": fold}
        calls["reference_s"] = self.reference
        times = {name: [] for name in calls}
        for _ in range(101):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
        figures = {name: statistics.median(values) for name, values in times.items()}
        figures["floor_s"] = figures["gather_s"] + figures["fold_s"]
        return figures


def _median_seconds(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@pytest.fixture(scope="module")
def sglang_case() -> SGLangCase:
    return SGLangCase()


@pytest.fixture(scope="module")
def speedup_vs_sglang(sglang_case: SGLangCase) -> float:
    """SGLang's reference time over the oracle's, paired in time: five rounds of one SGLang
    call then 21 oracle calls (their median), the median of the five ratios. Load on a
    shared machine changes both times by up to 2x from minute to minute; pairing keeps it
    out of the ratio."""
    ratios = []
    for _ in range(5):
        sglang_seconds = _median_seconds(sglang_case.sglang_reference, 1)
        ratios.append(sglang_seconds / _median_seconds(sglang_case.reference, 21))
    return statistics.median(ratios)


@pytest.mark.parametrize("contender", ("reference", "sglang_reference"))
def test_fingerprint_against_sglang(
    benchmark, sglang_case: SGLangCase, speedup_vs_sglang, contender
):
    """The reference vs SGLang 0.5.23's reference hash: 4096 scattered slots x 256 B, ALL, page size 4; identical hashes."""
    benchmark.group = "cpu fingerprint: 4096 scattered slots x 256 B, ALL, page size 4"
    if contender == "sglang_reference":
        got = benchmark.pedantic(sglang_case.sglang_reference, rounds=3, iterations=1)
    else:
        got = benchmark(sglang_case.reference)
    np.testing.assert_array_equal(got, sglang_case.reference(), strict=True, err_msg=contender)
    np.testing.assert_array_equal(
        sglang_case.sglang_reference(), sglang_case.reference(), strict=True, err_msg="sglang"
    )

    seconds = report.median_seconds(benchmark)
    info = dict(contender=contender, slots=SGLANG_SLOTS, bytes_read=sglang_case.bytes_read)
    if seconds is not None:
        info.update(median_s=seconds, mb_per_s=sglang_case.bytes_read / seconds / report.MB)
        if contender == "reference":
            floor = sglang_case.numpy_floor()
            ratio = speedup_vs_sglang
            vs_floor = floor["reference_s"] / floor["floor_s"]
            info.update(
                numpy_floor=floor,
                vs_numpy_floor=vs_floor,
                speedup_vs_sglang_reference=ratio,
                target=f"reference >= {TARGET_VS_SGLANG}x SGLang 0.5.23's reference "
                f"(this run {ratio:,.0f}x; {vs_floor:.2f}x numpy's floor of "
                f"{floor['floor_s'] * 1e3:.2f} ms)",
                meets_target=ratio >= TARGET_VS_SGLANG,
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
