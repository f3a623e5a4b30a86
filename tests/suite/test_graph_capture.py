"""conformance.graph_capture: a replay runs what the capture recorded, over the same objects,
and nothing of the Python that recorded it."""

from __future__ import annotations

import types

import torch

from conformance.graph_capture import capture


def _forward(batch: dict, out: torch.Tensor) -> torch.Tensor:
    """A per-forward step with the three things a graph freezes: a host read that drives a
    branch, a field the batch may lack, and a tensor made inside it."""
    if batch["seq_lens"][0].item() > 4:  # a host read, and a Python branch on it
        out.add_(batch["seq_lens"])
    else:
        out.sub_(batch["seq_lens"])
    if "positions" in batch:  # a field the capture batch may not carry
        out.mul_(batch["positions"])
    made = torch.arange(3, dtype=torch.int64) + batch["seq_lens"]
    return made


def test_a_capture_time_decision_stays_frozen_across_replays():
    """The branch taken at capture is the branch every replay takes, whatever the buffers hold
    at replay; an eager call would take the other one."""
    seq_lens = torch.tensor([9, 2, 3])
    out = torch.zeros(3, dtype=torch.int64)
    graph = capture(_forward, {"seq_lens": seq_lens}, out)
    assert out.tolist() == [9, 2, 3]
    seq_lens.copy_(torch.tensor([1, 1, 1]))  # eagerly this would subtract
    for replay in range(1, 3):
        graph.replay()
        assert out.tolist() == [9 + replay, 2 + replay, 3 + replay]
    eager = torch.zeros(3, dtype=torch.int64)
    _forward({"seq_lens": seq_lens}, eager)
    assert eager.tolist() == [-1, -1, -1]


def test_a_field_missing_at_capture_is_missing_at_every_replay():
    """A field the capture batch lacked is never read by a replay, even once the batch object
    carries it (an eager call would read it)."""
    batch = {"seq_lens": torch.tensor([5, 6, 7])}
    out = torch.zeros(3, dtype=torch.int64)
    graph = capture(_forward, batch, out)
    batch["positions"] = torch.tensor([2, 2, 2])  # the live forward carries the field
    out.zero_()
    graph.replay()
    assert out.tolist() == [5, 6, 7]  # not multiplied by the positions
    out.zero_()
    _forward(batch, out)
    assert out.tolist() == [10, 12, 14]


def test_tensors_made_during_capture_are_the_graphs_own():
    """A tensor the capture made is the same object after every replay, with the replay's
    values."""
    seq_lens = torch.tensor([9, 2, 3])
    graph = capture(_forward, {"seq_lens": seq_lens}, torch.zeros(3, dtype=torch.int64))
    made = graph.output
    seq_lens.copy_(torch.tensor([10, 20, 30]))
    assert graph.replay() is made
    assert made.tolist() == [10, 21, 32]


def test_a_kernel_launch_is_one_operation_over_its_arguments():
    """A launcher wrapped as opaque is recorded once, over its arguments; its own tensor work,
    and writes no dispatch sees (a raw pointer's), replay by calling it again."""
    calls = []

    def launch(src: torch.Tensor, dst: torch.Tensor) -> None:
        calls.append(1)
        dst.numpy()[:] = src.numpy() * 2  # through the host pointer: no dispatch sees it
        dst.add_(0)  # tensor work inside the launch is the launch's, not recorded apart

    kernels = types.SimpleNamespace(launch=launch)
    src, dst = torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int64)
    graph = capture(lambda: kernels.launch(src, dst), opaque=((kernels, "launch"),))
    assert kernels.launch is launch  # restored after the capture
    assert len(graph) == 1 and dst.tolist() == [2, 4]
    src.copy_(torch.tensor([5, 7]))
    graph.replay()
    assert dst.tolist() == [10, 14] and len(calls) == 2


def test_an_allocation_without_values_is_no_operation_of_the_graph():
    """``torch.empty`` made during capture keeps, at a replay, what the last replay left there
    (a CUDA graph's pool); ``torch.zeros`` is a fill too, which replays."""
    seq_lens = torch.tensor([3, 4])

    def step() -> tuple[torch.Tensor, torch.Tensor]:
        empty, zeros = torch.empty(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
        empty[:1].copy_(seq_lens[:1])
        zeros[:1].copy_(seq_lens[:1])
        return empty, zeros

    graph = capture(step)
    empty, zeros = graph.output
    empty[1], zeros[1] = 7, 7
    seq_lens.copy_(torch.tensor([5, 6]))
    graph.replay()
    assert empty.tolist() == [5, 7] and zeros.tolist() == [5, 0]


def test_a_kernel_launched_by_grid_is_one_operation():
    """A kernel launched as ``kernel[grid](...)`` (a Triton kernel) made opaque is recorded once
    a launch, and a replay launches it again with the same grid and arguments."""
    grids = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(dst: torch.Tensor) -> None:
                grids.append(grid)
                dst.numpy()[:] += 1  # through the host pointer

            return launch

    kernels = types.SimpleNamespace(kernel=Kernel())
    dst = torch.zeros(2, dtype=torch.int64)
    graph = capture(lambda: kernels.kernel[(1,)](dst), opaque=((kernels, "kernel"),))
    assert len(graph) == 1 and isinstance(kernels.kernel, Kernel)
    graph.replay()
    assert dst.tolist() == [2, 2] and grids == [(1,), (1,)]
