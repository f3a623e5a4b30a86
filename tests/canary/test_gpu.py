"""canary's compiled kernels (GPU) agree with its interpreted ones (CPU) in one process: the
write/verify family, and the plan and the scatter.

The comparison is skipped without a CUDA/ROCm device (its scenario still runs on the CPU, so
that its code is known to work before a GPU host needs it). On a GPU host this is the check
that the two bindings of each kernel body (canary._runtime) compute the same thing, on every
GPU present.
"""

import numpy as np
import pytest
import torch

import canary
import strategies as st_kv
from conformance.write_verify_support import verify_launch, write_launch

GPUS = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
READING_MODES = (canary.RealKvHashMode.PARTIAL, canary.RealKvHashMode.ALL)


def layout(**fields) -> st_kv.SourceLayout:
    """Six rows of four 64-byte tokens, 256 bytes apart past the row, an offset and a tail."""
    geometry = dict(rows=6, page_size=4, num_bytes_per_token=64, gap_bytes=256)
    return st_kv.layout(**geometry, offset_bytes=32, tail_bytes=16, **fields)


SOURCES = (
    layout(dtype="bfloat16", row_shape=(2, 64), read_bytes=48, seed=5),
    layout(dtype="int32", seed=6),
)


def run_everything(device: str) -> dict:
    """Fingerprint, two writes and a corrupted verify on ``device``; every observable result."""
    made_sources = [st_kv.materialize(item, device) for item in SOURCES]
    sources = [m.build(canary) for m in made_sources]
    slots = torch.arange(SOURCES[0].capacity, device=device).flip(0)
    results = {
        f"fingerprint mode {mode}": canary.fingerprint(sources, slots, mode=mode).cpu().numpy()
        for mode in READING_MODES
    }
    world = st_kv.CanaryWorld(  # a CanaryWorld holds plain ints
        sources=SOURCES,
        mode=int(canary.RealKvHashMode.ALL),
        num_slots=20,
        slot_stride_bytes=40,
        ring_capacity=5,
        ring_start=1,
        kernel_kind=int(canary.CanaryLaunchTag.TAIL_V_FULL),
        chain_assert=1,
        seed=9,
    )
    made = st_kv.materialize_world(world, device)
    first = st_kv.WriteBatch(
        requests=(
            st_kv.WriteRequest(-1, (1, 2, -1, 3), (11, 12, 13, 14), (0, 1, 2, 3)),
            st_kv.WriteRequest(-1, (4, 5), (21, 22), (7, 9)),
        ),
        num_valid=2,
        padding=(),
        input_assert=True,
        expected_tokens=(11, 12, 13, 99, 21, 22),
        expected_positions=(0, 1, 2, 3, 7, 8),
    )
    second = st_kv.WriteBatch(
        requests=(st_kv.WriteRequest(3, (6, 7), (15, 16), (4, 6)),),
        num_valid=5,
        padding=((8, 1, 1),),
        input_assert=False,
        expected_tokens=(),
        expected_positions=(),
    )
    for batch in (first, second):
        canary.launch_canary_write_kernel(
            context=made.context(canary), **write_launch(canary, batch, device)
        )
    st_kv.apply_corruption(made, st_kv.Corruption("field", slot=2, field=0, bit=5))
    chains = st_kv.chains_written(first) + st_kv.chains_written(second)
    columns = [tuple(column) for column in zip(*st_kv.plan_for_chains(chains), strict=True)]
    verify = st_kv.VerifyBatch(*columns, num_valid=len(columns[0]), enable=1, check_token=True)
    canary.launch_canary_verify_kernel(
        context=made.context(canary), **verify_launch(canary, verify, device)
    )
    for name in ("canary_buf", "violation_write_index", "slot_run_counter", "kernel_run_counter"):
        results[name] = getattr(made, name).cpu().numpy()
    ring = made.violation_ring.cpu().numpy()
    results["ring rows"] = ring[np.lexsort(ring.T[::-1])]
    return results


def test_the_scenario_runs_on_the_cpu():
    """The GPU comparison's scenario runs (on CPU tensors) and has something to compare: a
    check that the GPU test's own code still works on a machine without a GPU."""
    results = run_everything("cpu")
    assert all(results[f"fingerprint mode {mode}"].all() for mode in READING_MODES)
    # the ring starts with one row taken; the input assert and the corruption add theirs
    assert results["violation_write_index"][0] >= 3
    assert results["canary_buf"].any()


