"""SGLang's own KV canary under the conformance suite: ``--canary-impl conformance.adapters.sglang``.

What runs: the ``kv_canary`` package of the installed ``sglang`` wheel, any release from
0.5.13 (``pip install --no-deps sglang==X``; ``INSTALLED`` is its version, ``LAYOUT`` the
package it found). kv_canary lives in ``sglang/jit_kernel/kv_canary/`` up to 0.5.16 and in
``sglang/kernels/ops/kv_canary/`` from 0.5.17; this module finds whichever the installed
wheel has. ``conformance/upstream.py`` lists the releases, the content hash of each one's
kv_canary files and its expectations file.

Which of SGLang's paths runs:

- CPU tensors (the ``tox -e sglang-0.5.NN`` legs): SGLang's pure-torch references
  ``verify_ref.launch_canary_verify_kernel_torch_reference`` and
  ``write_ref.launch_canary_write_kernel_torch_reference``, reached through SGLang's own
  launchers. From 0.5.21 a launcher sends CPU tensors to its reference itself
  (``kv_canary._dispatch``), right after its source-count check. Releases before 0.5.21 have
  no CPU path: their launcher runs all its own checks and then loads its CUDA JIT kernel. For
  those, the JIT loader here stops the launch at that point and the launcher's torch reference
  runs in the kernel's place, so the run shows the release's own checks and its own reference
  semantics (``PATH_TAKEN`` says which).
- CUDA tensors: SGLang's CUDA JIT kernels. They need the complete ``sglang`` with its
  dependencies; this module uses that complete package when the machine has a CUDA device and
  importing kv_canary's ``verify`` module from it succeeds.

The plan group (CONTRACT §12-§14), on CPU tensors:

- ``launch_canary_plan_kernels``: SGLang's launcher as SGLang dispatches it. From 0.5.21 it
  sends CPU tensors to its torch reference (``plan_ref``), after its P2 check. Before 0.5.21
  it has no CPU path and runs its kernel path: its checks, its Triton offsets kernel, then its
  CUDA JIT entries kernel, which the JIT loader here stops after that kernel's own P3 check;
  the torch reference's verify entries (``plan_ref._materialize_verify_entries``) then run in
  the entries kernel's place, written only when they fit, as the offsets kernel's ``enable``
  says. ``CANARY_SGLANG_PLAN=kernels`` takes that kernel path on every release, also where
  SGLang would dispatch to its reference (``PLAN_PATH_TAKEN`` says which ran): SGLang's own
  Triton kernel and its own reference side by side, so that where they disagree the suite
  shows it (``docs/upstream/repro_13_*.py`` and ``repro_14_*.py`` show it on any release).
- ``launch_scatter_req_token_ids_kernel``: SGLang's launcher with its Triton kernel, on every
  release (0.5.13 to 0.5.22 also ship ``scatter_req_token_ids_torch_reference``, which
  SGLang's launcher never calls and this module does not use).
- ``REQ_POOL_IDX_PADDING``: SGLang's constant (``consts``).

SGLang decorates its Triton kernels when its modules are imported, without
``TRITON_INTERPRET``, so they are compiled kernels, and so are Triton's own ``@jit`` helpers
(``tl.sum``, ``tl.cumsum``), decorated when Triton was imported. For CPU tensors this module
binds each of SGLang's kernels once more, interpreted: the undecorated function
(``kernel.fn``) copied into a namespace of its own in which SGLang's helpers are interpreted
too, with the launcher that calls it copied into that namespace; during such a launch
``triton.language``'s ``@jit`` helpers are interpreted copies, put back after it. SGLang's code
is unchanged: only the mode its kernels run in is. Each interpreted launch runs under the
suite's memory watch (``conformance.bounds``): where SGLang's kernel reads or writes outside the
call's buffers (the scatter with bad offsets or pool rows, the offsets kernel with a row past
the table), the access is masked off, so that it cannot corrupt this process, and the call
fails with an ``AssertionError`` naming it: the suite cannot check what such a launch computes,
and a GPU would make those accesses.

Everywhere else (no CUDA device, the serving stack's dependencies absent, or
``CANARY_SGLANG_STANDALONE=1``), SGLang's kv_canary modules are loaded from the installed
files without executing the serving stack: ``sglang/__init__.py`` imports the whole server and
kv_canary imports SGLang's CUDA JIT utilities, which pull ``sglang.srt``. So the parent
packages of kv_canary and of the JIT utilities are registered as bare packages pointing at the
installed directories (kv_canary's own ``__init__``, which from 0.5.23 registers kernels with
SGLang's kernel registry, is not run), and the JIT utilities as a stand-in whose loader stops
a launch as above.

What this module adds, and why it translates conventions only:

- ``RealKvSource``, ``RealKvHashMode``, ``CanaryLaunchTag``, ``VerifyOrWriteContext``,
  ``VerifyPlan`` and ``WritePlan`` are SGLang's own objects, unchanged; the two launchers are
  SGLang's, wrapped only to run the torch reference where an old release would need CUDA.
- ``fingerprint``: SGLang has no public fingerprint function; its hash is computed inside the
  launches. This one runs exactly that computation: the source-count check both SGLang
  launchers apply first, then the release's own per-slot reference hash
  (``verify_ref._compute_real_kv_hash_scalar``, with ``verify_ref.materialize_real_kv_sources``
  from 0.5.21, whose signature changed then), returned as the contract's int64 tensor on the
  slots' device.
- ``CANARY_CAPABILITIES``: SGLang's launch contract takes 2-D sources only (its CUDA launcher
  refuses a source that is not 2-D after ``.view(torch.uint8)``), so the suite's generated and
  fixed layouts stay 2-D for this module; its N-D tests still run, and their failures are
  listed in each release's expectations file.

Every release from 0.5.13 to 0.5.23 has every piece the suite uses, the plan group included
(``plan/api.py``, ``plan/offsets_kernel.py``, ``plan/entries_kernel.py``, ``plan_ref.py`` and
``scatter_req_token_ids.py`` in both layouts). A release in which one
is missing, or whose kv_canary is in neither place, fails to import here with an
``ImportError`` that names what is missing, never an ``AttributeError`` in a test.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from conformance import bounds, upstream

#: What the suite may give this implementation: sources of at most 2 dimensions.
CANARY_CAPABILITIES = {"source_ndim_max": 2}

#: What the suite needs of each kv_canary module.
NEEDED = {
    "consts": ("RealKvHashMode", "MAX_REAL_KV_SOURCES", "REQ_POOL_IDX_PADDING"),
    "verify": (
        "RealKvSource",
        "CanaryLaunchTag",
        "VerifyOrWriteContext",
        "VerifyPlan",
        "launch_canary_verify_kernel",
    ),
    "write": ("WritePlan", "launch_canary_write_kernel"),
    "verify_ref": (
        "launch_canary_verify_kernel_torch_reference",
        "_compute_real_kv_hash_scalar",
        "_to_signed_int64",
    ),
    "write_ref": ("launch_canary_write_kernel_torch_reference",),
    "plan.api": ("launch_canary_plan_kernels",),
    "plan.offsets_kernel": ("launch_plan_offsets_kernel", "_plan_offsets_kernel"),
    "plan_ref": ("launch_canary_plan_kernels_torch_reference", "_materialize_verify_entries"),
    "scatter_req_token_ids": (
        "launch_scatter_req_token_ids_kernel",
        "_scatter_req_token_ids_kernel",
    ),
}


class CudaJitReached(RuntimeError):
    """Raised by the stand-in JIT loader: the launch reached SGLang's CUDA kernel."""


