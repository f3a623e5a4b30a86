"""SGLang's modules as the legs load them: from the installed wheel, without its serving stack.

SGLang's package ``__init__`` imports the whole server, so the legs register each package they
need as a bare package pointing at its installed folder (:func:`register_package`) and import
the modules below it, unmodified. Each loader returns a namespace of the modules it loaded and
is cached (the suite's SGLang adapter, which loads kv_canary's kernels, registers the packages
afresh when it is first imported):

- :func:`runtime`: ``plan_input`` and ``ForwardMode`` (executed from its own source in
  ``model_executor/forward_batch_info.py``, whose module needs the serving stack);
- :func:`token_oracle_modules`: ``token_oracle/`` and ``expected_inputs``;
- :func:`splice_modules`: ``buffer_group`` and ``pool_patcher/buf_info_splice.py``;
- :func:`sweep_builder`: ``sweep_plan_builder`` with the tree walker stood in for
  (:func:`walk_radix_cache`);
- :func:`perturb_modules`: the ``perturb`` package;
- :func:`manager_modules`: the per-forward runtime (``single_forward_manager/``, ``runner/``,
  ``state``, ``config``, ``endpoint``, the phase checker), with stand-ins of
  ``sglang.srt.utils`` and ``sglang.srt.runtime_context``; while its code runs on a CPU build
  of torch, :func:`cpu_only` stands in for pinned memory and ``torch.cuda``'s streams.

An import of the adapter (``conformance.adapters.sglang``), which imports the installed
``sglang``, stays inside the loaders: this module imports without SGLang.
"""

from __future__ import annotations
import __future__

import ast
import contextlib
import dataclasses
import enum
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from array import array
from pathlib import Path

import numpy as np
import torch

from conformance import upstream

__all__ = [
    "CPU_CUDA_CALLS",
    "KV_CANARY",
    "UNPINNED_FACTORIES",
    "UNPINNED_METHOD",
    "DebugKernel",
    "canary_config",
    "cpu_only",
    "from_source",
    "import_all",
    "methods_from_source",
    "load_or_say",
    "mem_cache",
    "manager_modules",
    "perturb_modules",
    "register_package",
    "runtime",
    "runtime_sources",
    "sglang_root",
    "splice_modules",
    "sweep_builder",
    "token_oracle_modules",
    "torch_device_calls",
    "walk_radix_cache",
]

#: SGLang's canary runtime package.
KV_CANARY = "sglang.srt.kv_canary"


def sglang_root() -> Path:
    """The installed ``sglang`` folder (that of a bare package already registered, if any)."""
    module = sys.modules.get("sglang")
    if module is not None and getattr(module, "__path__", None):
        return Path(list(module.__path__)[0])
    return upstream.sglang_root()


def mem_cache() -> Path:
    """The installed release's ``srt/mem_cache`` folder (``ImportError`` without SGLang)."""
    return sglang_root() / "srt" / "mem_cache"


def load_or_say(loader) -> bool:
    """Whether ``loader`` loads SGLang's modules; where it cannot (no sglang, or one without the
    runtime), the error, said on stderr."""
    try:
        loader()
    except ImportError as error:
        print(f"error: {error}", file=sys.stderr)
        return False
    return True


def register_package(name: str) -> None:
    """Register ``name`` (a package of the installed ``sglang``) as a bare package pointing at
    its folder, without running its ``__init__``, unless it is registered already."""
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(sglang_root().joinpath(*name.split(".")[1:]))]
        sys.modules[name] = importlib.util.module_from_spec(spec)


def import_all(package: str, **modules: str) -> types.SimpleNamespace:
    """The modules ``package.<dotted>`` of ``modules`` (attribute name -> dotted name)."""
    return types.SimpleNamespace(
        **{name: importlib.import_module(f"{package}.{dotted}") for name, dotted in modules.items()}
    )


