"""CUDA-graph capture and replay on the CPU: what a replayed forward runs, and nothing more.

A CUDA graph records the device operations a capture run launched, over the buffers the graph
runner registered for it, and a replay runs exactly those operations again on whatever those
buffers hold then. The Python that launched them does not run again: a branch taken at capture,
a value read to the host (``.item()``, ``.tolist()``), a field the capture batch did or did not
carry, all stay as they were at capture. This module gives the CPU the same semantics, so that
a canary's per-forward code can be judged as a server replays it:

- :func:`capture` runs a function under a recorder (a ``TorchDispatchMode``): every tensor
  operation it makes is recorded with its arguments, the very tensor objects, and its result;
- a function wrapped by :meth:`Recorder.opaque` (a kernel launch) is recorded as ONE operation
  over its arguments, its own internals not recorded (an interpreted Triton kernel writes
  through raw pointers that no dispatch sees, as a compiled one does on a GPU);
- a kernel launched as ``kernel[grid](...)`` (a Triton kernel, SGLang's phase checker's) is
  made opaque the same way: ``kernel[grid]`` is the launch recorded as one operation;
- :meth:`Graph.replay` runs the recorded operations in order over the same objects; an
  operation's result is written into the tensor the capture made (a graph's own memory is the
  same at every replay), so a tensor made during capture is the same object at every replay;
- an allocation without values (``torch.empty``, ``empty_like``, ``new_empty``) is no
  operation of a graph: a replay leaves its memory as the last replay left it, as a CUDA
  graph's private pool does (``torch.zeros`` is an allocation and a fill, and the fill
  replays).

What is not recorded does not replay: a host read's value is frozen into the Python that used
it, and so is every decision that value drove.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["ALLOCATIONS", "Graph", "Recorder", "capture"]

_aten = torch.ops.aten
#: The operations that only allocate (no values written): not recorded, never replayed.
ALLOCATIONS = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.empty_like.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)


@dataclass
class _Op:
    """One recorded operation: ``run(*args, **kwargs)`` gave ``result`` at capture."""

    run: Callable[..., Any]
    args: tuple
    kwargs: dict
    result: Any

    def replay(self) -> None:
        fresh = self.run(*self.args, **self.kwargs)
        kept, _ = tree_flatten(self.result)
        made, _ = tree_flatten(fresh)
        for old, new in zip(kept, made, strict=True):
            if isinstance(old, torch.Tensor) and not _same_memory(old, new):
                # the graph's own tensor keeps its object and memory; it takes the new values
                old.copy_(new)


def _same_memory(a: torch.Tensor, b: Any) -> bool:
    return (
        isinstance(b, torch.Tensor)
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


class Recorder(TorchDispatchMode):
    """Records every tensor operation made inside it (see :func:`capture`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[_Op] = []
        self._opaque_depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if not self._opaque_depth and func not in ALLOCATIONS:
            self.ops.append(_Op(func, tuple(args), dict(kwargs), result))
        return result

    def opaque(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` recorded as one operation over its arguments (a kernel launch): what it does
        inside is not recorded, and a replay calls it again with the same objects."""

        @functools.wraps(fn)
        def launch(*args: Any, **kwargs: Any) -> Any:
            self._opaque_depth += 1
            try:
                result = fn(*args, **kwargs)
            finally:
                self._opaque_depth -= 1
            if not self._opaque_depth:
                self.ops.append(_Op(fn, args, kwargs, result))
            return result

        return launch

    def opaque_kernel(self, kernel: Any) -> Any:
        """``kernel`` (launched as ``kernel[grid](...)``) with each launch recorded as one
        operation (:meth:`opaque` of ``kernel[grid]``)."""
        recorder = self

        class _Launches:
            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                return recorder.opaque(kernel[grid])

        return _Launches()

    def wrapped(self, launcher: Any) -> Any:
        """``launcher`` made opaque: a kernel launched by grid (one with ``__getitem__``, a
        Triton kernel) by :meth:`opaque_kernel`, anything else by :meth:`opaque`."""
        if hasattr(type(launcher), "__getitem__"):
            return self.opaque_kernel(launcher)
        return self.opaque(launcher)


@dataclass
class Graph:
    """The operations one capture recorded; :meth:`replay` runs them and nothing else."""

    ops: list[_Op] = field(default_factory=list)
    #: what the captured function returned (its tensors are the graph's own)
    output: Any = None
    replays: int = 0

    def replay(self) -> Any:
        """Run the recorded operations in order over the objects they were recorded with."""
        for op in self.ops:
            op.replay()
        self.replays += 1
        return self.output

    def __len__(self) -> int:
        return len(self.ops)


def capture(
    fn: Callable[..., Any], *args: Any, opaque: tuple[tuple[object, str], ...] = (), **kwargs: Any
) -> Graph:
    """Run ``fn(*args, **kwargs)`` once under a :class:`Recorder` and return its :class:`Graph`.

    ``opaque``: ``(object, attribute name)`` pairs, each attribute (a kernel launcher of a
    module, or a Triton kernel launched by grid) wrapped by :meth:`Recorder.wrapped` for the
    capture and restored after it. The function's tensor arguments are the static buffers: a
    replay reads whatever they hold then."""
    recorder = Recorder()
    saved = []
    try:
        for owner, name in opaque:
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, recorder.wrapped(original))
        with recorder:
            output = fn(*args, **kwargs)
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)
    return Graph(ops=recorder.ops, output=output)