def _no_cuda_jit(*args, **kwargs):
    raise CudaJitReached(
        "kv-canary adapter: SGLang's CUDA JIT path was taken, but the JIT utilities are a "
        "stand-in here (the full sglang package and its dependencies did not import); "
        "install SGLang with its dependencies on the GPU host to run its CUDA kernels"
    )


def _cache_once(fn):
    return functools.cache(fn)


def _jit_utils_stand_in(name: str) -> types.ModuleType:
    utils = types.ModuleType(name)
    utils.__doc__ = "Stand-in for SGLang's CUDA JIT loader: any JIT use raises CudaJitReached."
    utils.cache_once = _cache_once
    utils.load_jit = _no_cuda_jit
    utils.make_cpp_args = lambda *args: [str(a).lower() for a in args]
    return utils


def _forget_sglang() -> None:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


def _load_standalone(root: Path, kv: str, jit: str) -> None:
    _forget_sglang()
    names = set()
    for dotted in (kv, jit):
        parts = dotted.split(".")
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    for name in sorted(names, key=lambda n: n.count(".")):
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        package.__package__ = name
        # a spec, so that importlib.util.find_spec("sglang") still finds the wheel's folder
        package.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        package.__spec__.submodule_search_locations = list(package.__path__)
        sys.modules[name] = package
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, package)
    utils = _jit_utils_stand_in(f"{jit}.utils")
    sys.modules[utils.__name__] = utils
    sys.modules[jit].utils = utils


