"""Every memory access of an interpreted launch stays inside its buffers (CONTRACT §8).

On a GPU an access past a buffer may fault, read another allocation or corrupt it; under
Triton's interpreter (CPU tensors) a load or store is a numpy gather or scatter at raw
addresses, so the same access silently reads or writes whatever lies there, and a kernel that
reads one entry past a plan, the fields of slot -1 or the bytes before a source gives exactly
the right results. This module makes such accesses visible on the CPU.

While a call into the implementation runs inside :func:`watching`, every masked-in address of
every load, store and atomic of an interpreted launch must fall inside one of the call's
buffers: the tensors reachable from the call's arguments (the context, its sources' tensors,
the plans, the slots; a source is handed to a kernel as a raw address, so only the call's
arguments can say where it may read) and the tensors the launch itself is given (the
implementation's own temporaries). A buffer is a tensor's extent: from its lowest to its
highest element. An access outside every buffer is recorded and masked off (it neither reads
nor writes, so a wild address cannot crash the interpreter), and when the call returns the
check fails with an ``AssertionError`` that names the kernel, the program, the address and
the nearest buffer.

The suite applies it to the implementation's launchers through :func:`checked_module`; compiled
launches (CUDA/ROCm) are not watched: run those under ``compute-sanitizer``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import types
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch

#: The implementation's functions that launch kernels, watched by :func:`checked_module`.
LAUNCHERS = ("fingerprint", "launch_canary_write_kernel", "launch_canary_verify_kernel")

#: Violations shown per failing call; the count of the rest follows them.
SHOWN = 6

try:  # the interpreter's hooks: where every load, store and atomic of a launch goes through
    from triton.runtime import interpreter as _interpreter

    _HOOKS_FOUND = (
        all(hasattr(_interpreter, name) for name in ("interpreter_builder", "GridExecutor"))
        and all(
            hasattr(_interpreter.InterpreterBuilder, name)
            for name in ("create_masked_load", "create_masked_store", "create_atomic_rmw")
        )
        and hasattr(_interpreter.GridExecutor, "_init_args_hst")
    )
except ImportError:  # pragma: no cover - Triton is a dependency of the suite
    _interpreter = None
    _HOOKS_FOUND = False


def unavailable_reason() -> str | None:
    """Why this Triton's interpreter cannot be watched, or None when it can."""
    if _interpreter is None:
        return "Triton is not installed"
    if not _HOOKS_FOUND:
        return "this Triton's interpreter lacks the hooks the check uses"
    return None


class Buffer(NamedTuple):
    """A tensor's extent in bytes, [start, end), and what the suite calls it."""

    start: int
    end: int
    name: str


def buffer_of(tensor: torch.Tensor, name: str) -> Buffer | None:
    """The bytes from ``tensor``'s lowest element to the end of its highest; None if empty."""
    if tensor.device.type != "cpu" or tensor.numel() == 0:
        return None
    low = high = 0
    for size, stride in zip(tensor.shape, tensor.stride()):
        if stride >= 0:
            high += (size - 1) * stride
        else:
            low += (size - 1) * stride
    item = tensor.element_size()
    base = tensor.data_ptr()
    dtype = str(tensor.dtype).removeprefix("torch.")
    shape = "x".join(map(str, tensor.shape)) or "scalar"
    return Buffer(base + low * item, base + (high + 1) * item, f"{name} [{shape} {dtype}]")


def reachable_buffers(obj, name: str, depth: int = 4) -> Iterator[Buffer]:
    """The buffers of every tensor reachable from ``obj`` in ``depth`` steps: items of
    sequences and mappings, fields of dataclasses and plain objects."""
    if isinstance(obj, torch.Tensor):
        buffer = buffer_of(obj, name)
        if buffer is not None:
            yield buffer
        return
    if depth == 0 or obj is None or isinstance(obj, (str, bytes, int, float, bool, type)):
        return
    if isinstance(obj, (list, tuple)):
        for index, item in enumerate(obj):
            yield from reachable_buffers(item, f"{name}[{index}]", depth - 1)
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from reachable_buffers(item, f"{name}[{key!r}]", depth - 1)
    elif dataclasses.is_dataclass(obj):
        for field in dataclasses.fields(obj):
            yield from reachable_buffers(
                getattr(obj, field.name, None), f"{name}.{field.name}", depth - 1
            )
    elif hasattr(obj, "__dict__") and not isinstance(obj, (types.ModuleType, types.FunctionType)):
        for key, item in vars(obj).items():
            yield from reachable_buffers(item, f"{name}.{key}", depth - 1)


