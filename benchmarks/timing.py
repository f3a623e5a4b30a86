"""GPU timing: CUDA-synchronised rounds for pytest-benchmark, device times from CUDA events,
and the copy and read baselines every GPU figure is compared with, measured in the same run.

A kernel launch returns before the kernel has run, so host clocks around a bare launch time
the launch, not the work. Here every pytest-benchmark round starts on an idle device with
a cold L2 and ends when the device is done; the throughput figures come from CUDA events
(``triton.testing.do_bench``: L2 flushed before every call, calls queued back to back so the
host's launch cost is hidden, median taken).
"""

from __future__ import annotations

import torch

# Larger than the L2 of any GPU this runs on (H200: 60 MiB, MI300X: 4 MiB + 256 MiB
# Infinity Cache), so that a round never finds last round's bytes in cache.
L2_FLUSH_BYTES = 512 * 2**20


class GpuClock:
    """Times work on one CUDA/ROCm device; ``quick`` trades precision for a short run."""

    def __init__(self, device: torch.device, *, quick: bool):
        self.device = device
        self.quick = quick
        self._flush: torch.Tensor | None = None
        self._baselines: dict[tuple[str, int], float] = {}

    @property
    def rounds(self) -> int:
        return 5 if self.quick else 20

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def device_seconds(self, fn) -> float:
        """Median device time of one call of ``fn``, from CUDA events, L2 cold."""
        from triton.testing import do_bench

        warmup_ms, rep_ms = (5, 25) if self.quick else (25, 100)
        with torch.cuda.device(self.device):
            return do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median") / 1e3

    def wall_rounds(self, benchmark, fn) -> None:
        """``benchmark.pedantic`` over ``fn``: each round flushes L2, waits for the device to
        idle (untimed), then times ``fn`` until the device has finished it."""
        if self._flush is None:
            self._flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=self.device)
        flush = self._flush

        def cold_and_idle() -> None:
            flush.zero_()
            self.synchronize()

        def run_to_completion() -> None:
            fn()
            self.synchronize()

        benchmark.pedantic(
            run_to_completion, setup=cold_and_idle, rounds=self.rounds, warmup_rounds=1
        )

    def copy_seconds(self, num_bytes: int) -> float:
        """Device time of a device-to-device copy of ``num_bytes`` bytes (cached per size)."""
        key = ("copy", num_bytes)
        if key not in self._baselines:
            source = torch.ones(num_bytes, dtype=torch.uint8, device=self.device)
            target = torch.empty_like(source)
            self._baselines[key] = self.device_seconds(lambda: target.copy_(source))
            del source, target
        return self._baselines[key]

    def read_seconds(self, num_bytes: int) -> float:
        """Device time of reading ``num_bytes`` contiguous bytes once (a sum over them)."""
        key = ("read", num_bytes)
        if key not in self._baselines:
            words = torch.ones(max(1, -(-num_bytes // 8)), dtype=torch.int64, device=self.device)
            self._baselines[key] = self.device_seconds(lambda: torch.sum(words))
            del words
        return self._baselines[key]