def _load() -> tuple[str, str]:
    """Import SGLang's kv_canary modules: (its dotted name, which load was used)."""
    root = upstream.sglang_root()
    kv, jit = ("sglang." + folder.replace("/", ".") for folder in upstream.layout(root))
    if torch.cuda.is_available() and os.environ.get("CANARY_SGLANG_STANDALONE") != "1":
        try:
            importlib.import_module(f"{kv}.verify")
            return kv, "complete sglang package (CUDA JIT kernels on CUDA tensors)"
        except ImportError:
            _forget_sglang()
    _load_standalone(root, kv, jit)
    return kv, "kv_canary modules alone (torch reference path; CUDA JIT stand-in)"


INSTALLED = upstream.installed_version() or "unknown"
LAYOUT, PATH_TAKEN = _load()


def _module(name: str) -> types.ModuleType:
    module = importlib.import_module(f"{LAYOUT}.{name}")
    missing = [attr for attr in NEEDED[name] if not hasattr(module, attr)]
    if missing:
        raise ImportError(
            f"sglang {INSTALLED}: {LAYOUT}.{name} lacks {', '.join(missing)}, which the "
            "adapter needs (conformance/adapters/sglang.py)"
        )
    return module


consts = _module("consts")
verify = _module("verify")
write = _module("write")
verify_ref = _module("verify_ref")
write_ref = _module("write_ref")
plan_api = _module("plan.api")
plan_offsets = _module("plan.offsets_kernel")
plan_ref = _module("plan_ref")
scatter = _module("scatter_req_token_ids")

#: Whether the launchers send CPU tensors to the torch reference themselves (0.5.21 and later).
DISPATCHES_OFF_CUDA = importlib.util.find_spec(f"{LAYOUT}._dispatch") is not None
if "stand-in" in PATH_TAKEN:
    PATH_TAKEN += (
        "; CPU tensors reach the torch reference through SGLang's launchers"
        if DISPATCHES_OFF_CUDA
        else "; on CPU tensors SGLang's launchers run their checks, then the torch reference "
        "in place of the CUDA kernel (no CPU path before 0.5.21)"
    )

__version__ = f"sglang {INSTALLED}: {PATH_TAKEN}"

RealKvSource = verify.RealKvSource
RealKvHashMode = consts.RealKvHashMode
CanaryLaunchTag = verify.CanaryLaunchTag
VerifyOrWriteContext = verify.VerifyOrWriteContext
VerifyPlan = verify.VerifyPlan
WritePlan = write.WritePlan
REQ_POOL_IDX_PADDING = consts.REQ_POOL_IDX_PADDING


def _off_cuda(context) -> bool:
    device = getattr(getattr(context, "canary_buf", None), "device", None)
    return getattr(device, "type", None) != "cuda"


def _or_reference(launcher, reference, args: dict) -> None:
    """SGLang's ``launcher``; its torch ``reference`` in the kernel's place where the launcher
    reached a CUDA JIT kernel with tensors off CUDA."""
    try:
        launcher(**args)
    except CudaJitReached:
        if not _off_cuda(args["context"]):
            raise
        reference(**args)


def launch_canary_write_kernel(
    *,
    context,
    plan,
    input_ids,
    positions,
    out_cache_loc,
    enable_write_input_assert,
    expected_input_tokens,
    expected_input_positions,
) -> None:
    """SGLang's write launcher; its torch reference where the release would need CUDA."""
    args = dict(locals())  # the keyword arguments, as given
    _or_reference(
        write.launch_canary_write_kernel, write_ref.launch_canary_write_kernel_torch_reference, args
    )


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token) -> None:
    """SGLang's verify launcher; its torch reference where the release would need CUDA."""
    args = dict(locals())  # the keyword arguments, as given
    _or_reference(
        verify.launch_canary_verify_kernel,
        verify_ref.launch_canary_verify_kernel_torch_reference,
        args,
    )


