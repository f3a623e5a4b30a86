"""Constants and enums of the KV canary (CONTRACT §1), with SGLang's names."""

from __future__ import annotations

from enum import IntEnum, IntFlag

CANARY_CHAIN_ANCHOR = 0xC0FFEE1234567890
# Row 0 of the request pool is the padding row of a batch (CONTRACT §12): it plans nothing.
REQ_POOL_IDX_PADDING = 0
TOKEN_TO_KV_SLOT_PADDING = 0
CANARY_FIELDS_PER_SLOT = 4
CANARY_SLOT_BYTES = 32
VIOLATION_FIELDS = 8
MAX_REAL_KV_SOURCES = 4

# int64 index of each field inside a canary slot
CANARY_FIELD_TOKEN = 0
CANARY_FIELD_POSITION = 1
CANARY_FIELD_PREV_HASH = 2
CANARY_FIELD_REAL_KV_HASH = 3

# columns of a violation ring row
VIOLATION_FIELD_KERNEL_KIND = 0
VIOLATION_FIELD_SLOT_IDX = 1
VIOLATION_FIELD_POSITION = 2
VIOLATION_FIELD_STORED_TOKEN = 3
VIOLATION_FIELD_EXPECTED_TOKEN = 4
VIOLATION_FIELD_STORED_CHAIN_HASH = 5
VIOLATION_FIELD_EXPECTED_AUX = 6
VIOLATION_FIELD_FAIL_REASON_BITS = 7


class RealKvHashMode(IntEnum):
    NONE = 0
    PARTIAL = 1
    ALL = 2


class FailReason(IntFlag):
    VERIFY_CHAIN_HASH_MISMATCH = 1
    VERIFY_POSITION_MISMATCH = 2
    VERIFY_REAL_KV_HASH_MISMATCH = 4
    WRITE_TOKEN_MISMATCH = 8
    WRITE_POSITION_MISMATCH = 16
    VERIFY_TOKEN_MISMATCH = 32


class CanaryLaunchTag(IntEnum):
    HEAD_K_FULL = 0
    HEAD_V_FULL = 1
    TAIL_K_FULL = 2
    TAIL_V_FULL = 3
    SWEEP_K_FULL = 4
    SWEEP_V_FULL = 5
    HEAD_K_SWA = 6
    HEAD_V_SWA = 7
    TAIL_K_SWA = 8
    TAIL_V_SWA = 9
    SWEEP_K_SWA = 10
    SWEEP_V_SWA = 11


# PARTIAL mode reads the first 16 bytes of every slot of every source.
PARTIAL_READ_BYTES = 16
