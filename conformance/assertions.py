"""Assertion helpers of the suite: exact integer comparisons that say what was called,
what came back, what the reference gives, for which configuration, and how to reproduce it.
"""

from __future__ import annotations

import numpy as np
import pytest

import reference


def hexu(value: int) -> str:
    """An int64 hash as its unsigned 64-bit hex, the way docs/CONTRACT.md writes hashes (and the golden
    files store every int64)."""
    return f"0x{int(value) & 0xFFFFFFFFFFFFFFFF:016x}"


def from_hexu(text: str) -> int:
    """A u64 hex (as :func:`hexu` writes it) back to the signed int64 an implementation returns."""
    return reference.to_signed64(int(text, 16))


def to_numpy(tensor) -> np.ndarray:
    """A device tensor as a host numpy array (one transfer per result, never per element)."""
    return tensor.detach().cpu().numpy()


def fail(message: str, *, config: str = "", repro: str = "") -> None:
    __tracebackhide__ = True
    parts = [message]
    if config:
        parts.append(f"[{config}]")
    if repro:
        parts.append("Reproduce with:\n" + repro)
    pytest.fail("\n".join(parts), pytrace=False)


def assert_int64_equal(
    actual, expected: np.ndarray, *, call: str, config: str = "", repro: str = "", labels=None
) -> None:
    """``actual`` (a tensor) equals the int64 array ``expected`` exactly, dtype and shape included.

    ``labels[i]`` names entry ``i`` in the message (e.g. its slot); hashes print as u64 hex.
    """
    __tracebackhide__ = True
    got = to_numpy(actual)
    if got.dtype != np.int64 or got.shape != expected.shape:
        fail(
            f"{call} returned dtype {got.dtype} shape {got.shape}, "
            f"but the contract is int64 of shape {expected.shape}",
            config=config,
            repro=repro,
        )
    wrong = np.flatnonzero(got != expected)
    if wrong.size:
        i = int(wrong[0])
        name = f"entry {i}" if labels is None else f"entry {i} ({labels[i]})"
        fail(
            f"{call}: {name} = {hexu(got[i])}, but the reference gives {hexu(expected[i])} "
            f"({wrong.size} of {expected.size} entries differ)",
            config=config,
            repro=repro,
        )
    np.testing.assert_array_equal(got, expected, strict=True)


# Readable state differences: each differing field by name, enums by name, hashes as hex.

RECORD_FIELDS = ("token", "position", "prev_hash", "real_kv_hash")
RING_FIELDS = (
    "kernel_kind",
    "slot",
    "position",
    "stored_token",
    "expected_token",
    "stored_chain_hash",
    "expected_aux",
    "fail_reason_bits",
)
_HASH_FIELDS = {"prev_hash", "real_kv_hash", "stored_chain_hash"}
# FailReason bits by their short names: VERIFY_CHAIN_HASH_MISMATCH is CHAIN, WRITE_TOKEN_MISMATCH
# is WRITE_TOKEN, VERIFY_TOKEN_MISMATCH is TOKEN.
FAIL_BIT_NAMES = {
    int(reason): reason.name.removeprefix("VERIFY_").removesuffix("_MISMATCH").removesuffix("_HASH")
    for reason in reference.FailReason
}


def launch_tag_name(value: int) -> str:
    """A kernel kind by its ``CanaryLaunchTag`` name (``HEAD_V_FULL``), or the number."""
    try:
        return reference.CanaryLaunchTag(int(value)).name
    except ValueError:
        return str(int(value))


def fail_bits_name(value: int) -> str:
    """Violation bits by their names, e.g. ``CHAIN|REAL_KV`` for 5 (``0`` for none)."""
    value = int(value)
    names = [name for bit, name in FAIL_BIT_NAMES.items() if value & bit]
    rest = value & ~sum(FAIL_BIT_NAMES)
    if rest:
        names.append(hex(rest))
    return "|".join(names) or "0"


def field_text(name: str, value: int) -> str:
    """One record field or ring column as the contract speaks of it."""
    if name in _HASH_FIELDS:
        return hexu(value)
    if name == "kernel_kind":
        return launch_tag_name(value)
    if name == "fail_reason_bits":
        return fail_bits_name(value)
    if name == "expected_aux" and abs(int(value)) >= 2**32:  # an expected chain hash
        return hexu(value)
    return str(int(value))