class Violation(NamedTuple):
    kernel: str
    program: tuple
    access: str  # load, store, atomic
    address: int
    size: int
    where: str  # the address against the nearest buffer


def _nearest(buffers: list[Buffer], address: int, size: int) -> str:
    if not buffers:
        return "the launch has no buffer at all"

    def distance(buffer: Buffer) -> int:
        if address < buffer.start:
            return buffer.start - address
        return max(0, address + size - buffer.end)

    buffer = min(buffers, key=distance)
    if address < buffer.start:
        return f"{buffer.start - address} bytes before {buffer.name}"
    if address >= buffer.end:
        return f"{address - buffer.end} bytes past the end of {buffer.name}"
    return f"overlapping the end of {buffer.name} (offset {address - buffer.start})"


class _Launch:
    """The buffers one launch may touch, merged for a binary search."""

    def __init__(self, kernel: str, buffers: list[Buffer]):
        self.kernel = kernel
        self.buffers = buffers
        spans = sorted((b.start, b.end) for b in buffers)
        merged: list[list[int]] = []
        for start, end in spans:
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        self.starts = np.array([s for s, _ in merged], dtype=np.uint64)
        self.ends = np.array([e for _, e in merged], dtype=np.uint64)


class Watch:
    """The buffers of one call into the implementation and the violations of its launches."""

    def __init__(self, buffers: list[Buffer]):
        self.call_buffers = buffers
        self.launch: _Launch | None = None
        self.violations: list[Violation] = []
        self.count = 0

    def begin_launch(self, kernel: str, arg_names, args, kwargs) -> None:
        buffers = list(self.call_buffers)
        for name, value in zip(arg_names, args):
            buffers += reachable_buffers(value, f"kernel argument {name}", depth=1)
        for name, value in kwargs.items():
            buffers += reachable_buffers(value, f"kernel argument {name}", depth=1)
        self.launch = _Launch(kernel, buffers)

    def allowed(self, ptrs, mask, access: str):
        """``mask`` with every lane outside the launch's buffers turned off, each recorded."""
        launch = self.launch
        if launch is None:  # an interpreted launch that began before the watch
            return mask
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        addresses = np.asarray(ptrs.data, dtype=np.uint64)
        lanes = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        wanted = addresses[lanes]
        if wanted.size == 0:
            return mask
        index = np.searchsorted(launch.starts, wanted, side="right").astype(np.int64) - 1
        inside = (
            (index >= 0) & (wanted + np.uint64(size) <= launch.ends[np.maximum(index, 0)])
            if launch.starts.size
            else np.zeros(wanted.shape, dtype=bool)
        )
        if inside.all():
            return mask
        bad = wanted[~inside]
        self.count += int(bad.size)
        program = tuple(_interpreter.interpreter_builder.grid_idx or ())
        for address in bad[: max(0, SHOWN - len(self.violations))]:
            address = int(address)
            self.violations.append(
                Violation(
                    launch.kernel,
                    program,
                    access,
                    address,
                    size,
                    _nearest(launch.buffers, address, size),
                )
            )
        keep = lanes.copy()
        keep[lanes] = inside
        return type(mask)(keep, mask.dtype)

    def report(self, call: str) -> str:
        lines = [
            f"{call}: {self.count} access(es) outside the call's buffers (CONTRACT §8); "
            "masked off here, a GPU would make them:"
        ]
        for v in self.violations:
            program = ", ".join(map(str, v.program))
            lines.append(
                f"  {v.kernel}, program ({program}): {v.access} of {v.size} bytes at "
                f"{v.address:#x}, {v.where}"
            )
        if self.count > len(self.violations):
            lines.append(f"  ... and {self.count - len(self.violations)} more")
        return "\n".join(lines)


