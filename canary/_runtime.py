"""Binds the kernel bodies of ``canary.kernels`` and ``canary.plan_kernels`` to a Triton
execution mode per device.

Triton decides between compiling and interpreting when ``@triton.jit`` runs, by reading
``TRITON_INTERPRET``. To serve CUDA/ROCm tensors (compiled) and CPU tensors (interpreted)
in the same process, without asking the user to set anything, every kernel body is bound
twice, each time into its own namespace whose helper names resolve to helpers of the same
mode (and of the same module: each kernel module gets a namespace of its own per mode):

- ``compiled``: ``triton.runtime.JITFunction``, for tensors on a GPU;
- ``interpreted``: ``triton.runtime.interpreter.InterpretedFunction``, which runs the same
  source with numpy, one program after another, on CPU tensors.

This works because the kernels use only Triton builtins (the interpreter patches those
per launch) and never the ``@jit`` helpers of ``triton.language.standard``.

An interpreted launch patches ``triton.language`` once, for its whole grid, and puts it back
at its end; Triton's interpreter then patches it again on every call of a ``@jit`` helper
(``splitmix64``, ``fold_source``, ...), the largest single cost of these kernels on the CPU.
:func:`patch_language_once` makes those calls reuse the launch's patch (see there).

The same wrap mends one defect of Triton 3.6's interpreter: it turns a tensor into a Python
index with ``int()`` of its one-element array, which numpy 2.4 and later refuse ("only
0-dimensional arrays can be converted to Python scalars"), so every loop whose bound is a
kernel argument failed (triton-lang/triton#9171, mended in Triton 3.7). Where the interpreter
is older than 3.7, a launch's patch converts the array's one element instead.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
import types
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from . import kernels, plan_kernels

# The modules whose kernel bodies are bound, by the canary module each stands for; each
# replaceable (see ``use_kernel_module``).
_source_modules: dict = {kernels.__name__: kernels, plan_kernels.__name__: plan_kernels}


def _release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``3.6.0`` or ``3.7.0+git1234``."""
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else (0, 0)


def index_needs_mending(triton_version: str) -> bool:
    """Whether that Triton's interpreter converts a tensor to an index with ``int()`` of its
    one-element array (before 3.7; an unreadable version is taken as old)."""
    return _release(triton_version) < (3, 7)


INDEX_NEEDS_MENDING = index_needs_mending(triton.__version__)


def _tensor_index(self) -> int:
    """A one-element interpreter tensor as a Python index (what Triton 3.7 does)."""
    return int(self.handle.data.reshape(-1)[0])


def _bodies(module) -> list:
    return [
        value
        for value in vars(module).values()
        if inspect.isfunction(value) and value.__module__ == module.__name__
    ]


def _scalar_params(fn) -> list[str]:
    # Integer arguments must not be specialised on their value (a value of 1 would become a
    # constexpr and compile a separate kernel per page size, capacity, ...).
    names = []
    for param in inspect.signature(fn).parameters.values():
        annotated_constexpr = param.annotation is not inspect.Parameter.empty and (
            param.annotation is tl.constexpr or "constexpr" in str(param.annotation)
        )
        if not annotated_constexpr and not param.name.endswith("_ptr"):
            names.append(param.name)
    return names


def _bind(module, mode: str) -> types.SimpleNamespace:
    bodies = _bodies(module)
    namespace: dict = {
        name: value for name, value in vars(module).items() if not any(value is b for b in bodies)
    }
    namespace["__name__"] = f"{module.__name__}.{mode}"
    bound = {}
    for body in bodies:
        copy = types.FunctionType(
            body.__code__, namespace, body.__name__, body.__defaults__, body.__closure__
        )
        copy.__qualname__ = body.__qualname__
        # FunctionType copies neither: without the annotations JITFunction sees no
        # tl.constexpr parameter, and without kwdefaults keyword-only defaults are lost.
        copy.__annotations__ = dict(body.__annotations__)
        copy.__kwdefaults__ = body.__kwdefaults__
        copy.__module__ = namespace["__name__"]
        if mode == "compiled":
            wrapped = JITFunction(copy, do_not_specialize=_scalar_params(body))
        else:
            wrapped = InterpretedFunction(copy)
        namespace[body.__name__] = wrapped
        bound[body.__name__] = wrapped
    return types.SimpleNamespace(**bound)


def _bind_all(mode: str) -> types.SimpleNamespace:
    """Every kernel module bound in ``mode``, each into its own namespace; their kernels
    together in one (the modules' kernel names are distinct)."""
    merged: dict = {}
    for module in _source_modules.values():
        merged.update(vars(_bind(module, mode)))
    return types.SimpleNamespace(**merged)