def _slot_hashes(sources: tuple, mode, slots: list[int]) -> list[int]:
    """The release's own per-slot reference hash (u64) of each slot."""
    cpu = torch.device("cpu")
    if hasattr(verify_ref, "materialize_real_kv_sources"):  # 0.5.21 and later
        host_sources = verify_ref.materialize_real_kv_sources(
            real_kv_sources=sources,
            real_kv_hash_mode=mode,  # taken as int(mode) there, as in SGLang's launches
            slot_indices=slots,
            work_device=cpu,
        )
        return [
            verify_ref._compute_real_kv_hash_scalar(slot_idx=slot, host_sources=host_sources)
            for slot in slots
        ]
    return [
        verify_ref._compute_real_kv_hash_scalar(
            slot_idx=slot, real_kv_sources=sources, real_kv_hash_mode=mode, work_device=cpu
        )
        for slot in slots
    ]


def fingerprint(sources, slot_indices, *, mode=RealKvHashMode.ALL) -> torch.Tensor:
    """SGLang's per-slot real-KV hash, as computed inside its launches (see the module header)."""
    sources = tuple(sources)
    if len(sources) > consts.MAX_REAL_KV_SOURCES:
        # the check SGLang's launchers run before any hashing, with their message
        raise ValueError(
            f"kv-canary: at most {consts.MAX_REAL_KV_SOURCES} RealKvSource entries supported "
            f"by the CUDA ABI, got {len(sources)}"
        )
    slots = [int(s) for s in slot_indices.tolist()]
    hashes = [verify_ref._to_signed_int64(h) for h in _slot_hashes(sources, mode, slots)]
    return torch.tensor(hashes, dtype=torch.int64, device=slot_indices.device)


# ---------------------------------------------------------------------------------------------
# The plan group (CONTRACT §12-§14): SGLang's plan launcher and its expected-token scatter, their
# Triton kernels bound interpreted for CPU tensors (see the module header).


def _copy_function(fn: types.FunctionType, namespace: dict) -> types.FunctionType:
    copy = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__qualname__ = fn.__qualname__
    copy.__annotations__ = dict(fn.__annotations__)  # tl.constexpr parameters stay constexpr
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__module__ = fn.__module__
    return copy


def interpreted_namespace(module: types.ModuleType, **overrides) -> dict:
    """``module``'s globals with each ``@triton.jit`` function (its own and those it imported)
    interpreted, and its plain functions copied so that they call those; ``overrides``
    replace names first."""
    namespace = {**vars(module), **overrides}
    namespace["__name__"] = f"{module.__name__}[interpreted]"
    for name, value in list(namespace.items()):
        if isinstance(value, JITFunction):
            namespace[name] = InterpretedFunction(_copy_function(value.fn, namespace))
        elif (
            isinstance(value, types.FunctionType)
            and value.__module__ == module.__name__
            and name not in overrides
        ):
            namespace[name] = _copy_function(value, namespace)
    return namespace


@functools.cache
def _interpreted_language_helpers() -> dict:
    """Triton's own ``@jit`` helpers of ``triton.language`` (``tl.sum``, ``tl.cumsum``, ...),
    interpreted: they were decorated, compiled, when Triton was imported."""
    return {
        name: InterpretedFunction(value.fn)
        for name, value in vars(tl).items()
        if isinstance(value, JITFunction)
    }


@contextlib.contextmanager
def _interpreted_language():
    """Inside the block, ``triton.language``'s ``@jit`` helpers are the interpreted ones (one
    interpreted launch at a time, as Triton's interpreter itself patches the language)."""
    helpers = _interpreted_language_helpers()
    saved = {name: getattr(tl, name) for name in helpers}
    for name, helper in helpers.items():
        setattr(tl, name, helper)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(tl, name, value)


@functools.cache
def _interpreted_scatter() -> types.FunctionType:
    """SGLang's scatter launcher, launching its Triton kernel interpreted."""
    return interpreted_namespace(scatter)["launch_scatter_req_token_ids_kernel"]


@functools.cache
def _kernels_path_plan() -> types.FunctionType:
    """SGLang's plan launcher on its kernel path (its CUDA path's checks, the Triton offsets
    kernel interpreted, then the CUDA entries kernel, which the stand-in JIT loader stops),
    also where a release from 0.5.21 would dispatch CPU tensors to its torch reference."""
    offsets = interpreted_namespace(plan_offsets)["launch_plan_offsets_kernel"]
    overrides: dict = {"launch_plan_offsets_kernel": offsets}
    if "use_torch_reference" in vars(plan_api):
        overrides["use_torch_reference"] = lambda device: False
    namespace = {**vars(plan_api), **overrides}
    return _copy_function(plan_api.launch_canary_plan_kernels, namespace)


