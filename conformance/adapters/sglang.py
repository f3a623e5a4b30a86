"""SGLang's own KV canary under the conformance suite: ``--canary-impl conformance.adapters.sglang``.

What runs: the ``kv_canary`` package of the installed ``sglang`` wheel, written against
``sglang==0.5.23`` (``pip install --no-deps sglang==0.5.23``; ``SGLANG_VERSION`` below,
the installed version is in ``__version__``). Which of SGLang's two paths runs is SGLang's
own choice, made per launch by ``kv_canary._dispatch.use_torch_reference``:

- CPU tensors (the ``tox -e sglang`` leg): SGLang's pure-torch references
  ``verify_ref.launch_canary_verify_kernel_torch_reference`` and
  ``write_ref.launch_canary_write_kernel_torch_reference``, reached through SGLang's own
  launchers (which first apply SGLang's source-count check).
- CUDA tensors: SGLang's CUDA JIT kernels. They need the complete ``sglang`` with its
  dependencies (``sglang.kernels.jit``); this module uses that complete package when the
  machine has a CUDA device and ``import sglang.kernels.ops.kv_canary.verify`` succeeds.

Everywhere else (no CUDA device, the serving stack's dependencies absent, or
``CANARY_SGLANG_STANDALONE=1``), SGLang's kv_canary modules are loaded from the installed
files without executing the serving stack: ``sglang/__init__.py`` imports the whole server,
and ``kv_canary/verify.py`` imports the CUDA JIT loader ``sglang.kernels.jit.utils``, which
pulls ``sglang.srt.utils``. So ``sglang``, ``sglang.kernels``, ``sglang.kernels.ops``,
``sglang.kernels.ops.kv_canary`` and ``sglang.kernels.jit`` are registered as bare packages
pointing at the installed directories, and ``sglang.kernels.jit.utils`` as a stand-in whose
JIT entry points raise ``RuntimeError`` (the CUDA path cannot run without the real one).
``PATH_TAKEN`` says which of the two loads happened.

What this module adds, and why it translates conventions only:

- ``RealKvSource``, ``RealKvHashMode``, ``CanaryLaunchTag``, ``VerifyOrWriteContext``,
  ``VerifyPlan``, ``WritePlan`` and both launchers are SGLang's own objects, unchanged.
- ``fingerprint``: SGLang has no public fingerprint function; its hash is computed inside the
  launches. This one runs exactly that computation: the source-count check both SGLang
  launchers apply first, then ``verify_ref.materialize_real_kv_sources`` and
  ``verify_ref._compute_real_kv_hash_scalar`` (the per-slot hash both references store and
  compare), returned as the contract's int64 tensor on the slots' device.
- ``CANARY_CAPABILITIES``: SGLang's launch contract takes 2-D sources only (its CUDA launcher
  refuses a source that is not 2-D after ``.view(torch.uint8)``), so the suite's generated and
  fixed layouts stay 2-D for this module; its N-D tests still run, and their failures are
  listed in ``conformance/expectations/sglang-0.5.23.txt``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types

import torch

#: The SGLang release this adapter and its expectations file were written against.
SGLANG_VERSION = "0.5.23"

#: What the suite may give this implementation: sources of at most 2 dimensions.
CANARY_CAPABILITIES = {"source_ndim_max": 2}

_KV = "sglang.kernels.ops.kv_canary"
_STAND_IN_PACKAGES = {
    "sglang": "",
    "sglang.kernels": "kernels",
    "sglang.kernels.ops": "kernels/ops",
    _KV: "kernels/ops/kv_canary",
    "sglang.kernels.jit": "kernels/jit",
}


def _no_cuda_jit(*args, **kwargs):
    raise RuntimeError(
        "kv-canary adapter: SGLang's CUDA JIT path was taken, but sglang.kernels.jit is a "
        "stand-in here (the full sglang package and its dependencies did not import); "
        "install SGLang with its dependencies on the GPU host to run its CUDA kernels"
    )


def _cache_once(fn):
    return functools.cache(fn)


def _jit_utils_stand_in() -> types.ModuleType:
    utils = types.ModuleType("sglang.kernels.jit.utils")
    utils.__doc__ = "Stand-in for SGLang's CUDA JIT loader: any JIT use raises RuntimeError."
    utils.cache_once = _cache_once
    utils.load_jit = _no_cuda_jit
    utils.make_cpp_args = _no_cuda_jit
    return utils


def _forget_sglang() -> None:
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]


def _load_standalone() -> None:
    spec = importlib.util.find_spec("sglang")  # locates the package without executing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"sglang is not installed; pip install --no-deps sglang=={SGLANG_VERSION}"
        )
    root = list(spec.submodule_search_locations)[0]
    _forget_sglang()
    parents = {}
    for name, sub in _STAND_IN_PACKAGES.items():
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *sub.split("/")) if sub else root]
        package.__package__ = name
        sys.modules[name] = package
        parents[name] = package
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(parents[parent], child, package)
    utils = _jit_utils_stand_in()
    sys.modules[utils.__name__] = utils
    parents["sglang.kernels.jit"].utils = utils


def _load() -> str:
    """Import SGLang's kv_canary modules; returns which load was used."""
    if torch.cuda.is_available() and os.environ.get("CANARY_SGLANG_STANDALONE") != "1":
        try:
            importlib.import_module(f"{_KV}.verify")
            return "complete sglang package (CUDA JIT kernels on CUDA tensors)"
        except ImportError:
            _forget_sglang()
    _load_standalone()
    return "kv_canary modules alone (torch reference path; CUDA JIT stand-in)"


PATH_TAKEN = _load()

consts = importlib.import_module(f"{_KV}.consts")
verify = importlib.import_module(f"{_KV}.verify")
write = importlib.import_module(f"{_KV}.write")
verify_ref = importlib.import_module(f"{_KV}.verify_ref")
write_ref = importlib.import_module(f"{_KV}.write_ref")

try:
    _installed = importlib.metadata.version("sglang")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - found above
    _installed = "unknown"

__version__ = f"sglang {_installed}: {PATH_TAKEN}"

RealKvSource = verify.RealKvSource
RealKvHashMode = consts.RealKvHashMode
CanaryLaunchTag = verify.CanaryLaunchTag
VerifyOrWriteContext = verify.VerifyOrWriteContext
VerifyPlan = verify.VerifyPlan
WritePlan = write.WritePlan
launch_canary_write_kernel = write.launch_canary_write_kernel
launch_canary_verify_kernel = verify.launch_canary_verify_kernel


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
    host_sources = verify_ref.materialize_real_kv_sources(
        real_kv_sources=sources,
        real_kv_hash_mode=mode,  # taken as int(mode) there, as in SGLang's launches
        slot_indices=slots,
        work_device=torch.device("cpu"),
    )
    hashes = [
        verify_ref._to_signed_int64(
            verify_ref._compute_real_kv_hash_scalar(slot_idx=slot, host_sources=host_sources)
        )
        for slot in slots
    ]
    return torch.tensor(hashes, dtype=torch.int64, device=slot_indices.device)
