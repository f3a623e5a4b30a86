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

Every release from 0.5.13 to 0.5.23 has every piece the suite uses. A release in which one
is missing, or whose kv_canary is in neither place, fails to import here with an
``ImportError`` that names what is missing, never an ``AttributeError`` in a test.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from conformance import upstream

#: What the suite may give this implementation: sources of at most 2 dimensions.
CANARY_CAPABILITIES = {"source_ndim_max": 2}

#: What the suite needs of each kv_canary module.
NEEDED = {
    "consts": ("RealKvHashMode", "MAX_REAL_KV_SOURCES"),
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


def _off_cuda(context) -> bool:
    device = getattr(getattr(context, "canary_buf", None), "device", None)
    return getattr(device, "type", None) != "cuda"


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
    args = dict(
        context=context,
        plan=plan,
        input_ids=input_ids,
        positions=positions,
        out_cache_loc=out_cache_loc,
        enable_write_input_assert=enable_write_input_assert,
        expected_input_tokens=expected_input_tokens,
        expected_input_positions=expected_input_positions,
    )
    try:
        write.launch_canary_write_kernel(**args)
    except CudaJitReached:
        if not _off_cuda(context):
            raise
        write_ref.launch_canary_write_kernel_torch_reference(**args)


def launch_canary_verify_kernel(*, context, plan, check_verify_expected_token) -> None:
    """SGLang's verify launcher; its torch reference where the release would need CUDA."""
    args = dict(context=context, plan=plan, check_verify_expected_token=check_verify_expected_token)
    try:
        verify.launch_canary_verify_kernel(**args)
    except CudaJitReached:
        if not _off_cuda(context):
            raise
        verify_ref.launch_canary_verify_kernel_torch_reference(**args)


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
