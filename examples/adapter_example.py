"""A worked adapter: an implementation exposed to the conformance suite under SGLang's names.

The suite imports one module and reads these names from it: ``RealKvSource``,
``RealKvHashMode``, ``CanaryLaunchTag``, ``fingerprint`` (required); the write/verify group
``VerifyOrWriteContext``, ``VerifyPlan``, ``WritePlan``, ``launch_canary_write_kernel``,
``launch_canary_verify_kernel``; and the plan group ``launch_canary_plan_kernels``,
``launch_scatter_req_token_ids_kernel``, ``REQ_POOL_IDX_PADDING`` (CONTRACT §12-§14). Each
group is all or none. Without one, its tests are skipped, the summary names them, and the run
exits 7 (incomplete) unless ``--canary-allow-missing GROUP`` says the engine lacks it on
purpose. An engine whose canary already uses these names passes its own module:

    bash scripts/conformance.sh --canary-impl sglang.kernels.ops.kv_canary

Otherwise, write a module like this one that translates. Here the "engine" is
``canary_torch``, reached through an engine-style facade with other spellings
(``hash_slots`` returning unsigned hashes, plans built by functions), so this file runs:

    bash scripts/conformance.sh --canary-impl examples.adapter_example

``scripts/conformance.sh`` makes the project's environment (``.venv/``, with torch) on its
first run and runs the suite's command in it; installed, the command is
``kv-canary-conformance``, with the same arguments.
"""

from __future__ import annotations

import torch

import canary_torch as _engine

# Types the engine shares with the contract are passed through unchanged.
RealKvSource = _engine.RealKvSource
RealKvHashMode = _engine.RealKvHashMode
CanaryLaunchTag = _engine.CanaryLaunchTag
VerifyOrWriteContext = _engine.VerifyOrWriteContext
VerifyPlan = _engine.VerifyPlan
WritePlan = _engine.WritePlan


def _engine_hash_slots(sources, slots, mode) -> torch.Tensor:
    """Stands in for an engine call with another result type: unsigned (uint64) hashes."""
    signed = _engine.fingerprint(sources, slots, mode=mode)
    return signed.view(torch.uint64) if hasattr(torch, "uint64") else signed


def fingerprint(sources, slot_indices, *, mode=RealKvHashMode.ALL) -> torch.Tensor:
    """The contract's fingerprint: int64 hashes (the u64 bit patterns) on the slots' device.

    The mode goes to the engine as given: an adapter translates spelling only, and converting
    it here (``RealKvHashMode(int(mode))``) would take ``2.0`` or another enum's member, which
    the contract refuses (CONTRACT §11), and refuse ``7`` without the contract's error."""
    hashes = _engine_hash_slots(sources, slot_indices, mode)
    return hashes.view(torch.int64)  # same bits; the contract stores hashes as signed int64


def launch_canary_write_kernel(**kwargs) -> None:
    _engine.launch_canary_write_kernel(**kwargs)


def launch_canary_verify_kernel(**kwargs) -> None:
    _engine.launch_canary_verify_kernel(**kwargs)


# The plan group: an engine's batch and page table become the plans above, and its
# expected-token pool is filled. Same signatures as the contract's, so they pass through; an
# engine with other spellings translates its keywords here as for the launchers above.
REQ_POOL_IDX_PADDING = _engine.REQ_POOL_IDX_PADDING


def launch_canary_plan_kernels(**kwargs) -> None:
    _engine.launch_canary_plan_kernels(**kwargs)


def launch_scatter_req_token_ids_kernel(**kwargs) -> None:
    _engine.launch_scatter_req_token_ids_kernel(**kwargs)