def field_differences(names, got, want) -> list[str]:
    """``name got G, want W`` for every field that differs."""
    return [
        f"{name} got {field_text(name, g)}, want {field_text(name, w)}"
        for name, g, w in zip(names, got, want)
        if int(g) != int(w)
    ]


def _wrap(head: str, parts: list[str], width: int = 96) -> list[str]:
    """``head: part, part, ...`` broken into lines of at most ``width`` columns."""
    lines, line = [], f"{head}: "
    for i, part in enumerate(parts):
        piece = part + (", " if i < len(parts) - 1 else "")
        if len(line) + len(piece) > width and line.strip() != f"{head}:":
            lines.append(line.rstrip())
            line = "    " + piece
        else:
            line += piece
    lines.append(line.rstrip())
    return lines


def row_text(row) -> list[str]:
    """A whole ring row with its column names, in lines under 100 columns."""
    return _wrap("row", [f"{n}={field_text(n, v)}" for n, v in zip(RING_FIELDS, row)])


def record_differences(got: np.ndarray, want: np.ndarray, *, limit: int = 8) -> list[str]:
    """Lines naming each differing field of each differing slot of two ``[num_slots, 4]``
    int64 record arrays: ``slot 3: prev_hash got 0x..., want 0x...``."""
    lines = []
    slots = np.flatnonzero((got != want).any(axis=1))
    for slot in slots[:limit]:
        lines += _wrap(f"slot {slot}", field_differences(RECORD_FIELDS, got[slot], want[slot]))
    if slots.size > limit:
        lines.append(f"... and {slots.size - limit} more slots differ")
    return lines


def chosen_row_differences(got_rows, kept_rows, past_rows, *, limit: int = 8) -> list[str]:
    """Lines naming what is wrong with ``got_rows``, the rows a ring kept of violations that ran
    past its capacity: as many as the reference kept (``kept_rows``), each one of the
    violations (``kept_rows`` and ``past_rows``, the rows the reference could not store), none
    twice. Which of them take the last free rows is unspecified (CONTRACT §5)."""
    left = [tuple(int(v) for v in row) for row in (*kept_rows, *past_rows)]
    extra = []
    for row in (tuple(int(v) for v in row) for row in got_rows):
        if row in left:
            left.remove(row)
        else:
            extra.append(row)
    lines: list[str] = []
    if len(got_rows) != len(kept_rows):
        lines.append(f"{len(got_rows)} ring rows stored, want {len(kept_rows)}")
    for row in extra[:limit]:
        lines.append(
            f"ring row extra (none of the {len(kept_rows) + len(past_rows)} violations, of "
            f"which the ring keeps {len(kept_rows)}):"
        )
        lines += ["  " + line for line in row_text(row)]
    return lines


def ring_row_differences(got_rows, want_rows, *, limit: int = 8) -> list[str]:
    """Lines naming what differs between two multisets of ring rows (one launch's rows).

    Rows present in both are set aside; the rest are paired by slot (then in order), and a
    pair prints each differing column: ``ring row 0 (slot 7): expected_token got 0, want -1``.
    Rows left unpaired print whole, as missing or extra.
    """
    got_left = [tuple(int(v) for v in row) for row in got_rows]
    want_left = [tuple(int(v) for v in row) for row in want_rows]
    for row in list(want_left):
        if row in got_left:
            got_left.remove(row)
            want_left.remove(row)
    lines: list[str] = []
    pairs = []
    for w in list(want_left):
        match = next((g for g in got_left if g[1] == w[1]), None)
        if match is not None:
            pairs.append((match, w))
            got_left.remove(match)
            want_left.remove(w)
    while got_left and want_left and len(got_left) == len(want_left):
        pairs.append((got_left.pop(0), want_left.pop(0)))
    for k, (g, w) in enumerate(pairs[:limit]):
        lines += _wrap(f"ring row {k} (slot {w[1]})", field_differences(RING_FIELDS, g, w))
    for w in want_left[:limit]:
        lines.append("ring row missing (the reference stores it):")
        lines += ["  " + line for line in row_text(w)]
    for g in got_left[:limit]:
        lines.append("ring row extra (the reference stores none such):")
        lines += ["  " + line for line in row_text(g)]
    hidden = max(0, len(pairs) - limit) + max(0, len(want_left) - limit)
    hidden += max(0, len(got_left) - limit)
    if hidden:
        lines.append(f"... and {hidden} more ring rows differ")
    return lines
