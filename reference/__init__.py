"""A pure-numpy oracle of the KV canary, mirroring docs/CONTRACT.md section by section.

It never imports torch, so it can judge any implementation without sharing its stack:
``constants`` (§1), ``hashing`` (§2), ``source`` (§3 layout and §4 fingerprint),
``validation`` (§3 rules and messages), ``chain`` (§5-§7 write and verify),
``corruption`` (§7: the reports a corruption between a write and a verify must cause),
``plan`` (§12: an engine's batch made into plans) and ``scatter`` (§13: the expected-token pool
filled).
"""

from reference.chain import CanaryState, VerifyPlan, WritePlan, verify, write
from reference.constants import (
    CANARY_CHAIN_ANCHOR,
    CANARY_FIELDS_PER_SLOT,
    CANARY_SLOT_BYTES,
    MAX_REAL_KV_SOURCES,
    PARTIAL_READ_BYTES,
    TOKEN_TO_KV_SLOT_PADDING,
    VIOLATION_FIELDS,
    CanaryField,
    CanaryLaunchTag,
    FailReason,
    RealKvHashMode,
    ViolationField,
)
from reference.corruption import corruption_reports
from reference.hashing import splitmix64, splitmix64_mix3, to_signed64, to_unsigned64
from reference.plan import (
    MAX_PLAN_REQS,
    REQ_POOL_IDX_PADDING,
    plan,
    plan_entries,
    translate,
    window_starts,
)
from reference.scatter import MAX_SCATTER_REQS, scatter
from reference.source import Source, fingerprint
from reference.validation import SourceDescription, validate_source

__all__ = [
    "CANARY_CHAIN_ANCHOR",
    "CANARY_FIELDS_PER_SLOT",
    "CANARY_SLOT_BYTES",
    "MAX_REAL_KV_SOURCES",
    "MAX_PLAN_REQS",
    "MAX_SCATTER_REQS",
    "PARTIAL_READ_BYTES",
    "REQ_POOL_IDX_PADDING",
    "TOKEN_TO_KV_SLOT_PADDING",
    "VIOLATION_FIELDS",
    "CanaryField",
    "CanaryLaunchTag",
    "CanaryState",
    "FailReason",
    "RealKvHashMode",
    "Source",
    "SourceDescription",
    "VerifyPlan",
    "ViolationField",
    "WritePlan",
    "corruption_reports",
    "fingerprint",
    "plan",
    "plan_entries",
    "scatter",
    "splitmix64",
    "splitmix64_mix3",
    "to_signed64",
    "to_unsigned64",
    "translate",
    "window_starts",
    "validate_source",
    "verify",
    "write",
]