@functools.cache
def runtime() -> types.SimpleNamespace:
    """SGLang's ``plan_input`` module and ``ForwardMode``, from the installed wheel, without
    its serving stack (bare parent packages point at the installed folders)."""
    root = sglang_root()
    for name in ("sglang", "sglang.srt", KV_CANARY):
        register_package(name)
    source = (root / "srt" / "model_executor" / "forward_batch_info.py").read_text()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    scope = {"IntEnum": enum.IntEnum, "auto": enum.auto, "total_ordering": functools.total_ordering}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "forward_batch_info.py", "exec"), scope)
    plan_input = importlib.import_module(f"{KV_CANARY}.plan_input")
    return types.SimpleNamespace(ForwardMode=scope["ForwardMode"], plan_input=plan_input)


@functools.cache
def token_oracle_modules() -> types.SimpleNamespace:
    """SGLang's ``token_oracle`` (its manager and oracle) and ``expected_inputs`` modules."""
    runtime()
    register_package(f"{KV_CANARY}.token_oracle")
    return import_all(
        KV_CANARY, expected_inputs="expected_inputs", token_oracle="token_oracle.oracle",
        oracle_manager="token_oracle.oracle_manager",
    )  # fmt: skip


def splice_modules() -> types.SimpleNamespace:
    """SGLang's ``buffer_group`` and ``pool_patcher.buf_info_splice``, which import its
    kv_canary kernels' module: loaded through the suite's SGLang adapter (its kv_canary without
    the serving stack), then the runtime's packages beside it."""
    from conformance.adapters import sglang as adapter  # imports the installed sglang

    runtime.cache_clear()  # the adapter registered the packages afresh
    runtime()
    register_package(f"{KV_CANARY}.pool_patcher")
    mods = import_all(KV_CANARY, buffer_group="buffer_group", splice="pool_patcher.buf_info_splice")
    mods.slot_bytes = int(adapter.verify.CANARY_SLOT_BYTES)
    return mods


def walk_radix_cache(
    *, radix_cache, unlocked_only: bool = False, swa_resident_only: bool = False, **_
) -> object:
    """Stands for ``radix_cache_walker.walk_radix_cache_for_canary`` (whose module needs SGLang's
    memory-cache stack): the stand-in tree's walk
    (:class:`conformance.sglang.standins.RadixCacheStandIn`), of its unlocked nodes only if
    asked, and of the slots still in the SWA pool only if asked."""
    walk = radix_cache.unlocked if unlocked_only else radix_cache.walk
    assert walk is not None
    if swa_resident_only:
        assert radix_cache.lut is not None
        keep = radix_cache.lut[walk.slot_indices] != 0  # 0: evicted from the SWA pool
        walk = types.SimpleNamespace(**{k: v[keep] for k, v in vars(walk).items()})
    return walk


@functools.cache
def sweep_builder() -> types.ModuleType:
    """SGLang's ``sweep_plan_builder`` (unmodified), with the tree walker stood in for."""
    splice_modules()  # the kernels' module (``VerifyPlan``) and the runtime's packages
    name = f"{KV_CANARY}.radix_cache_walker"
    walker = types.ModuleType(name)
    walker.walk_radix_cache_for_canary = walk_radix_cache  # type: ignore[attr-defined]
    sys.modules[name] = walker
    return importlib.import_module(f"{KV_CANARY}.sweep_plan_builder")


@functools.cache
def perturb_modules() -> types.SimpleNamespace:
    """SGLang's ``perturb`` package: its five perturbations, config and utilities, and the
    ``RealKvSource`` and ``buffer_group`` its KV perturbations read."""
    sweep_builder()  # the kernels' modules, the runtime's packages and the walker stand-in
    name = f"{KV_CANARY}.perturb"
    register_package(name)
    from conformance.adapters import sglang as adapter  # imports the installed sglang

    mods = import_all(
        name, req_to_token="req_to_token", kv_used="real_kv_used",
        kv_post_forward="real_kv_post_forward", kv_unused_cache="real_kv_unused_cache",
        next_token_swap="next_token_swap", config="config", utils="utils",
    )  # fmt: skip
    mods.RealKvSource = adapter.RealKvSource
    mods.buffer_group = importlib.import_module(f"{KV_CANARY}.buffer_group")
    return mods


