"""canary.fingerprint's launch checks (CONTRACT §4) run before any kernel, even for empty work."""

import os
import subprocess
import sys

import pytest
import torch

import canary


def source(rows=2, page_size=4, nbpt=32, device="cpu") -> canary.RealKvSource:
    tensor = torch.arange(1, rows * page_size * nbpt + 1, dtype=torch.int64).to(torch.uint8)
    tensor = tensor.reshape(rows, page_size * nbpt).to(device)
    return canary.RealKvSource(
        tensor=tensor, page_size=page_size, num_bytes_per_token=nbpt, read_bytes=nbpt
    )


@pytest.mark.parametrize("count", [5, 6])
@pytest.mark.parametrize("mode", list(canary.RealKvHashMode))
@pytest.mark.parametrize("num_slots", [0, 3])
def test_source_cap(count, mode, num_slots):
    """More than 4 sources raise CONTRACT §4's ValueError in every mode, even with no slots."""
    with pytest.raises(ValueError) as caught:
        canary.fingerprint([source()] * count, torch.zeros(num_slots, dtype=torch.int64), mode=mode)
    assert str(caught.value) == (
        f"kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got {count}"
    )


@pytest.mark.parametrize("num_slots", [0, 2])
def test_source_on_another_device(num_slots):
    """A source on another device than slot_indices raises ValueError naming the index and both devices."""
    sources = [source(), source(device="meta")]
    with pytest.raises(ValueError) as caught:
        canary.fingerprint(sources, torch.zeros(num_slots, dtype=torch.int64))
    message = str(caught.value)
    assert "real_kv_sources[1]" in message and "meta" in message and "cpu" in message


@pytest.mark.parametrize("mode", [canary.RealKvHashMode.PARTIAL, canary.RealKvHashMode.ALL])
@pytest.mark.parametrize("slot", [8, 9, 1000, -1])
def test_slot_out_of_range(mode, slot):
    """A slot outside [0, rows * page_size) of any source raises IndexError naming slot, source and capacity."""
    sources = [source(rows=4), source(rows=2)]  # capacities 16 and 8
    with pytest.raises(IndexError) as caught:
        canary.fingerprint(sources, torch.tensor([0, slot, 1]), mode=mode)
    message = str(caught.value)
    first_failing, capacity = (1, 8) if 0 <= slot < 16 else (0, 16)
    assert str(slot) in message
    assert f"real_kv_sources[{first_failing}]" in message
    assert str(capacity) in message


def test_mode_none_reads_nothing_and_checks_no_slot():
    """Mode NONE gives zeros without reading a source, so out-of-range slots are not an error."""
    got = canary.fingerprint(
        [source(rows=1)], torch.tensor([0, 500, -7]), mode=canary.RealKvHashMode.NONE
    )
    assert torch.equal(got, torch.zeros(3, dtype=torch.int64))


def test_zero_sources_give_zero():
    """No sources give a zero hash for every slot, in every mode."""
    for mode in canary.RealKvHashMode:
        got = canary.fingerprint([], torch.tensor([1, 2, 3]), mode=mode)
        assert torch.equal(got, torch.zeros(3, dtype=torch.int64))


def test_mode_accepts_int_and_rejects_unknown():
    """mode may be the enum or its int value; other values are refused."""
    s = source()
    assert torch.equal(
        canary.fingerprint([s], torch.tensor([3]), mode=1),  # a plain int, deliberately
        canary.fingerprint([s], torch.tensor([3]), mode=canary.RealKvHashMode.PARTIAL),
    )
    with pytest.raises(ValueError):
        canary.fingerprint([s], torch.tensor([3]), mode=3)


def test_interpreter_needs_no_environment_variable():
    """Importing canary on a machine without a GPU leaves TRITON_INTERPRET alone and still runs on CPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import os, torch, canary\n"
        "t = torch.arange(1, 65, dtype=torch.uint8).reshape(1, 64)\n"
        "s = canary.RealKvSource(tensor=t, page_size=2, num_bytes_per_token=32, read_bytes=32)\n"
        "h = canary.fingerprint([s], torch.tensor([0, 1]))\n"
        "assert h[0] != h[1] and 'TRITON_INTERPRET' not in os.environ\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize("nbpt", [0, -16, -32])
def test_a_source_s_bytes_per_token_are_a_positive_multiple_of_16(nbpt):
    """Rule 4 refuses 0 and negative multiples of 16, which pass the multiple-of-16 test."""
    tensor = torch.ones(2, 64, dtype=torch.uint8)
    message = (
        f"kv-canary: RealKvSource.num_bytes_per_token must be a positive multiple of 16, got {nbpt}"
    )
    with pytest.raises(ValueError, match="^" + message + "$"):
        canary.RealKvSource(tensor=tensor, page_size=4, num_bytes_per_token=nbpt, read_bytes=16)
