"""How a known-bad module turns ``canary`` into canary-with-one-bug, in its own process.

A mutant is canary with a few lines of its source changed, so the bug is exactly the
change and every other line stays canary's. Text replacements are checked: a replacement
whose ``old`` text no longer occurs raises at import, so a mutant that has drifted away from
canary's code fails loudly instead of quietly testing nothing.

- :func:`patch_kernels` rewrites ``canary/kernels.py`` (:func:`patch_plan_kernels`:
  ``canary/plan_kernels.py``) and makes ``canary._runtime`` bind the rewritten bodies (Triton reads kernel source from real files, so the result is written
  to a per-process temporary directory and imported from there).
- :func:`patch_function` rewrites one Python function or method of a canary module.
- :func:`install` adds a helper that a rewritten function calls.
- :func:`export` gives the mutant module canary's public names, so that
  ``--canary-impl strength.known_bad.<name>`` finds everything there.

Patches are global to the process; the gate runs each mutant in a process of its own.
"""

from __future__ import annotations
import __future__

import atexit
import functools
import importlib.util
import inspect
import itertools
import shutil
import sys
import tempfile
import textwrap
import types
import weakref
from pathlib import Path

import canary
import canary._runtime
import canary.kernels
import canary.plan_kernels

Replacement = tuple[str, str]

_counter = itertools.count()


@functools.cache
def _workdir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="kv-canary-known-bad-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def apply(text: str, replacements: tuple[Replacement, ...], *, what: str) -> str:
    """``text`` with every occurrence of each ``old`` replaced by its ``new``, in order."""
    for old, new in replacements:
        if old not in text:
            raise LookupError(
                f"known-bad patch of {what}: the text to replace no longer occurs; the canary "
                f"source changed and this mutant must be brought up to date:\n{old}"
            )
        text = text.replace(old, new)
    return text


def _write(stem: str, text: str) -> Path:
    path = _workdir() / f"{stem}_{next(_counter)}.py"
    path.write_text(text)
    return path


def _patch_kernel_module(source: types.ModuleType, replacements: tuple[Replacement, ...]):
    text = apply(inspect.getsource(source), replacements, what=source.__file__ or source.__name__)
    stem = source.__name__.rpartition(".")[2]
    path = _write(f"known_bad_{stem}", text)
    name = f"known_bad_{stem}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # Registered before it runs, as an ordinary import would be: inspect finds the source
    # of its functions through sys.modules.
    sys.modules[name] = module
    spec.loader.exec_module(module)
    canary._runtime.use_kernel_module(module, replacing=source)
    return module


def patch_kernels(*replacements: Replacement) -> types.ModuleType:
    """Bind, from now on, the kernel bodies of ``canary/kernels.py`` with ``replacements`` applied."""
    return _patch_kernel_module(canary.kernels, replacements)


def patch_plan_kernels(*replacements: Replacement) -> types.ModuleType:
    """Bind, from now on, the plan and scatter kernel bodies of ``canary/plan_kernels.py`` with
    ``replacements`` applied."""
    return _patch_kernel_module(canary.plan_kernels, replacements)


def _canary_modules() -> list[types.ModuleType]:
    return [
        module
        for name, module in list(sys.modules.items())
        if module is not None and (name == "canary" or name.startswith("canary."))
    ]


def install(owner: object, name: str, value: object, *, rebind: bool = True) -> None:
    """Set ``owner.name`` to ``value``.

    An existing function is replaced, and with ``rebind`` so is every other reference to it
    from a canary module's globals (``from .real_kv_hash import check_sources`` made a copy
    of the name that the launcher of that module looks up). With ``rebind=False`` only
    ``owner`` changes, so a bug can be confined to one code path.
    """
    old = getattr(owner, name, None)
    setattr(owner, name, value)
    if not rebind or old is None:
        return
    for module in _canary_modules():
        if module is owner:
            continue
        for attr, current in list(vars(module).items()):
            if current is old:
                setattr(module, attr, value)


def patch_function(
    owner: object, name: str, *replacements: Replacement, rebind: bool = True
) -> types.FunctionType:
    """Rewrite the function (or method) ``owner.name`` with ``replacements`` applied to its source.

    The rewritten function runs in the original module's globals, so it sees the same
    helpers, constants and any later patch of them; see :func:`install` for ``rebind``.
    """
    original = inspect.unwrap(getattr(owner, name))
    if not isinstance(original, types.FunctionType):
        raise TypeError(f"known-bad patch: {owner!r}.{name} is not a Python function")
    what = f"{original.__module__}.{original.__qualname__}"
    text = apply(textwrap.dedent(inspect.getsource(original)), replacements, what=what)
    path = _write(name.strip("_") or "function", text)
    # canary modules use postponed annotations; the rewritten function must too.
    code = compile(
        text, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True
    )
    defined: dict = {}
    exec(code, original.__globals__, defined)
    function = defined[original.__name__]
    function.__qualname__ = original.__qualname__
    function.__module__ = original.__module__
    install(owner, name, function, rebind=rebind)
    return function


def export(namespace: dict) -> None:
    """Give a mutant module (its ``globals()``) canary's public API, as patched."""
    names = list(canary.__all__)
    namespace.update({name: getattr(canary, name) for name in names})
    namespace["__version__"] = canary.__version__
    namespace["__all__"] = names


class TensorMemory:
    """What a mutant remembers of a tensor across launches, keyed by the tensor object itself
    (a tensor is not a dictionary key: its ``==`` is elementwise), forgotten when it is freed."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref, dict]] = {}

    def of(self, tensor) -> dict:
        held = self._held.get(id(tensor))
        if held is None or held[0]() is not tensor:
            held = self._held[id(tensor)] = (weakref.ref(tensor), {})
        return held[1]