#: The torch factories whose ``pin_memory=True`` :func:`cpu_only` drops.
UNPINNED_FACTORIES = ("zeros", "empty", "tensor")
#: ... and the method, which it makes return the tensor itself.
UNPINNED_METHOD = "Tensor.pin_memory"
#: The calls of ``torch.cuda`` that :func:`cpu_only` makes ``torch.cpu``'s.
CPU_CUDA_CALLS = ("is_current_stream_capturing", "current_stream", "stream", "Event")


def torch_device_calls(sources) -> tuple[set[str], set[str]]:
    """What SGLang's ``sources`` (texts) ask of torch that a CPU build cannot give: the
    ``torch.cuda`` functions they call, and the ``torch`` factories they call with
    ``pin_memory=True`` (``"Tensor.pin_memory"`` for the method), read from each syntax tree
    (annotations that name ``torch.cuda``'s classes are no calls)."""
    cuda, pinned = set(), set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner, name = node.func.value, node.func.attr
            dotted = ast.unparse(owner)
            if dotted == "torch.cuda":
                cuda.add(name)
            elif name == "pin_memory" and not node.args:
                pinned.add("Tensor.pin_memory")
            pins = any(
                k.arg == "pin_memory"
                and not (isinstance(k.value, ast.Constant) and not k.value.value)
                for k in node.keywords
            )
            if pins and dotted == "torch":
                pinned.add(name)
    return cuda, pinned


#: The functions of ``srt/utils/common.py`` the leg runs from source.
COMMON_FUNCTIONS = ("flatten_arrays_to_pinned_cpu", "flatten_arrays_to_int64_tensor")


def runtime_sources() -> list[str]:
    """The source of SGLang's code the per-forward leg runs: the modules
    :func:`manager_modules` loaded (``srt/kv_canary``'s and the phase checker) and the
    functions of ``srt/utils/common.py`` it runs from source."""
    manager_modules()
    names = [n for n in sys.modules if n.startswith(KV_CANARY)]
    names.append("sglang.srt.utils.phase_checker")
    files = sorted({f for n in names if (f := getattr(sys.modules[n], "__file__", None))})
    sources = [Path(f).read_text() for f in files]
    common = (sglang_root() / "srt" / "utils" / "common.py").read_text()
    for node in ast.parse(common).body:
        if isinstance(node, ast.FunctionDef) and node.name in COMMON_FUNCTIONS:
            sources.append(ast.get_source_segment(common, node) or "")
    return sources


@contextlib.contextmanager
def cpu_only():
    """Inside the block, on a torch without CUDA (a CPU build): ``pin_memory=True`` asks the
    factories :data:`UNPINNED_FACTORIES` (and ``Tensor.pin_memory``) for ordinary host memory,
    as there is no pinned allocator; and the calls of ``torch.cuda`` that releases up to 0.5.20 make where later ones
    ask the tensor's device module (the phase checker's debug message, formatted on every
    phase change, asks ``is_current_stream_capturing``: False, nothing captures; the host copy
    of ``runner/future_tensor.py`` takes ``current_stream``, ``stream`` and ``Event``) are
    ``torch.cpu``'s (:data:`CPU_CUDA_CALLS`); elsewhere nothing changes. Exactly what the
    runtime's source calls is stood in for: a self-test reads it (:func:`torch_device_calls`)."""
    if torch.cuda.is_available():
        yield
        return
    saved = {n: getattr(torch, n) for n in UNPINNED_FACTORIES}
    saved_cuda = {n: getattr(torch.cuda, n) for n in CPU_CUDA_CALLS}
    saved_pin = torch.Tensor.pin_memory

    def unpinned(factory):
        def call(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return call

    for n in UNPINNED_FACTORIES:
        setattr(torch, n, unpinned(saved[n]))
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.current_stream = lambda device=None: torch.cpu.current_stream()
    torch.cuda.stream = torch.cpu.stream
    torch.cuda.Event = torch.cpu.Event
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)
        for n, f in saved_cuda.items():
            setattr(torch.cuda, n, f)
        torch.Tensor.pin_memory = saved_pin  # type: ignore[method-assign]


