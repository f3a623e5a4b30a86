"""conformance.bounds: an interpreted launch that leaves its buffers fails, with where it went."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
import triton.runtime.interpreter as interpreter

import canary
from canary import _runtime, hashing, real_kv_hash
from conformance import bounds

pytestmark = pytest.mark.skipif(
    bounds.unavailable_reason() is not None, reason=f"{bounds.unavailable_reason()}"
)

DISTINCT = torch.arange(1, 9, dtype=torch.int64) * 0x9E3779B97F4A7C15 % (2**61)


def hash_launch(out: torch.Tensor, a: torch.Tensor, n: int) -> None:
    """``hash_kernel`` over ``n`` elements of ``a`` and ``out``, whatever their size."""
    _runtime.launch_kernel(
        torch.device("cpu"), "hash_kernel", (1,), out, a, a, a, n, MIX3=False, BLOCK=128
    )


def test_a_launch_inside_its_buffers_passes_and_computes():
    a = DISTINCT.clone()
    out = torch.zeros_like(a)
    with bounds.watching("hash()", out, a) as watch:
        hash_launch(out, a, a.numel())
    assert watch.count == 0
    assert torch.equal(out, hashing.splitmix64(a))


def test_reads_and_writes_past_a_buffer_are_reported_and_masked_off():
    """Two lanes past 4-element views of 8-element tensors: the loads and stores of those lanes
    are reported, each naming its kernel, program, address and the buffer it missed, and
    masked off, so the memory past the views is neither read nor written."""
    backing_a, backing_out = DISTINCT.clone(), torch.full((8,), 7, dtype=torch.int64)
    a, out = backing_a[:4], backing_out[:4]
    with pytest.raises(AssertionError) as raised:
        with bounds.watching("hash()", out=out, a=a):
            hash_launch(out, a, 6)
    message = str(raised.value)
    assert message.startswith("hash(): 4 access(es) outside the call's buffers (CONTRACT §8)")
    end_a = a.data_ptr() + 32
    assert re.search(
        rf"hash_kernel, program \(0, 0, 0\): load of 8 bytes at {end_a:#x}, 0 bytes past the end "
        r"of a \[4 int64\]",
        message,
    ), message
    assert f"store of 8 bytes at {out.data_ptr() + 40:#x}, 8 bytes past the end of out" in message
    assert torch.equal(backing_out[4:], torch.full((4,), 7, dtype=torch.int64))
    assert torch.equal(out, hashing.splitmix64(a))


def test_a_raw_address_must_point_into_a_buffer_of_the_call():
    """A source reaches its kernel as a raw address: only the call's arguments make it a
    buffer. The same fingerprint passes with the source among the arguments and fails
    without it."""
    tensor = torch.zeros(2, 64, dtype=torch.uint8)
    tensor.view(-1)[:] = torch.arange(1, 129, dtype=torch.uint8)
    source = canary.RealKvSource(tensor=tensor, page_size=2, num_bytes_per_token=32, read_bytes=16)
    slots = torch.tensor([0, 3], dtype=torch.int64)
    checked = bounds.checked_module(canary)
    got = checked.fingerprint([source], slots, mode=canary.RealKvHashMode.PARTIAL)
    assert torch.equal(got, canary.fingerprint([source], slots, mode=canary.RealKvHashMode.PARTIAL))
    with pytest.raises(AssertionError, match=r"fingerprint_kernel, program \(0, 0, 0\): load"):
        with bounds.watching("fingerprint()", slots):
            canary.fingerprint([source], slots, mode=canary.RealKvHashMode.PARTIAL)


def test_the_check_names_where_an_access_went():
    """Before a buffer, past its end, and no buffer at all."""
    t = torch.zeros(4, dtype=torch.int64)
    buffer = bounds.buffer_of(t, "t")
    assert buffer == bounds.Buffer(t.data_ptr(), t.data_ptr() + 32, "t [4 int64]")
    assert bounds._nearest([buffer], t.data_ptr() - 8, 8) == "8 bytes before t [4 int64]"
    assert bounds._nearest([buffer], t.data_ptr() + 40, 8) == "8 bytes past the end of t [4 int64]"
    assert bounds._nearest([buffer], t.data_ptr() + 28, 8) == (
        "overlapping the end of t [4 int64] (offset 28)"
    )
    assert bounds._nearest([], 64, 8) == "the launch has no buffer at all"


def test_a_buffer_is_the_extent_of_the_view():
    base = torch.zeros(6, 8, dtype=torch.int32)
    column = base[1:5, 2]  # 4 elements, 8 apart
    start = base.data_ptr() + (1 * 8 + 2) * 4
    assert bounds.buffer_of(column, "c")[:2] == (start, start + (3 * 8 + 1) * 4)
    transposed = base[:2, :3].t()
    assert bounds.buffer_of(transposed, "t")[:2] == (base.data_ptr(), base.data_ptr() + (8 + 3) * 4)
    repeated = torch.zeros(1, dtype=torch.int64).expand(5)  # stride 0: one element
    assert bounds.buffer_of(repeated, "r")[:2] == (repeated.data_ptr(), repeated.data_ptr() + 8)
    assert bounds.buffer_of(base[:0], "empty") is None


def test_buffers_are_found_through_the_arguments():
    @dataclasses.dataclass(frozen=True)
    class Plan:
        slots: torch.Tensor
        count: int

    class Holder:
        def __init__(self, items):
            self.items = items

    a, b, c = (torch.zeros(2, dtype=torch.int64) for _ in range(3))
    found = list(
        bounds.reachable_buffers(Holder((Plan(a, 1), {"k": [b]}, c[:0], "text", 3)), "context")
    )
    assert [buffer.name for buffer in found] == [
        "context.items[0].slots [2 int64]",
        "context.items[1]['k'][0] [2 int64]",
    ]


def test_an_error_of_the_call_comes_through_alone_or_as_the_cause():
    a = DISTINCT.clone()[:4]
    out = torch.zeros_like(a)
    with pytest.raises(ValueError, match="refused"):
        with bounds.watching("f()", a):
            raise ValueError("refused")
    with pytest.raises(AssertionError) as raised:
        with bounds.watching("f()", out, a):
            hash_launch(out, a, 5)
            raise ValueError("after the launch")
    assert isinstance(raised.value.__cause__, ValueError)


def test_the_hooks_are_removed_after_the_call_and_a_nested_watch_adds_nothing():
    executor_init = interpreter.GridExecutor._init_args_hst
    a = DISTINCT.clone()[:4]
    out = torch.zeros_like(a)
    with pytest.raises(AssertionError, match="outer"):
        with bounds.watching("outer()", out, a):
            with bounds.watching("inner()") as inner:
                hash_launch(out, a, 5)
            assert inner.count == 0
    builder = interpreter.interpreter_builder
    assert not {"create_masked_load", "create_masked_store", "create_atomic_rmw"} & set(
        vars(builder)
    )
    assert interpreter.GridExecutor._init_args_hst is executor_init
    hash_launch(out, a, 4)  # unwatched: runs as before


def test_the_suite_sees_the_module_with_its_launchers_watched():
    checked = bounds.checked_module(canary)
    assert checked.__name__ == "canary"
    assert checked.RealKvSource is canary.RealKvSource
    assert checked.WritePlan is canary.WritePlan
    for name in bounds.LAUNCHERS:
        assert getattr(checked, name).__wrapped__ is getattr(canary, name)
    assert set(bounds.LAUNCHERS) <= set(dir(checked))
    with pytest.raises(AttributeError):
        checked.no_such_name  # noqa: B018


def test_a_watched_launcher_names_its_buffers_by_its_parameters(monkeypatch):
    """Through the module the suite sees, bytes read past a source are named by the launcher's
    own parameter (``sources[0].tensor``). The launch is made to read slots 6 and 7 of a
    6-slot source, past the checks that refuse them."""
    backing = torch.arange(1, 257, dtype=torch.int64).to(torch.uint8).view(4, 64)
    view = backing[:3]
    source = canary.RealKvSource(tensor=view, page_size=2, num_bytes_per_token=32, read_bytes=32)
    launch = real_kv_hash.launch_kernel

    def past_the_source(device, name, grid, out, slot_ptr, *args, **kwargs):
        launch(device, name, grid, out, slot_ptr + 5, *args, **kwargs)

    monkeypatch.setattr(real_kv_hash, "launch_kernel", past_the_source)
    checked = bounds.checked_module(canary)
    slots = torch.tensor([1, 2], dtype=torch.int64)
    with pytest.raises(AssertionError, match=r"^fingerprint\(\): 8 access\(es\)") as raised:
        checked.fingerprint([source], slots, mode=canary.RealKvHashMode.ALL)
    message = str(raised.value)
    assert "0 bytes past the end of sources[0].tensor [3x64 uint8]" in message
    assert "32 bytes past the end of sources[0].tensor [3x64 uint8]" in message
