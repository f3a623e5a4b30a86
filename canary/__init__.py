"""The KV canary: per-slot records of the KV cache, written and verified by Triton kernels.

API names follow SGLang's ``kv_canary`` so that engines can use this package unchanged.
CUDA/ROCm tensors run compiled Triton; CPU tensors run the same kernels in Triton's
interpreter (see ``canary._runtime``).
"""

from .constants import (
    CANARY_CHAIN_ANCHOR,
    CANARY_FIELDS_PER_SLOT,
    CANARY_SLOT_BYTES,
    MAX_REAL_KV_SOURCES,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELDS,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
)
from .launch import launch_canary_verify_kernel, launch_canary_write_kernel
from .plans import VerifyOrWriteContext, VerifyPlan, WritePlan
from .real_kv_hash import fingerprint
from .source import RealKvSource

__version__ = "0.1.0"

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "MAX_REAL_KV_SOURCES",
    "TOKEN_TO_KV_SLOT_PADDING",
    "VIOLATION_FIELDS",
    "CanaryLaunchTag",
    "FailReason",
    "RealKvHashMode",
    "RealKvSource",
    "fingerprint",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "WritePlan",
]