def from_source(
    path: Path, names: tuple[str, ...], scope: dict, *, scope_imports: bool = False
) -> dict:
    """The top-level functions and classes ``names`` of SGLang's file ``path``, executed from
    its source in ``scope`` (its annotations unevaluated, as its ``from __future__ import
    annotations`` leaves them); a name the file does not define at the top raises
    ``LookupError``. ``scope_imports``: a function's own ``from ... import`` statements take
    their names from ``scope`` instead (each name must be there)."""
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.ClassDef)
    body = [n for n in tree.body if isinstance(n, kinds) and n.name in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        raise LookupError(f"{path} defines no {', '.join(sorted(missing))}")
    for node in body if scope_imports else ():
        if isinstance(node, ast.FunctionDef):
            local = [s for s in node.body if isinstance(s, ast.ImportFrom)]
            absent = {a.asname or a.name for s in local for a in s.names} - set(scope)
            if absent:
                raise LookupError(f"{path}: {node.name} imports {sorted(absent)}, not given")
            node.body = [s for s in node.body if not isinstance(s, ast.ImportFrom)]
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec", flags=flags), scope)
    return scope


def methods_from_source(path: Path, cls: str, names: tuple[str, ...], scope: dict) -> dict:
    """The methods ``names`` of class ``cls`` in SGLang's file ``path``, executed from source
    in ``scope`` as plain functions (decorators dropped, annotations unevaluated); their own
    ``from ... import`` statements take their names from ``scope``."""
    tree = ast.parse(path.read_text())
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
    body = [] if node is None else [
        f for f in node.body if isinstance(f, ast.FunctionDef) and f.name in names
    ]  # fmt: skip
    missing = set(names) - {f.name for f in body}
    if missing:
        raise LookupError(f"{path}: {cls} has no {sorted(missing)}")
    for f in body:
        f.decorator_list = []
        f.body = [s for s in f.body if not isinstance(s, ast.ImportFrom)] or [ast.Pass()]
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec", flags=flags), scope)
    return {name: scope[name] for name in names}


def _not_run(*args, **kwargs):
    raise AssertionError("the server's options are given to canary_config alone")


def canary_config(config_module, *, options: dict, env: dict):
    """SGLang's ``CanaryConfig.from_env`` (of ``config_module``, its ``config.py``) run as a
    server runs it, with the server's canary options ``options`` (``kv_canary``,
    ``kv_canary_real_data``, ``kv_canary_sweep_interval``: what ``get_observability()`` gives
    from 0.5.20, the server args before) and the environment variables ``env`` set while it
    reads them (every one it reads: a variable of the caller's environment would change the
    leg's canary otherwise); both put back after."""
    server_args = types.SimpleNamespace(**options)
    saved_options = getattr(config_module, "get_observability", None)
    if saved_options is not None:
        config_module.get_observability = lambda: server_args
    saved_env = {name: os.environ.get(name) for name in env}
    os.environ.update({name: str(value) for name, value in env.items()})
    try:
        return config_module.CanaryConfig.from_env(server_args)
    finally:
        if saved_options is not None:
            config_module.get_observability = saved_options
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _stand_in_utils(root: Path) -> None:
    """``sglang.srt.runtime_context`` and ``sglang.srt.utils`` as the manager reads them:
    ``get_observability`` (raises: :func:`canary_config` gives ``CanaryConfig.from_env`` the
    server's options), ``is_device_stream_capturing`` (False: nothing
    captures on the CPU) and ``utils.common.flatten_arrays_to_int64_tensor``, executed from
    SGLang's own source (whose module imports the serving stack)."""
    context = types.ModuleType("sglang.srt.runtime_context")
    context.get_observability = _not_run  # type: ignore[attr-defined]
    sys.modules.setdefault(context.__name__, context)
    register_package("sglang.srt.utils")
    utils = sys.modules["sglang.srt.utils"]
    utils.is_device_stream_capturing = lambda device: False  # type: ignore[attr-defined]
    common = types.ModuleType("sglang.srt.utils.common")
    scope = from_source(
        root / "srt" / "utils" / "common.py",
        COMMON_FUNCTIONS,
        {"np": np, "torch": torch, "List": list, "array": array},
    )
    common.flatten_arrays_to_int64_tensor = scope["flatten_arrays_to_int64_tensor"]  # type: ignore[attr-defined]
    sys.modules.setdefault(common.__name__, common)


@functools.cache
def manager_modules() -> types.SimpleNamespace:
    """SGLang's per-forward runtime modules, with the stand-ins of ``sglang.srt.utils`` and
    ``sglang.srt.runtime_context``, its launchers bound to the adapter's (SGLang's launchers as
    the adapter runs them on CPU tensors: their references where a release has no CPU path,
    the Triton kernels interpreted) and its phase checker's kernel interpreted."""
    from conformance.adapters import sglang as adapter  # imports the installed sglang

    sweep_builder()  # the kernels, the runtime's packages, the walker stand-in
    for name in ("runner", "single_forward_manager", "token_oracle"):
        register_package(f"{KV_CANARY}.{name}")
    _stand_in_utils(sglang_root())
    out = import_all(
        KV_CANARY, config="config", state="state", buffer_group="buffer_group",
        endpoint="endpoint", launcher="runner.kernel_launcher",
        scatter="req_to_expected_token_ids_manager", manager="single_forward_manager.manager",
        sweep="runner.sweep", violations="runner.violation_manager",
        reporter="runner.violation_reporter",
    )  # fmt: skip
    out.adapter = adapter
    out.phase = importlib.import_module("sglang.srt.utils.phase_checker")
    out.token_oracle = token_oracle_modules()
    # bound where SGLang's runtime looks them up
    out.endpoint.launch_canary_verify_kernel = adapter.launch_canary_verify_kernel
    out.endpoint.launch_canary_write_kernel = adapter.launch_canary_write_kernel
    out.launcher.launch_canary_plan_kernels = adapter.launch_canary_plan_kernels
    out.scatter.launch_scatter_req_token_ids_kernel = adapter.launch_scatter_req_token_ids_kernel
    namespace = adapter.interpreted_namespace(out.phase)
    kernel = out.phase._phase_check_kernel
    out.phase._phase_check_kernel = DebugKernel(
        namespace["_phase_check_kernel"], debug=bool(getattr(kernel, "debug", False))
    )
    return out


class DebugKernel:
    """An interpreted Triton kernel launched (``kernel[grid](...)``) with the ``debug`` its
    ``@triton.jit`` gave it: Triton's interpreter strips ``tl.device_assert`` unless its own
    options say debug, whatever the decorator said, so SGLang's phase checker
    (``@triton.jit(debug=True)``) would only print its failure; here, as on a GPU, it raises
    (Triton's ``InterpreterError`` wrapping the ``AssertionError`` that names the phase
    mismatch); a kernel whose decorator did not ask for debug stays silent, as a compiled one
    does."""

    def __init__(self, kernel, *, debug: bool):
        self.kernel, self.debug = kernel, debug

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def launched(*args, **kwargs):
            from triton.runtime import interpreter

            builder = interpreter.interpreter_builder
            saved = builder.options
            builder.options = dataclasses.replace(saved, debug=self.debug or saved.debug)
            try:
                return launch(*args, **kwargs)
            finally:
                builder.options = saved

        return launched
