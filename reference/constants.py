"""Constants and enums of the KV canary (CONTRACT §1)."""

from __future__ import annotations

from enum import IntEnum, IntFlag
from typing import Final

# The anchor is quoted in the contract as an unsigned 64-bit pattern; it is above 2**63, so as a
# stored int64 it reads as negative. Hashing takes every input modulo 2**64, so both
# readings give the same chain.
CANARY_CHAIN_ANCHOR: Final[int] = 0xC0FFEE1234567890

TOKEN_TO_KV_SLOT_PADDING: Final[int] = 0

CANARY_FIELDS_PER_SLOT: Final[int] = 4
CANARY_SLOT_BYTES: Final[int] = 32
VIOLATION_FIELDS: Final[int] = 8
MAX_REAL_KV_SOURCES: Final[int] = 4


class CanaryField(IntEnum):
    """Index of an int64 field inside one canary slot."""

    TOKEN = 0
    POSITION = 1
    PREV_HASH = 2
    REAL_KV_HASH = 3


class ViolationField(IntEnum):
    """Column of a violation ring row."""

    KERNEL_KIND = 0
    SLOT_IDX = 1
    POSITION = 2
    STORED_TOKEN = 3
    EXPECTED_TOKEN = 4
    STORED_CHAIN_HASH = 5
    EXPECTED_AUX = 6
    FAIL_REASON_BITS = 7


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


# PARTIAL mode reads this many bytes of every slot, whatever read_bytes says.
PARTIAL_READ_BYTES: Final[int] = 16
