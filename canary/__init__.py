"""The KV canary: per-slot records of the KV cache, written and verified by Triton kernels.

API names, constants' included, follow SGLang's ``kv_canary`` so that engines can use this
package unchanged (``tests/canary/test_sglang_names.py`` compares them with SGLang's).
CUDA/ROCm tensors run compiled Triton; CPU tensors run the same kernels in Triton's
interpreter (see ``canary._runtime``).
"""

from .buffers import VerifyOrWriteContext, VerifyPlan, WritePlan
from .constants import (
    CANARY_CHAIN_ANCHOR,
    CANARY_FIELD_POSITION,
    CANARY_FIELD_PREV_HASH,
    CANARY_FIELD_REAL_KV_HASH,
    CANARY_FIELD_TOKEN,
    CANARY_FIELDS_PER_SLOT,
    CANARY_SLOT_BYTES,
    MAX_REAL_KV_SOURCES,
    REQ_POOL_IDX_PADDING,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELD_EXPECTED_AUX,
    VIOLATION_FIELD_EXPECTED_TOKEN,
    VIOLATION_FIELD_FAIL_REASON_BITS,
    VIOLATION_FIELD_KERNEL_KIND,
    VIOLATION_FIELD_POSITION,
    VIOLATION_FIELD_SLOT_IDX,
    VIOLATION_FIELD_STORED_CHAIN_HASH,
    VIOLATION_FIELD_STORED_TOKEN,
    VIOLATION_FIELDS,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
)
from .launch import launch_canary_verify_kernel, launch_canary_write_kernel
from .plan import launch_canary_plan_kernels
from .real_kv_hash import fingerprint
from .scatter import launch_scatter_req_token_ids_kernel
from .source import RealKvSource

__version__ = "0.1.0"

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CANARY_FIELD_TOKEN",
    "CANARY_FIELD_POSITION",
    "CANARY_FIELD_PREV_HASH",
    "CANARY_FIELD_REAL_KV_HASH",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "MAX_REAL_KV_SOURCES",
    "REQ_POOL_IDX_PADDING",
    "TOKEN_TO_KV_SLOT_PADDING",
    "VIOLATION_FIELD_KERNEL_KIND",
    "VIOLATION_FIELD_SLOT_IDX",
    "VIOLATION_FIELD_POSITION",
    "VIOLATION_FIELD_STORED_TOKEN",
    "VIOLATION_FIELD_EXPECTED_TOKEN",
    "VIOLATION_FIELD_STORED_CHAIN_HASH",
    "VIOLATION_FIELD_EXPECTED_AUX",
    "VIOLATION_FIELD_FAIL_REASON_BITS",
    "VIOLATION_FIELDS",
    "CanaryLaunchTag",
    "FailReason",
    "RealKvHashMode",
    "RealKvSource",
    "fingerprint",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_canary_plan_kernels",
    "launch_scatter_req_token_ids_kernel",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "WritePlan",
]