_active: Watch | None = None


def _checked_load(original, ptrs, mask, *args, **kwargs):
    if _active is not None:
        mask = _active.allowed(ptrs, mask, "load")
    return original(ptrs, mask, *args, **kwargs)


def _checked_store(original, ptrs, value, mask, *args, **kwargs):
    if _active is not None:
        mask = _active.allowed(ptrs, mask, "store")
    return original(ptrs, value, mask, *args, **kwargs)


def _checked_atomic(original, op, ptr, value, mask, *args, **kwargs):
    if _active is not None:
        mask = _active.allowed(ptr, mask, "atomic")
    return original(op, ptr, value, mask, *args, **kwargs)


@contextlib.contextmanager
def _hooks() -> Iterator[None]:
    builder = _interpreter.interpreter_builder
    executor = _interpreter.GridExecutor
    original_init = executor._init_args_hst

    def init_args(self, args_dev, kwargs):
        if _active is not None:
            _active.begin_launch(
                getattr(self.fn, "__name__", "kernel"), self.arg_names, args_dev, kwargs
            )
        return original_init(self, args_dev, kwargs)

    patched = {
        "create_masked_load": functools.partial(_checked_load, builder.create_masked_load),
        "create_masked_store": functools.partial(_checked_store, builder.create_masked_store),
        "create_atomic_rmw": functools.partial(_checked_atomic, builder.create_atomic_rmw),
    }
    for name, hook in patched.items():
        setattr(builder, name, hook)  # an instance attribute, shadowing the method
    executor._init_args_hst = init_args
    try:
        yield
    finally:
        executor._init_args_hst = original_init
        for name in patched:
            builder.__dict__.pop(name, None)


@contextlib.contextmanager
def watching(call: str, /, *args, **kwargs) -> Iterator[Watch]:
    """Watch the interpreted launches made inside the block; their buffers are the tensors
    reachable from ``args``/``kwargs`` (the call's arguments, named by their keywords) and the
    launches' own.

    Raises ``AssertionError`` at the end of the block when an access fell outside them (also
    when the block raised: that error is then its cause).
    """
    global _active
    if _active is not None or unavailable_reason() is not None:  # nested, or cannot watch
        yield Watch([])
        return
    buffers = [b for i, a in enumerate(args) for b in reachable_buffers(a, f"argument {i}")]
    for key, value in kwargs.items():
        buffers += reachable_buffers(value, key)
    watch = Watch(buffers)
    error: BaseException | None = None
    with _hooks():
        _active = watch
        try:
            yield watch
        except BaseException as raised:
            error = raised
        finally:
            _active = None
    if watch.count:
        raise AssertionError(watch.report(call)) from error
    if error is not None:
        raise error


def checked_function(name: str, function):
    """``function`` run under :func:`watching`, its arguments naming the buffers."""

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a callable without one: its arguments go by position
        signature = None

    @functools.wraps(function)
    def checked(*args, **kwargs):
        named: dict = {}
        if signature is not None:
            with contextlib.suppress(TypeError):  # a wrong call: let the function say so
                named = dict(signature.bind(*args, **kwargs).arguments)
        call = f"{name}()"
        with watching(call, **named) if named else watching(call, *args, **kwargs):
            return function(*args, **kwargs)

    return checked


class CheckedModule(types.ModuleType):
    """The implementation module as the suite sees it: every name is the module's own, but
    its launchers (:data:`LAUNCHERS`) are watched."""

    def __init__(self, module: types.ModuleType):
        super().__init__(module.__name__, module.__doc__)
        self.__wrapped__ = module

    def __getattr__(self, name: str):
        value = getattr(self.__wrapped__, name)
        if name in LAUNCHERS and callable(value):
            return checked_function(name, value)
        return value

    def __dir__(self):
        return dir(self.__wrapped__)


def checked_module(module: types.ModuleType) -> types.ModuleType:
    """``module`` with its launchers watched, or ``module`` itself when the interpreter
    cannot be watched."""
    if unavailable_reason() is not None:
        return module
    return CheckedModule(module)