@functools.cache
def _kernels(mode: str) -> types.SimpleNamespace:
    return _bind_all(mode)


def fresh_compiled_kernels() -> types.SimpleNamespace:
    """A new compiled binding of the current kernel modules, sharing no cache with launches.

    A ``JITFunction`` remembers the target of the first driver it met; the compile check
    binds anew for each target it compiles for.
    """
    return _bind_all("compiled")


def use_kernel_module(module, replacing=kernels) -> None:
    """Bind kernel bodies from ``module`` in place of those of ``replacing`` from now on
    (same names as ``replacing``: ``canary.kernels`` unless told otherwise).

    For the known-bad catalogue, whose members are canary with one kernel line changed.
    """
    if replacing.__name__ not in _source_modules:
        raise ValueError(f"{replacing.__name__} is not a kernel module of canary")
    _source_modules[replacing.__name__] = module
    _kernels.cache_clear()


def kernels_for(device: torch.device) -> types.SimpleNamespace:
    """The kernels to launch for tensors on ``device``."""
    if device.type == "cuda":  # ROCm builds of torch also call their devices "cuda"
        return _kernels("compiled")
    if device.type == "cpu":
        return _kernels("interpreted")
    raise ValueError(
        f"kv-canary: no Triton backend for tensors on {device}; "
        "the canary runs on CUDA/ROCm devices (compiled) and on the CPU (interpreted)"
    )


class Launch(NamedTuple):
    """One kernel launch as a launcher asked for it: what ``launch_kernel`` was given."""

    name: str
    grid: tuple
    args: tuple
    kwargs: dict


# Set by ``capture_launches``: launches are recorded here instead of being run.
_captured: list[Launch] | None = None


@contextlib.contextmanager
def capture_launches() -> Iterator[list[Launch]]:
    """Record every kernel launch made inside the block instead of running it.

    For ``tools.compile_check``: the launchers run as they always do (every host check,
    every argument they derive), and the launches they would make are handed back, to be
    compiled for a GPU target with exactly the arguments a real launch passes.
    """
    global _captured
    previous, _captured = _captured, []
    try:
        yield _captured
    finally:
        _captured = previous


def launch_kernel(device: torch.device, name: str, grid: tuple, *args, **kwargs) -> None:
    """Launch kernel ``name`` for tensors on ``device``, over ``grid``.

    Compiled Triton launches on the *current* CUDA device, not on the device of its
    arguments, so a launch for ``cuda:1`` runs with ``cuda:1`` made current.
    """
    if _captured is not None:
        _captured.append(Launch(name, grid, args, kwargs))
        return
    kernel = getattr(kernels_for(device), name)
    if device.type == "cuda":
        with torch.cuda.device(device):
            kernel[grid](*args, **kwargs)
    else:
        with patch_language_once():
            kernel[grid](*args, **kwargs)


@contextlib.contextmanager
def patch_language_once() -> Iterator[None]:
    """Inside the block, an interpreted launch patches ``triton.language`` once, not once more
    per ``@jit`` helper call.

    Triton's interpreter patches the language modules a function's globals hold (module
    attributes, so for every function at once) when a launch starts, and restores them when it
    ends; a helper called inside the launch asks for the same patch again, and never restores
    it. Here the first request is served as always and every later request from a function with
    the same globals (the helpers of a binding share its namespace) is skipped: the modules are
    already patched, and stay so until the launch restores them. A request from other globals
    is served as always. Like the interpreter itself, this is for one launch at a time.
    Where the interpreter has no ``_patch_lang`` to wrap, nothing changes. Before Triton 3.7,
    each patch served also sets the tensor's ``__index__`` to :func:`_tensor_index` (restored
    with the rest of the patch).
    """
    real = getattr(interpreter, "_patch_lang", None)
    if real is None:
        yield
        return
    patched: list[dict] = []

    def patch_once(fn):
        if patched and fn.__globals__ is patched[0]:
            return None  # a helper of the launch: its language is patched already
        scope = real(fn)
        if INDEX_NEEDS_MENDING:
            scope.set_attr(tl.core.tensor, "__index__", _tensor_index)
        if not patched:
            patched.append(fn.__globals__)
        return scope

    interpreter._patch_lang = patch_once
    try:
        yield
    finally:
        interpreter._patch_lang = real


def is_interpreted(device: torch.device) -> bool:
    return device.type == "cpu"


__all__ = [
    "Launch",
    "capture_launches",
    "fresh_compiled_kernels",
    "is_interpreted",
    "kernels_for",
    "launch_kernel",
    "patch_language_once",
    "use_kernel_module",
]