def _watched(name: str, **arguments):
    """The suite's memory-bounds watch over an interpreted launch (``conformance.bounds``): an
    access outside the call's buffers is masked off, so that it cannot corrupt this process,
    and fails the call with an ``AssertionError`` naming it."""
    return bounds.watching(f"{name}()", **arguments)


#: Which of SGLang's plan paths runs for CPU tensors: ``dispatch`` (the default: the release's
#: public launcher as SGLang dispatches it, which is its torch reference from 0.5.21 and its
#: kernel path before) or ``kernels`` (``CANARY_SGLANG_PLAN=kernels``: the kernel path on every
#: release, the Triton offsets kernel interpreted and the torch reference's entries in the CUDA
#: entries kernel's place).
PLAN_PATH = os.environ.get("CANARY_SGLANG_PLAN", "dispatch")
if PLAN_PATH not in ("dispatch", "kernels"):
    raise ImportError(f"CANARY_SGLANG_PLAN={PLAN_PATH!r}: use dispatch or kernels")
PLAN_PATH_TAKEN = (
    "SGLang's launcher, which sends CPU tensors to its torch reference"
    if DISPATCHES_OFF_CUDA and PLAN_PATH == "dispatch"
    else "SGLang's kernel path: its checks, the Triton offsets kernel (interpreted), then the "
    "torch reference's entries in place of the CUDA entries kernel"
)
__version__ += f"; plan on CPU: {PLAN_PATH_TAKEN}; scatter: its Triton kernel (interpreted on CPU)"


def _reference_entries(args: dict) -> None:
    """What SGLang's CUDA entries kernel does, as its torch reference does it: the verify entries
    (``plan_ref._materialize_verify_entries``, given the plan launch's ``args`` as the
    reference's launcher makes them), written only when they fit, as the offsets kernel's
    ``enable`` says."""
    cpu = torch.device("cpu")

    def host(name):
        tensor = args[name]
        return None if tensor is None else tensor.detach().to(device=cpu, dtype=torch.int64)

    lut = args["full_to_swa_index_mapping"]
    plan_ref._materialize_verify_entries(
        verify_plan_out=args["verify_plan_out"],
        req_pool_indices_host=host("req_pool_indices"),
        prefix_lens_host=host("prefix_lens"),
        req_to_token_host=host("req_to_token"),
        swa_window_size=args["swa_window_size"],
        lut=None if lut is None else lut.to(cpu),
        verify_capacity=args["verify_capacity"],
        work_device=cpu,
        bs=int(args["req_pool_indices"].shape[0]),
        expected_token_pool_host=host("req_to_verify_expected_tokens"),
        req_to_verify_expected_tokens_valid_lens_host=host(
            "req_to_verify_expected_tokens_valid_lens"
        ),
        kv_token_id_vs_position_offset=int(args["kv_token_id_vs_position_offset"]),
    )


def launch_canary_plan_kernels(
    *,
    verify_plan_out,
    write_plan_out,
    req_pool_indices,
    prefix_lens,
    extend_seq_lens,
    req_to_token,
    swa_window_size,
    full_to_swa_index_mapping,
    verify_capacity,
    req_to_verify_expected_tokens,
    req_to_verify_expected_tokens_valid_lens,
    kv_token_id_vs_position_offset,
) -> None:
    """SGLang's plan launcher; on CPU tensors the path ``PLAN_PATH_TAKEN`` names."""
    args = dict(locals())  # the keyword arguments, as given
    device = getattr(getattr(verify_plan_out, "verify_slot_indices", None), "device", None)
    if getattr(device, "type", None) == "cuda":
        plan_api.launch_canary_plan_kernels(**args)
        return
    if DISPATCHES_OFF_CUDA and PLAN_PATH == "dispatch":
        plan_api.launch_canary_plan_kernels(**args)  # SGLang sends CPU tensors to its reference
        return
    try:
        with _watched("launch_canary_plan_kernels", **args), _interpreted_language():
            _kernels_path_plan()(**args)
    except CudaJitReached:
        _reference_entries(args)


def launch_scatter_req_token_ids_kernel(*, flat_in, offsets, req_pool_indices, pool_out) -> None:
    """SGLang's scatter launcher, its Triton kernel interpreted for CPU tensors."""
    args = dict(locals())  # the keyword arguments, as given
    device = getattr(pool_out, "device", None)
    if getattr(device, "type", None) == "cuda":
        scatter.launch_scatter_req_token_ids_kernel(**args)
        return
    with _watched("launch_scatter_req_token_ids_kernel", **args), _interpreted_language():
        _interpreted_scatter()(**args)
