"""GPU fingerprint: canary's compiled Triton kernel over an 8 GiB paged pool, against a
device-to-device copy of the same number of bytes measured in the same run.

Paths: ``kernel`` launches the fingerprint kernel alone (what a fused caller pays);
``api`` is ``canary.fingerprint`` with its host-side launch checks (slot bounds are checked
on the host, so the slots travel to the CPU every call); ``torch_backend`` is the plain-torch
implementation on the same device.

Target shown (never asserted): ALL, >= 256 B read, >= 1M slots, kernel path: >= 80% of
copy bandwidth (``copy_ratio >= 0.8``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import canary
import canary_torch
from benchmarks import report, workloads

pytestmark = pytest.mark.gpu

ALL = canary.RealKvHashMode.ALL
PARTIAL = canary.RealKvHashMode.PARTIAL
K, M = 1 << 10, 1 << 20
TARGET_COPY_RATIO = 0.8


@dataclass(frozen=True)
class Case:
    series: str
    mode: canary.RealKvHashMode
    num_sources: int
    read_bytes: int
    num_slots: int
    path: str = "kernel"

    @property
    def id(self) -> str:
        slots = f"{self.num_slots // M}M" if self.num_slots >= M else f"{self.num_slots // K}K"
        return f"{self.mode.name}-{self.num_sources}src-{self.read_bytes}B-{slots}-{self.path}"

    @property
    def has_target(self) -> bool:
        return (
            self.mode == ALL
            and self.read_bytes >= 256
            and self.num_slots >= M
            and self.path == "kernel"
        )


CASES = [
    *(Case("by slots", ALL, 1, 256, n) for n in (1 * K, 64 * K, 1 * M, 4 * M)),
    *(Case("by bytes read", ALL, 1, r, 1 * M) for r in (64, 128, 512)),
    Case("by sources", ALL, 2, 256, 1 * M),
    Case("by sources", ALL, 4, 256, 1 * M),
    Case("partial", PARTIAL, 1, 256, 1 * M),
    Case("partial", PARTIAL, 4, 256, 1 * M),
    Case("partial", PARTIAL, 1, 256, 4 * M),
    Case("by path", ALL, 1, 256, 1 * M, "api"),
    Case("by path", ALL, 1, 256, 1 * M, "torch_backend"),
]


def _launcher(case: Case, sources, slots: torch.Tensor):
    """A no-argument call that hashes ``slots`` the way ``case.path`` says, returning the hashes."""
    if case.path == "api":
        return lambda: canary.fingerprint(sources, slots, mode=case.mode)
    if case.path == "torch_backend":
        # canary_torch takes only its own RealKvSource (it shares no type with canary)
        own = [
            canary_torch.RealKvSource(
                tensor=s.tensor,
                page_size=s.page_size,
                num_bytes_per_token=s.num_bytes_per_token,
                read_bytes=s.read_bytes,
            )
            for s in sources
        ]
        return lambda: canary_torch.fingerprint(own, slots, mode=case.mode)
    # The kernel alone: the public call's checks pass once, in the test, not every call.
    from canary import real_kv_hash

    launch = getattr(real_kv_hash, "launch_fingerprint", None)
    if launch is None:
        pytest.skip("canary.real_kv_hash.launch_fingerprint is gone: kernel-only path unavailable")
    out = torch.empty(slots.numel(), dtype=torch.int64, device=slots.device)

    def kernel_only() -> torch.Tensor:
        launch(out, slots, sources, case.mode)
        return out

    return kernel_only


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_fingerprint(benchmark, gpu, gpu_clock, gpu_pool, case: Case):
    """Device time, GB/s of KV bytes hashed, and the ratio to copying as many bytes."""
    layout, pool = gpu_pool
    sources = workloads.kv_sources(canary, pool, layout, case.num_sources, case.read_bytes)
    slots = torch.from_numpy(
        workloads.page_scattered_slots(case.num_slots, layout, seed=case.num_slots)
    ).to(gpu)
    fn = _launcher(case, sources, slots)
    # Every path hashes what the public call does (and is compiled before any timing).
    want = canary.fingerprint(sources, slots, mode=case.mode)
    assert torch.equal(fn(), want), f"{case.path} disagrees with canary.fingerprint"
    gpu_clock.synchronize()

    benchmark.group = f"gpu fingerprint: {case.series}"
    gpu_clock.wall_rounds(benchmark, fn)

    bytes_read = workloads.fingerprint_bytes_read(
        case.num_slots, workloads.read_bytes_per_source(sources, case.mode)
    )
    seconds = gpu_clock.device_seconds(fn)
    copy_seconds = gpu_clock.copy_seconds(bytes_read)
    info = dict(
        path=case.path,
        mode=case.mode.name,
        sources=case.num_sources,
        read_bytes=case.read_bytes,
        slots=case.num_slots,
        bytes_read=bytes_read,
        device_time_s=seconds,
        gbps=bytes_read / seconds / report.GB,
        copy_gbps=bytes_read / copy_seconds / report.GB,
        copy_ratio=copy_seconds / seconds,
    )
    if case.has_target:
        info.update(
            target=f"copy_ratio >= {TARGET_COPY_RATIO}",
            meets_target=info["copy_ratio"] >= TARGET_COPY_RATIO,
        )
    report.record(benchmark, **info)