@pytest.mark.skipif(not GPUS, reason="needs a CUDA/ROCm device")
@pytest.mark.parametrize("gpu", GPUS)
def test_compiled_equals_interpreted(gpu):
    """Every result of the compiled kernels equals the interpreted kernels' result, bit for bit."""
    on_cpu = run_everything("cpu")
    on_gpu = run_everything(gpu)
    for name, expected in on_cpu.items():
        np.testing.assert_array_equal(on_gpu[name], expected, strict=True, err_msg=name)


def plan_and_scatter_everything(device: str) -> dict:
    """Every plan variant (SWA table x expected-token pool) of one mixed batch, fitting and
    overflowing, and one scatter, on ``device``: every tensor they wrote, on the host."""
    gen = torch.Generator().manual_seed(11)
    bs, pool_rows, row_len = 700, 300, 24
    table = torch.randint(-2, 5000, (pool_rows, row_len), generator=gen, dtype=torch.int32)
    pool = torch.randint(-(2**31), 2**31 - 1, (pool_rows, row_len), generator=gen).int()
    rows = torch.randint(0, pool_rows, (bs,), generator=gen)
    rows[::5] = 0  # padding rows
    prefix = torch.randint(-3, row_len + 1, (bs,), generator=gen)
    extend = torch.randint(-2, 5, (bs,), generator=gen)
    lens = torch.randint(-1, row_len + 1, (bs,), generator=gen)
    lut = torch.randperm(6000, generator=gen)
    results = {}
    for with_swa in (False, True):
        for with_pool in (False, True):
            for capacity in (10000, 100):  # 100 overflows
                verify = canary.VerifyPlan.allocate(verify_capacity=capacity, device=device)
                write = canary.WritePlan.allocate(write_req_capacity=bs + 2, device=device)
                for plan in (verify, write):
                    for field in plan.__dataclass_fields__:
                        getattr(plan, field).fill_(91)
                canary.launch_canary_plan_kernels(
                    verify_plan_out=verify,
                    write_plan_out=write,
                    req_pool_indices=rows.to(device),
                    prefix_lens=prefix.to(device),
                    extend_seq_lens=extend.to(device),
                    req_to_token=table.to(device),
                    swa_window_size=7 if with_swa else 0,
                    full_to_swa_index_mapping=lut.to(device) if with_swa else None,
                    verify_capacity=capacity,
                    req_to_verify_expected_tokens=pool.to(device) if with_pool else None,
                    req_to_verify_expected_tokens_valid_lens=lens.to(device) if with_pool else None,
                    kv_token_id_vs_position_offset=1,
                )
                for plan in (verify, write):
                    for field in plan.__dataclass_fields__:
                        key = f"swa={with_swa} pool={with_pool} capacity={capacity} {field}"
                        results[key] = getattr(plan, field).cpu().numpy()
    lengths = torch.randint(0, 40, (bs,), generator=gen)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(lengths, 0)])
    flat = torch.randint(-(2**62), 2**62, (int(offsets[-1]),), generator=gen)
    pool_out = torch.full((bs + 1, 32), 7, dtype=torch.int32, device=device)
    canary.launch_scatter_req_token_ids_kernel(
        flat_in=flat.to(device),
        offsets=offsets.to(device),
        req_pool_indices=(torch.randperm(bs, generator=gen) + 1).to(device),
        pool_out=pool_out,
    )
    results["scatter"] = pool_out.cpu().numpy()
    return results


def test_the_plan_scenario_runs_on_the_cpu():
    """The plan and scatter comparison's scenario runs on CPU tensors, plans, and overflows."""
    results = plan_and_scatter_everything("cpu")
    assert results["swa=True pool=True capacity=10000 enable"][0] == 1
    assert results["swa=True pool=True capacity=100 enable"][0] == 0
    assert (results["swa=True pool=True capacity=10000 verify_expected_tokens"] != 91).any()


@pytest.mark.skipif(not GPUS, reason="needs a CUDA/ROCm device")
@pytest.mark.parametrize("gpu", GPUS)
def test_compiled_plan_and_scatter_equal_interpreted(gpu):
    """Every tensor the compiled plan and scatter kernels write equals the interpreted ones'."""
    on_cpu = plan_and_scatter_everything("cpu")
    on_gpu = plan_and_scatter_everything(gpu)
    for name, expected in on_cpu.items():
        np.testing.assert_array_equal(on_gpu[name], expected, strict=True, err_msg=name)
