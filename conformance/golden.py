"""Golden vectors: fixed scenarios, their results from the reference, stored as JSON.

    python -m conformance.golden            # say what regenerating would change; write nothing
    python -m conformance.golden --write    # regenerate conformance/golden/*.json
    python -m conformance.golden --check    # exit 1 if regenerating would change any file

Every scenario is listed by hand below as plain ``strategies`` descriptions
(:class:`~strategies.SourceLayout`, :class:`~strategies.CanaryWorld`,
:class:`~strategies.WriteBatch`, :class:`~strategies.VerifyBatch`,
:class:`~strategies.Corruption`); nothing is drawn by Hypothesis. Each is stored with a
stable ``id``, a one-line ``what``, its description as plain dicts and what ``reference``
computes for it, so the JSON alone plus ``strategies``' materialization rebuilds every input;
``conformance/test_golden.py`` then has the implementation under test reproduce every stored
result exactly. Any change to a stored hash is therefore a deliberate format change.

- ``fingerprint.json``: sources (a layout, or a layout whose backing bytes are given
  explicitly as ``backing_hex``, as for the SPEC §2 vectors), whether they share one
  per-layer pool, slots, mode, and the hash of every slot as u64 hex.
- ``write_verify.json``: a world, a list of steps (``write``, ``corrupt``, ``verify``), and
  the final state: the four fields of every canary slot as u64 hex, the whole ring as u64
  hex with the rows each launch stored sorted (their order inside a launch is unspecified),
  the write index after every step, and both run counters.

The vectors pin the byte fills too. Layout bytes come from
``strategies.materialize.layout_bytes`` and a world's initial buffer, ring and counters from
``strategies.materialize_world``, both drawn from numpy's ``default_rng`` for a seed. numpy
keeps that stream stable across releases; should it ever change, the stored inputs change
with it, and regenerating is a deliberate step: check first that the explicit-byte vectors
(which use no random fill) did not move. A layout's dtype only changes how torch views the
bytes, so the files do not depend on the torch version.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

import reference
import strategies as st_kv
from strategies import (
    ELEMENT_SIZES,
    CanaryWorld,
    Corruption,
    SourceLayout,
    VerifyBatch,
    WriteBatch,
    WriteRequest,
)

__all__ = [
    "COMMAND",
    "FILES",
    "FORMAT_VERSION",
    "GOLDEN_DIR",
    "changes",
    "differences",
    "from_hex64",
    "hex64",
    "implementation_write_verify",
    "load",
    "main",
    "materialize_sources",
    "missing_dtypes",
    "reference_fingerprint",
    "reference_write_verify",
    "render",
]

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
FINGERPRINT_FILE = "fingerprint.json"
WRITE_VERIFY_FILE = "write_verify.json"
FILES = (FINGERPRINT_FILE, WRITE_VERIFY_FILE)
FORMAT_VERSION = 1
COMMAND = "python -m conformance.golden"

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_U64_MASK = 2**64 - 1
_MODE_NAMES = ("none", "partial", "all")


def hex64(value: int) -> str:
    """An int64 (or u64) as the u64 hex the files store, e.g. ``0xc0ffee1234567890``."""
    return f"0x{int(value) & _U64_MASK:016x}"


def from_hex64(text: str) -> int:
    """A stored u64 hex back to the signed int64 an implementation returns."""
    return reference.to_signed64(int(text, 16))


# ---------------------------------------------------------------------------------------------
# Descriptions as plain JSON data, and back.


def _plain(value):
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _layout_from(data: dict) -> SourceLayout:
    return SourceLayout(**{**data, "row_shape": tuple(data["row_shape"])})


def _world_from(data: dict) -> CanaryWorld:
    return CanaryWorld(**{**data, "sources": tuple(_layout_from(s) for s in data["sources"])})


def _write_batch_from(data: dict) -> WriteBatch:
    return WriteBatch(
        requests=tuple(
            WriteRequest(
                seed=r["seed"],
                slots=tuple(r["slots"]),
                tokens=tuple(r["tokens"]),
                positions=tuple(r["positions"]),
            )
            for r in data["requests"]
        ),
        num_valid=data["num_valid"],
        padding=tuple(tuple(p) for p in data["padding"]),
        input_assert=data["input_assert"],
        expected_tokens=tuple(data["expected_tokens"]),
        expected_positions=tuple(data["expected_positions"]),
    )


def _verify_batch_from(data: dict) -> VerifyBatch:
    return VerifyBatch(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _steps_from(steps: Sequence[dict]) -> list[tuple[str, object]]:
    """``[{op: description}, ...]`` back to ``(op, WriteBatch | VerifyBatch | Corruption)``."""
    parsers = {
        "write": _write_batch_from,
        "verify": _verify_batch_from,
        "corrupt": lambda data: Corruption(**data),
    }
    parsed = []
    for step in steps:
        ((op, data),) = step.items()
        parsed.append((op, parsers[op](data)))
    return parsed


def missing_dtypes(vector: dict) -> list[str]:
    """The dtypes a vector's sources name that the installed torch lacks."""
    sources = (
        vector["world"]["sources"]
        if "world" in vector
        else [s["layout"] for s in vector["sources"]]
    )
    have = set(st_kv.available_dtypes())
    return sorted({s["dtype"] for s in sources} - have)


# ---------------------------------------------------------------------------------------------
# Materialization, shared by generation and by the conformance test.


def materialize_sources(vector: dict, device) -> tuple[st_kv.MaterializedSource, ...]:
    """A fingerprint vector's sources made real on ``device``, explicit bytes written in."""
    layouts = [_layout_from(s["layout"]) for s in vector["sources"]]
    if vector["shared"] and layouts:
        made = st_kv.materialize_shared(layouts, device)
    else:
        made = tuple(st_kv.materialize(layout, device) for layout in layouts)
    for m, source in zip(made, vector["sources"], strict=True):
        if "backing_hex" in source:
            data = np.frombuffer(bytes.fromhex(source["backing_hex"]), dtype=np.uint8).copy()
            m.backing.copy_(torch.from_numpy(data))
    return made


def reference_fingerprint(vector: dict) -> list[str]:
    """The reference's hash of every slot of a fingerprint vector, as u64 hex."""
    made = materialize_sources(vector, "cpu")
    hashes = reference.fingerprint(
        [m.reference_source() for m in made],
        np.asarray(vector["slots"], dtype=np.int64),
        vector["mode"],
    )
    return [hex64(h) for h in hashes]


def _stored_rows(ring: np.ndarray, index_start: int, index_after: Sequence[int]) -> np.ndarray:
    """The ring rows the launches stored, each launch's rows sorted.

    That is ``ring[min(start, capacity) : min(end, capacity)]``; the order of rows inside one
    launch is unspecified (SPEC §5), so only their multiset is compared.
    """
    capacity = len(ring)
    pieces = [ring[:0]]
    before = index_start
    for after in index_after:
        rows = ring[min(before, capacity) : min(after, capacity)]
        pieces.append(rows[np.lexsort(rows.T[::-1])])
        before = after
    return np.concatenate(pieces)


def _observed(canary_buf, ring, index_start, index_after, slot_runs, kernel_runs) -> dict:
    records = np.ascontiguousarray(canary_buf[:, :32]).view("<i8").reshape(-1, 4)
    rows = _stored_rows(ring, index_start, index_after)
    return {
        "records": [[hex64(v) for v in record] for record in records],
        "ring_rows": [[hex64(v) for v in row] for row in rows],
        "write_index_after_step": [int(i) for i in index_after],
        "write_index": int(index_after[-1]) if index_after else int(index_start),
        "slot_run_counter": int(slot_runs),
        "kernel_run_counter": int(kernel_runs),
    }


def reference_write_verify(scenario: dict) -> dict:
    """The final state the reference reaches on a write/verify scenario (see the module doc)."""
    made = st_kv.materialize_world(_world_from(scenario["world"]), "cpu")
    state = made.reference_state()
    index_start = int(state.violation_write_index[0])
    index_after = []
    for op, step in _steps_from(scenario["steps"]):
        if op == "write":
            reference.write(state, **st_kv.reference_write_launch(step))
        elif op == "verify":
            reference.verify(state, **st_kv.reference_verify_launch(step))
        else:
            # Corruptions act on tensors: give the world the reference's records, damage it,
            # and take the damaged records and KV bytes back.
            made.canary_buf.copy_(torch.from_numpy(state.canary_buf))
            st_kv.apply_corruption(made, step)
            fresh = made.reference_state()
            state.canary_buf = fresh.canary_buf
            state.real_kv_sources = fresh.real_kv_sources
        index_after.append(int(state.violation_write_index[0]))
    return _observed(
        state.canary_buf,
        state.violation_ring,
        index_start,
        index_after,
        state.slot_run_counter[0],
        state.kernel_run_counter[0],
    )


def implementation_write_verify(impl, scenario: dict, device) -> tuple[dict, list[str]]:
    """What ``impl`` leaves on ``device`` after a scenario's steps, in the stored form.

    Also returns what changed that no launch may touch and the files do not store: bytes
    past the 32 record bytes of a slot, and ring rows outside the range the launches stored.
    """
    made = st_kv.materialize_world(_world_from(scenario["world"]), device)
    buf_before = made.canary_buf.cpu().numpy().copy()
    ring_before = made.violation_ring.cpu().numpy().copy()
    index_start = int(made.violation_write_index.item())
    index_after = []
    for op, step in _steps_from(scenario["steps"]):
        if op == "write":
            impl.launch_canary_write_kernel(
                context=made.context(impl), **st_kv.write_launch(impl, step, device)
            )
        elif op == "verify":
            impl.launch_canary_verify_kernel(
                context=made.context(impl), **st_kv.verify_launch(impl, step, device)
            )
        else:
            st_kv.apply_corruption(made, step)
        index_after.append(int(made.violation_write_index.item()))
    buf = made.canary_buf.cpu().numpy()
    ring = made.violation_ring.cpu().numpy()
    stray = []
    tails = np.flatnonzero((buf[:, 32:] != buf_before[:, 32:]).any(axis=1))
    if tails.size:
        stray.append(f"bytes past 32 of canary slots {tails.tolist()} changed")
    capacity = len(ring)
    lo = min(index_start, capacity)
    hi = max(lo, min(index_after[-1] if index_after else index_start, capacity))
    outside = np.r_[0:lo, hi:capacity]
    moved = outside[(ring[outside] != ring_before[outside]).any(axis=1)]
    if moved.size:
        stray.append(
            f"ring rows {moved.tolist()} changed, outside the rows [{lo}, {hi}) the launches "
            "stored (a wrap or a stray store)"
        )
    observed = _observed(
        buf,
        ring,
        index_start,
        index_after,
        made.slot_run_counter.item(),
        made.kernel_run_counter.item(),
    )
    return observed, stray


def differences(got: dict, want: dict, scenario: dict, *, limit: int = 12) -> list[str]:
    """What differs between two final states of ``scenario``, one line per difference, each
    field by name (``slot 3: prev_hash got 0x..., want 0x...``, ``ring row 0 (slot 7):
    expected_token got 0, want -1``), launch tags and violation bits by name, every line
    under 100 columns."""
    from .assertions import RECORD_FIELDS, field_differences, ring_row_differences

    problems = []
    ops = [next(iter(step)) for step in scenario["steps"]]
    for k, (g, w) in enumerate(
        zip(got["write_index_after_step"], want["write_index_after_step"], strict=True)
    ):
        if g != w:
            problems.append(f"write index after step {k} ({ops[k]}) got {g}, want {w}")
    for name in ("slot_run_counter", "kernel_run_counter"):
        if got[name] != want[name]:
            problems.append(f"{name} got {got[name]}, want {want[name]}")
    for slot, (g, w) in enumerate(zip(got["records"], want["records"], strict=True)):
        g_values = [from_hex64(v) for v in g]
        w_values = [from_hex64(v) for v in w]
        for line in field_differences(RECORD_FIELDS, g_values, w_values):
            problems.append(f"slot {slot}: {line}")
    got_rows = [[from_hex64(v) for v in row] for row in got["ring_rows"]]
    want_rows = [[from_hex64(v) for v in row] for row in want["ring_rows"]]
    if len(got_rows) != len(want_rows):
        problems.append(f"{len(got_rows)} ring rows stored, want {len(want_rows)}")
    problems += ring_row_differences(got_rows, want_rows, limit=limit)
    if len(problems) > limit:
        problems = problems[:limit] + [f"... and {len(problems) - limit} more"]
    return problems


# ---------------------------------------------------------------------------------------------
# Fingerprint scenarios.


def _align16(n: int) -> int:
    return -(-n // 16) * 16


def _layout(
    *,
    dtype: str = "uint8",
    rows: int = 4,
    page_size: int = 1,
    num_bytes_per_token: int = 32,
    read_bytes: int | None = None,
    hole_bytes: int = 0,
    gap_bytes: int = 0,
    offset_bytes: int = 0,
    tail_bytes: int = 0,
    row_shape: tuple[int, ...] | None = None,
    fill: str = "dense",
    seed: int = 1,
) -> SourceLayout:
    """A layout from what a scenario cares about; the row is flat unless ``row_shape`` is given."""
    element_size = ELEMENT_SIZES[dtype]
    row_bytes = page_size * num_bytes_per_token + hole_bytes
    if row_shape is None:
        row_shape = (row_bytes // element_size,)
    if math.prod(row_shape) * element_size != row_bytes:
        raise ValueError(f"row_shape {row_shape} of {dtype} is not {row_bytes} bytes")
    return SourceLayout(
        dtype=dtype,
        rows=rows,
        row_shape=row_shape,
        page_size=page_size,
        num_bytes_per_token=num_bytes_per_token,
        read_bytes=num_bytes_per_token if read_bytes is None else read_bytes,
        row_stride_bytes=_align16(row_bytes) + gap_bytes,
        offset_bytes=offset_bytes,
        tail_bytes=tail_bytes,
        fill=fill,
        seed=seed,
    )


def _explicit(data: bytes) -> dict:
    """One row, one slot holding exactly ``data``, all of it read in ALL mode."""
    layout = _layout(rows=1, num_bytes_per_token=len(data))
    return {"layout": _plain(layout), "backing_hex": data.hex()}


def _every_slot(layouts: Sequence[SourceLayout]) -> list[int]:
    """Every slot all sources share, last first, then slot 0 again (order and repeats kept)."""
    capacity = min((layout.capacity for layout in layouts), default=8)
    return list(range(capacity - 1, -1, -1)) + ([0] if capacity else [])


def _fingerprint(vid, what, sources, mode, *, slots=None, shared=False) -> dict:
    entries = [s if isinstance(s, dict) else {"layout": _plain(s)} for s in sources]
    if slots is None:
        slots = _every_slot([_layout_from(e["layout"]) for e in entries])
    return {
        "id": vid,
        "what": what,
        "sources": entries,
        "shared": shared,
        "slots": list(slots),
        "mode": mode,
    }


def fingerprint_scenarios() -> list[dict]:
    """The fingerprint vectors, without their hashes, in file order."""
    vectors = []

    def one(vid, what, sources, mode, **kwargs):
        vectors.append(_fingerprint(vid, what, sources, mode, **kwargs))

    def both(vid, what, sources, **kwargs):
        for mode in (1, 2):
            one(f"{vid}-{_MODE_NAMES[mode]}", what, sources, mode, **kwargs)

    # SPEC §2, byte for byte: these need no random fill, so they never move.
    powers = [_explicit(bytes.fromhex("01020408102040808182848890a0c0ff"))]
    words = [_explicit(bytes(range(32)))]
    low, high = _explicit(bytes(range(16))), _explicit(bytes(range(16, 32)))
    both("fp-spec-16-bytes", "SPEC §2: 01 02 04 .. C0 FF: 6041580849E6407D", powers, slots=[0])
    one("fp-spec-32-bytes-all", "SPEC §2: 00..1F: B44181DFE9420039", words, 2, slots=[0])
    one("fp-spec-32-bytes-partial", "SPEC §2: 00..1F: D6D75024DFD6C30C", words, 1, slots=[0])
    what = "SPEC §2: 00..0F then 10..1F: B6209A488C3F52B0"
    one("fp-spec-two-sources-all", what, [low, high], 2, slots=[0])
    what = "the SPEC §2 sources swapped: order matters"
    one("fp-spec-two-sources-reversed-all", what, [high, low], 2, slots=[0])

    # Every dtype over one geometry: page 2, a 16-byte hole, a row gap, a storage offset.
    for seed, dtype in enumerate(ELEMENT_SIZES, start=100):
        geometry = dict(rows=3, page_size=2, hole_bytes=16, gap_bytes=16, offset_bytes=16)
        both(
            f"fp-dtype-{dtype}",
            f"{dtype} view: page 2, 32 B/token, 16 B hole, 16 B row gap, offset 16, tail 7",
            [_layout(dtype=dtype, tail_bytes=7, seed=seed, **geometry)],
        )
    same = dict(rows=2, page_size=2, hole_bytes=16, seed=77)
    for dtype in ("uint8", "float32"):
        what = f"seed 77's bytes viewed as {dtype}: the dtype changes the view, never the hash"
        one(f"fp-same-bytes-as-{dtype}-all", what, [_layout(dtype=dtype, **same)], 2)

    # Page sizes and read windows.
    layout = _layout(dtype="int8", rows=6, num_bytes_per_token=16, seed=3)
    both("fp-page-1", "page 1: one slot per row, 16 B/token", [layout])
    layout = _layout(dtype="bfloat16", page_size=2, num_bytes_per_token=48, seed=4)
    both("fp-page-2", "page 2, 48 B/token read in full, bf16 rows", [layout])
    layout = _layout(dtype="float16", rows=2, page_size=16, num_bytes_per_token=16, seed=5)
    both("fp-page-16", "page 16: 32 slots on 2 rows, 16 B/token", [layout])
    layout = _layout(rows=3, page_size=5, read_bytes=16, seed=6)
    both("fp-page-5", "page 5 (not a power of two), 32 B/token, read 16", [layout])
    layout = _layout(
        dtype="int32", rows=3, page_size=2, num_bytes_per_token=64, read_bytes=32, seed=7
    )
    both("fp-read-32-of-64", "read 32 of 64 B/token: bytes past read_bytes unread", [layout])
    layout = _layout(rows=2, page_size=2, num_bytes_per_token=128, seed=8)
    both("fp-read-128", "128 B/token read in full (16 words per source)", [layout])

    # Holes, row gaps, storage offsets and N-D rows one at a time.
    layout = _layout(page_size=2, seed=9)
    one("fp-tight-all", "no hole, no gap, no offset: rows back to back", [layout], 2)
    layout = _layout(page_size=2, hole_bytes=48, seed=10)
    one("fp-holes-all", "a 48 B hole at the end of every row", [layout], 2)
    layout = _layout(page_size=2, gap_bytes=48, seed=11)
    one("fp-row-gaps-all", "48 B between rows: rows addressed by stride(0)", [layout], 2)
    layout = _layout(dtype="float32", page_size=2, offset_bytes=64, tail_bytes=9, seed=12)
    one("fp-storage-offset-all", "the view starts 64 B into its buffer", [layout], 2)
    layout = _layout(
        dtype="float16",
        rows=3,
        page_size=2,
        num_bytes_per_token=64,
        gap_bytes=32,
        seed=13,
        row_shape=(4, 16),
    )
    both("fp-nd-heads-head-dim", "fp16 rows shaped (4 heads, 16 dims), a row gap", [layout])
    layout = _layout(
        dtype="bfloat16",
        rows=3,
        page_size=2,
        num_bytes_per_token=48,
        hole_bytes=32,
        seed=14,
        row_shape=(2, 2, 16),
    )
    one("fp-nd-three-dims-all", "bf16 rows shaped (2, 2, 16), a 32 B hole", [layout], 2)
    layout = _layout(dtype="float32", rows=2, page_size=4, row_shape=(1, 32), seed=15)
    one("fp-nd-leading-one-all", "fp32 rows shaped (1, 32), page 4", [layout], 2)

    # Sparse fills: windows of zeros with one marked byte.
    for fill in ("first", "middle", "last"):
        layout = _layout(rows=3, page_size=2, fill=fill, seed=16)
        what = f"each window zero but its {fill} byte (PARTIAL of 'last' reads only zeros: 0)"
        both(f"fp-fill-{fill}", what, [layout])

    # Source counts.
    for mode in (0, 1, 2):
        what = "no sources: every hash is 0 and no slot is range-checked"
        one(f"fp-0-sources-{_MODE_NAMES[mode]}", what, [], mode, slots=[0, 5, 1, 100])
    layout = _layout(rows=2, page_size=2, seed=17)
    one("fp-1-source-none", "mode NONE with a source: every hash is 0", [layout], 0)
    two = [
        _layout(dtype="float16", rows=3, page_size=2, seed=18),
        _layout(dtype="int64", rows=2, page_size=4, num_bytes_per_token=48, read_bytes=32, seed=19),
    ]
    both("fp-2-sources", "K and V of different dtypes and page sizes", two)
    one("fp-2-sources-reversed-all", "fp-2-sources-all with the sources swapped", two[::-1], 2)
    three = [
        _layout(rows=5, num_bytes_per_token=16, seed=20),
        _layout(dtype="bfloat16", rows=3, page_size=2, hole_bytes=16, seed=21),
        _layout(
            dtype="float8_e5m2",
            rows=1,
            page_size=16,
            num_bytes_per_token=16,
            offset_bytes=16,
            seed=22,
        ),
    ]
    one("fp-3-sources-all", "three sources, pages 1, 2 and 16", three, 2)
    four = [
        _layout(dtype="float16", rows=2, page_size=4, seed=23),
        _layout(dtype="int32", page_size=2, num_bytes_per_token=16, gap_bytes=16, seed=24),
        _layout(dtype="float8_e4m3fn", rows=8, num_bytes_per_token=64, read_bytes=48, seed=25),
        _layout(
            dtype="float32", rows=1, page_size=8, num_bytes_per_token=16, tail_bytes=3, seed=26
        ),
    ]
    for mode in (0, 1, 2):
        what = "four sources (the ABI maximum) of four dtypes"
        one(f"fp-4-sources-{_MODE_NAMES[mode]}", what, four, mode)

    # One shared per-layer pool, like a [num_layers, ...] KV buffer.
    kv = _layout(dtype="bfloat16", rows=3, page_size=2, seed=27)
    what = "K and V as equal layouts in one pool: each layer has its own bytes"
    one("fp-shared-kv-pair-all", what, [kv, kv], 2, shared=True)
    layer = _layout(dtype="float16", rows=2, page_size=2, hole_bytes=16, gap_bytes=16, seed=28)
    one("fp-shared-4-layers-partial", "four equal layers of one pool", [layer] * 4, 1, shared=True)
    one("fp-shared-mixed-all", "three different layouts in one pool", three, 2, shared=True)

    # Slot lists.
    page4 = [_layout(rows=3, page_size=4, num_bytes_per_token=16, seed=29)]
    one("fp-slots-empty-all", "no slots: an empty result", page4, 2, slots=[])
    what = "slots out of order, repeated, across page boundaries"
    one("fp-slots-scattered-all", what, page4, 2, slots=[11, 3, 4, 3, 0, 7, 8, 11, 5])
    return vectors


# ---------------------------------------------------------------------------------------------
# Write/verify scenarios.

_KV = _layout(
    dtype="float16",
    rows=3,
    page_size=4,
    num_bytes_per_token=32,
    hole_bytes=16,
    gap_bytes=16,
    offset_bytes=16,
    tail_bytes=3,
    seed=200,
)


def _world(
    *,
    sources: Sequence[SourceLayout] = (_KV,),
    mode: int = 2,
    num_slots: int = 12,
    slot_stride_bytes: int = 32,
    ring_capacity: int = 8,
    ring_start: int = 0,
    kernel_kind: int = 0,
    chain_assert: int = 1,
    seed: int = 1,
) -> CanaryWorld:
    if any(layout.capacity < num_slots for layout in sources):
        raise ValueError("every source must address every canary slot")
    return CanaryWorld(
        sources=tuple(sources),
        mode=mode,
        num_slots=num_slots,
        slot_stride_bytes=slot_stride_bytes,
        ring_capacity=ring_capacity,
        ring_start=ring_start,
        kernel_kind=kernel_kind,
        chain_assert=chain_assert,
        seed=seed,
    )


def _request(seed, slots, *, first_position=0, tokens=None, positions=None) -> WriteRequest:
    """Positions count up from ``first_position`` and tokens follow the slots, unless given."""
    if positions is None:
        positions = [first_position + i for i in range(len(slots))]
    if tokens is None:
        tokens = [1000 + 37 * slot for slot in slots]
    return WriteRequest(seed, tuple(slots), tuple(tokens), tuple(positions))


def _write(*requests, num_valid=None, padding=(), mismatches=None) -> WriteBatch:
    """A write batch; ``mismatches`` ({entry: 'token'|'position'|'both'}) turns the input assert on."""
    batch = WriteBatch(
        tuple(requests),
        len(requests) if num_valid is None else num_valid,
        tuple(padding),
        False,
        (),
        (),
    )
    if mismatches is None:
        return batch
    ids, positions, _ = batch.token_arrays()
    expected_tokens = [
        t ^ 1 if mismatches.get(i) in ("token", "both") else t for i, t in enumerate(ids)
    ]
    expected_positions = [
        p ^ 2 if mismatches.get(i) in ("position", "both") else p for i, p in enumerate(positions)
    ]
    return dataclasses.replace(
        batch,
        input_assert=True,
        expected_tokens=tuple(expected_tokens),
        expected_positions=tuple(expected_positions),
    )


def _verify(entries, *, num_valid=None, enable=1, check_token=True) -> VerifyBatch:
    """A verify batch from ``(slot, expected token, expected position, prev slot)`` entries."""
    columns = [tuple(column) for column in zip(*entries, strict=True)]
    return VerifyBatch(
        *columns,
        num_valid=len(entries) if num_valid is None else num_valid,
        enable=enable,
        check_token=check_token,
    )


def _exact(*batches: WriteBatch, **changes) -> VerifyBatch:
    """The plan that verifies the chains ``batches`` wrote, clean right after the writes."""
    chains = ()
    for batch in batches:
        chains += st_kv.chains_written(batch)
    return _verify(st_kv.plan_for_chains(chains), **changes)


def _window_byte(layout: SourceLayout, slot: int, byte: int) -> int:
    return int(st_kv.slot_window_starts(layout)[slot]) + byte


def _check_steps(world: CanaryWorld, steps) -> None:
    """Keep hand-written launches defined (SPEC §6): no slot written twice, none a seed."""
    for op, step in steps:
        if op != "write":
            continue
        _, _, slots = step.token_arrays()
        written = [s for s in slots if s >= 0]
        seeds = {r.seed for r in step.requests if r.seed >= 0}
        if len(set(written)) != len(written) or seeds & set(written):
            raise ValueError(f"undefined write launch {step!r}")
        if any(s >= world.num_slots for s in written) or any(s >= world.num_slots for s in seeds):
            raise ValueError(f"slot out of range in {step!r}")


def _scenario(vid: str, what: str, world: CanaryWorld, steps) -> dict:
    _check_steps(world, steps)
    return {
        "id": vid,
        "what": what,
        "world": _plain(world),
        "steps": [{op: _plain(step)} for op, step in steps],
    }


def write_verify_scenarios() -> list[dict]:
    """The write/verify scenarios, without their final states, in file order."""
    out = []

    def add(vid, what, world, *steps):
        out.append(_scenario(vid, what, world, list(steps)))

    # Clean runs.
    w = _write(_request(-1, (3, 5, 7, 2), tokens=(11, 2**40 + 1, INT64_MIN, -1)))
    add(
        "wv-anchor-chain-clean",
        "one chain from the anchor, then its exact verify: no report",
        _world(),
        ("write", w),
        ("verify", _exact(w)),
    )
    w1 = _write(_request(-1, (1, 4), first_position=10), _request(-1, (6,)))
    w2 = _write(
        _request(4, (8, 9), first_position=12),
        _request(6, (10,), first_position=1),
        _request(-1, (11,), first_position=5),
    )
    add(
        "wv-seeded-continuation-clean",
        "two chains continued from their tails in a second launch, one new: no report",
        _world(seed=2),
        ("write", w1),
        ("write", w2),
        ("verify", _exact(w1, w2)),
    )

    # Write asserts.
    add(
        "wv-input-assert-mismatches",
        "input assert: one clean entry, then token, position and both mismatching",
        _world(seed=3, kernel_kind=1),
        (
            "write",
            _write(_request(-1, (2, 3, 4, 5)), mismatches={1: "token", 2: "position", 3: "both"}),
        ),
    )
    w1 = _write(_request(-1, (2, 3), first_position=100))
    add(
        "wv-input-and-position-assert",
        "a seeded entry failing its input assert and its chain position assert: two rows",
        _world(seed=4, kernel_kind=2),
        ("write", w1),
        (
            "write",
            _write(_request(3, (5, 6), positions=(103, 104)), mismatches={0: "position"}),
        ),
    )
    w1 = _write(_request(-1, (2, 3), first_position=100))
    jumps = _request(3, (5, -1, 6, 7, 8), positions=(103, 999, 103, 104, 50))
    for vid, chain_assert, what in (
        (
            "wv-position-assert-jumps",
            1,
            "seeded positions jump, repeat and fall back; -1 entries skip",
        ),
        ("wv-position-assert-off", 0, "the same jumps with enable_chain_position_assert 0: no row"),
        (
            "wv-position-assert-enable-7",
            7,
            "the same jumps with enable_chain_position_assert 7: on",
        ),
    ):
        add(
            vid,
            what,
            _world(seed=5, chain_assert=chain_assert),
            ("write", w1),
            ("write", _write(jumps)),
        )
    add(
        "wv-position-assert-anchor-is-off",
        "a request from the anchor never checks positions, whatever they are",
        _world(seed=6),
        ("write", _write(_request(-1, (1, 2, 3), positions=(5, 5, -7)))),
    )
    w1 = _write(_request(-1, (1, 2), positions=(INT64_MAX - 1, INT64_MAX)))
    w2 = _write(
        _request(2, (3, 4), positions=(INT64_MIN, INT64_MIN + 1)),
        _request(2, (5,), positions=(0,)),
    )
    add(
        "wv-position-wrap",
        "the successor of 2**63-1 is -2**63; a fork at 0 expects -2**63; then a clean verify",
        _world(seed=7),
        ("write", w1),
        ("write", w2),
        ("verify", _exact(w1, w2)),
    )

    # The ring.
    w = _write(_request(-1, (1, 2, 3, 4, 5, 6), first_position=20))
    bad = _exact(w)
    bad = dataclasses.replace(bad, expected_positions=tuple(p ^ 1 for p in bad.expected_positions))
    add(
        "wv-ring-overflow",
        "six violations into a 3-row ring at index 1: two stored, the index counts to 7",
        _world(seed=8, ring_capacity=3, ring_start=1),
        ("write", w),
        ("verify", bad),
    )
    add(
        "wv-ring-full",
        "a full ring (index == capacity): nothing stored, the index still counts",
        _world(seed=9, ring_capacity=4, ring_start=4),
        ("write", w),
        ("verify", bad),
    )
    add(
        "wv-ring-past-capacity",
        "an index already past the capacity keeps counting",
        _world(seed=10, ring_capacity=4, ring_start=7),
        ("write", w),
        ("verify", bad),
    )
    add(
        "wv-ring-capacity-0",
        "a ring of no rows: write assert violations are only counted",
        _world(seed=11, ring_capacity=0),
        ("write", _write(_request(-1, (2, 3, 4)), mismatches={0: "both", 2: "token"})),
    )

    # num_valid, enable, padding.
    add(
        "wv-write-num-valid-above-capacity",
        "write_num_valid_reqs 4 of capacity 2 clamps to 2",
        _world(seed=12),
        ("write", _write(_request(-1, (1, 2)), _request(-1, (3,)), num_valid=4)),
    )
    add(
        "wv-write-num-valid-negative",
        "write_num_valid_reqs -1: nothing written or asserted, only the launch counted",
        _world(seed=13),
        (
            "write",
            _write(_request(-1, (1, 2)), _request(-1, (3,)), num_valid=-1, mismatches={0: "token"}),
        ),
    )
    add(
        "wv-write-num-valid-partial-and-padding",
        "1 of 3 requests valid, then padding entries no request covers: never written",
        _world(seed=14),
        (
            "write",
            _write(
                _request(-1, (1, 2)),
                _request(-1, (3, 4)),
                _request(-1, (5,)),
                num_valid=1,
                padding=((6, 77, 0), (7, 78, 0)),
                mismatches={2: "token", 5: "both"},
            ),
        ),
    )
    w1 = _write(
        _request(-1, (1, -1, 2, -1), positions=(0, 50, 1, 60)),
        _request(-1, ()),
        _request(-1, (-1, -1)),
    )
    w2 = _write(_request(2, (-1, 3, 4), positions=(70, 2, 3)))
    add(
        "wv-write-skipped-and-empty-requests",
        "-1 entries neither write nor advance the chain or prev position; empty requests skip",
        _world(seed=15),
        ("write", w1),
        ("write", w2),
        ("verify", _exact(w1, w2)),
    )
    w = _write(_request(-1, (1, 2, 3), first_position=40))
    entries = st_kv.plan_for_chains(st_kv.chains_written(w))
    wrong = [(s, t, p ^ 4, prev) for s, t, p, prev in entries]
    add(
        "wv-verify-num-valid-clamp",
        "verify_num_valid 9 of 3 entries clamps to 3; -2 verifies nothing",
        _world(seed=16),
        ("write", w),
        ("verify", _verify(wrong, num_valid=9)),
        ("verify", _verify(wrong, num_valid=-2)),
    )
    add(
        "wv-verify-disabled",
        "enable 0: only kernel_run_counter moves, even with slots no buffer has",
        _world(seed=17),
        ("write", w),
        (
            "verify",
            _verify([(99, 5, 7, 2**40), (-3, 5, 7, 12), (1, 5, 7, -9)], num_valid=3, enable=0),
        ),
    )
    add(
        "wv-verify-enable-2",
        "enable 2 runs like 1",
        _world(seed=18),
        ("write", w),
        ("verify", _verify(wrong, enable=2)),
    )
    w = _write(_request(-1, (0, 3, 4), first_position=8))
    e = st_kv.plan_for_chains(st_kv.chains_written(w))
    add(
        "wv-slot-0-padding",
        "slot 0 is written like any slot; verify skips it (counted) and prev 0 checks no chain",
        _world(seed=19),
        ("write", w),
        (
            "verify",
            _verify(
                [
                    (0, 123, 999, -1),
                    e[1],
                    (e[2][0], e[2][1], e[2][2] ^ 1, e[2][3]),
                    (0, -1, 0, 0),
                    (0, -1, 0, 0),
                ]
            ),
        ),
    )

    # Verify plans.
    w = _write(_request(-1, (2, 3, 4, 5), first_position=30))
    e = st_kv.plan_for_chains(st_kv.chains_written(w))
    add(
        "wv-verify-prev-slot-variants",
        "prev -1 and -2 expect the anchor, prev 0 is unchecked, after a prev_hash bit flip",
        _world(seed=20),
        ("write", w),
        ("corrupt", Corruption("field", slot=3, field=2, bit=5)),
        ("verify", _verify([(2, *e[0][1:3], -1), e[1], (4, *e[2][1:3], 0), e[3]])),
        ("verify", _verify([(2, *e[0][1:3], -2), (3, *e[1][1:3], 0), e[2], (5, *e[3][1:3], 0)])),
    )
    tokens_plan = [
        (e[0][0], e[0][1] ^ 4, *e[0][2:]),
        (e[1][0], -1, *e[1][2:]),
        (e[2][0], e[2][1] ^ 4, e[2][2] ^ 8, e[2][3]),
        e[3],
    ]
    for vid, check, what in (
        ("wv-verify-token-check-on", True, "wrong expected tokens reported; -1 never checked"),
        ("wv-verify-token-check-off", False, "the same plan with the token check off"),
    ):
        add(
            vid,
            what,
            _world(seed=21, kernel_kind=5),
            ("write", w),
            ("verify", _verify(tokens_plan, check_token=check)),
        )
    w = _write(
        _request(-1, (1, 2, 3), tokens=(INT64_MIN, INT64_MAX, 0), first_position=-3),
        _request(-1, (4, 5), tokens=(-1, 2**62)),
    )
    add(
        "wv-extreme-tokens",
        "tokens at the int64 edges, -1 and 0 round-trip and verify clean",
        _world(seed=22),
        ("write", w),
        ("verify", _exact(w)),
    )

    # Corruptions of two written chains.
    two_chains = _write(
        _request(-1, (1, 2, 3), first_position=7),
        _request(-1, (5, 6, 7, 8), first_position=0),
    )
    corruptions = [
        (
            "wv-corrupt-token-bit-0",
            "bit 0 of slot 2's token",
            Corruption("field", slot=2, field=0, bit=0),
        ),
        (
            "wv-corrupt-position-bit-63",
            "bit 63 of slot 6's position",
            Corruption("field", slot=6, field=1, bit=63),
        ),
        (
            "wv-corrupt-prev-hash-bit-17",
            "bit 17 of slot 7's prev_hash",
            Corruption("field", slot=7, field=2, bit=17),
        ),
        (
            "wv-corrupt-real-kv-hash-bit-40",
            "bit 40 of slot 1's real_kv_hash",
            Corruption("field", slot=1, field=3, bit=40),
        ),
        (
            "wv-corrupt-kv-byte",
            "the last read byte of slot 6's KV window",
            Corruption("kv_inside", slot=6, source=0, offset=_window_byte(_KV, 6, 31), value=0x80),
        ),
        (
            "wv-corrupt-page-swap",
            "rows 0 and 2 of the source swapped",
            Corruption("page_swap", slot=0, other=2),
        ),
        (
            "wv-corrupt-stale-record",
            "slot 3 holds slot 6's record",
            Corruption("stale", slot=3, other=6),
        ),
    ]
    for vid, what, corruption in corruptions:
        add(
            vid,
            f"{what}, then the exact verify of both chains",
            _world(seed=23, ring_capacity=16, kernel_kind=3),
            ("write", two_chains),
            ("corrupt", corruption),
            ("verify", _exact(two_chains)),
        )
    # _KV's buffer: 16 bytes, rows of 128 slot bytes + a 16 B hole every 160 B, 3 tail bytes.
    unread = [5, 16 + 128 + 3, 16 + 144 + 7, 16 + 2 * 160 + 144 + 1]
    add(
        "wv-corrupt-kv-unread-bytes",
        "bytes no slot reads change (before the view, a hole, a row gap, the tail): no report",
        _world(seed=23, ring_capacity=16, kernel_kind=3),
        ("write", two_chains),
        *[("corrupt", Corruption("kv_outside", source=0, offset=o, value=0xFF)) for o in unread],
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-corrupt-kv-byte-partial",
        "PARTIAL: byte 15 of slot 5's window is read and reported",
        _world(seed=24, mode=1, ring_capacity=16),
        ("write", two_chains),
        (
            "corrupt",
            Corruption("kv_inside", slot=5, source=0, offset=_window_byte(_KV, 5, 15), value=1),
        ),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-corrupt-kv-byte-past-16-partial",
        "PARTIAL: byte 16 of slot 5's window is not read: no report",
        _world(seed=24, mode=1, ring_capacity=16),
        ("write", two_chains),
        (
            "corrupt",
            Corruption("kv_outside", slot=5, source=0, offset=_window_byte(_KV, 5, 16), value=1),
        ),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-mode-none-kv-byte",
        "mode NONE stores real_kv_hash 0 and reads no KV byte: a changed byte is not reported",
        _world(seed=25, mode=0, ring_capacity=16),
        ("write", two_chains),
        (
            "corrupt",
            Corruption("kv_outside", slot=5, source=0, offset=_window_byte(_KV, 5, 0), value=1),
        ),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-no-sources",
        "mode ALL without sources stores real_kv_hash 0",
        _world(seed=26, sources=(), ring_capacity=16),
        ("write", two_chains),
        ("corrupt", Corruption("field", slot=8, field=3, bit=2)),
        ("verify", _exact(two_chains)),
    )
    four = (
        _KV,
        _layout(
            dtype="bfloat16", rows=12, page_size=1, num_bytes_per_token=48, read_bytes=32, seed=201
        ),
        _layout(
            dtype="uint8", rows=1, page_size=16, num_bytes_per_token=16, offset_bytes=32, seed=202
        ),
        _layout(
            dtype="int32", rows=6, page_size=2, num_bytes_per_token=32, row_shape=(2, 8), seed=203
        ),
    )
    add(
        "wv-four-sources",
        "four sources; a byte of source 3 in slot 7's window changes",
        _world(seed=27, sources=four, ring_capacity=16),
        ("write", two_chains),
        (
            "corrupt",
            Corruption(
                "kv_inside", slot=7, source=3, offset=_window_byte(four[3], 7, 20), value=0x10
            ),
        ),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-second-source-page-swap",
        "two sources; rows 1 and 5 of source 1 swap",
        _world(seed=28, sources=four[:2], ring_capacity=16),
        ("write", two_chains),
        ("corrupt", Corruption("page_swap", slot=1, other=5, source=1)),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-slot-stride-40-kind-11",
        "40-byte canary slots (bytes past 32 untouched), kernel kind 11 stamped into rows",
        _world(seed=29, slot_stride_bytes=40, kernel_kind=11, ring_capacity=16),
        ("write", two_chains),
        ("corrupt", Corruption("field", slot=5, field=1, bit=1)),
        ("verify", _exact(two_chains)),
    )
    add(
        "wv-slot-stride-64-partial",
        "64-byte canary slots in PARTIAL mode, with a stale record",
        _world(seed=30, slot_stride_bytes=64, mode=1, ring_capacity=16),
        ("write", two_chains),
        ("corrupt", Corruption("stale", slot=6, other=2)),
        ("verify", _exact(two_chains, check_token=False)),
    )
    return out


# ---------------------------------------------------------------------------------------------
# Files.

_ABOUT = (
    "Golden vectors of the KV canary, computed by the reference. Do not edit: regenerate with "
    f"`{COMMAND} --write` (see conformance/README.md)."
)


def _document(kind: str, vectors: list[dict]) -> str:
    ids = [v["id"] for v in vectors]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate {kind} vector ids")
    doc = {"about": _ABOUT, "format": FORMAT_VERSION, "kind": kind, "vectors": vectors}
    return _dumps(doc) + "\n"


def _dumps(value, depth: int = 0) -> str:
    """Deterministic JSON: sorted keys, one line per dict item or list of containers, lists
    of plain values (a record, a ring row, a slot list) kept on one line so diffs stay short."""
    outer, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(key, ensure_ascii=False)}: {_dumps(value[key], depth + 1)}"
            for key in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + outer + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [inner + _dumps(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + outer + "]"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render() -> dict[str, str]:
    """The text of every golden file, as regenerating from the reference gives it now."""
    fingerprints = [
        {**vector, "hashes": reference_fingerprint(vector)} for vector in fingerprint_scenarios()
    ]
    write_verify = [
        {**scenario, "expected": reference_write_verify(scenario)}
        for scenario in write_verify_scenarios()
    ]
    return {
        FINGERPRINT_FILE: _document("fingerprint", fingerprints),
        WRITE_VERIFY_FILE: _document("write_verify", write_verify),
    }


def load(name: str, directory: Path = GOLDEN_DIR) -> list[dict]:
    """The vectors of one stored golden file."""
    return json.loads((directory / name).read_text(encoding="utf-8"))["vectors"]


def _vector_changes(name: str, old_text: str, new_text: str) -> list[str]:
    try:
        old = {v["id"]: v for v in json.loads(old_text)["vectors"]}
    except (ValueError, KeyError, TypeError):
        return [f"{name}: not a golden file now; would be rewritten"]
    new = {v["id"]: v for v in json.loads(new_text)["vectors"]}
    lines = []
    for vid in new:
        if vid not in old:
            lines.append(f"{name}: + {vid} (new)")
        elif old[vid] != new[vid]:
            keys = sorted(
                k for k in new[vid].keys() | old[vid].keys() if old[vid].get(k) != new[vid].get(k)
            )
            lines.append(f"{name}: ~ {vid} ({', '.join(keys)} would change)")
    lines += [f"{name}: - {vid} (removed)" for vid in old if vid not in new]
    return lines or [f"{name}: header or formatting would change"]


def changes(rendered: dict[str, str], directory: Path = GOLDEN_DIR) -> list[str]:
    """One line per difference between ``rendered`` and the files in ``directory``."""
    lines = []
    for name, text in rendered.items():
        path = directory / name
        if not path.exists():
            lines.append(f"{name}: missing; would be created")
            continue
        old = path.read_text(encoding="utf-8")
        if old != text:
            lines += _vector_changes(name, old, text)
    return lines


def main(argv: Sequence[str] | None = None, directory: Path = GOLDEN_DIR) -> int:
    parser = argparse.ArgumentParser(
        prog=COMMAND, description="Regenerate or check the golden vectors from the reference."
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help="write the regenerated files")
    group.add_argument(
        "--check", action="store_true", help="exit 1 if regenerating would change any file"
    )
    args = parser.parse_args(argv)
    rendered = render()
    found = changes(rendered, directory)
    counts = ", ".join(
        f"{name}: {len(json.loads(text)['vectors'])}" for name, text in rendered.items()
    )
    if args.write:
        directory.mkdir(parents=True, exist_ok=True)
        for name, text in rendered.items():
            path = directory / name
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
        print("\n".join(found) if found else "golden vectors already up to date")
        print(f"vectors: {counts}")
        return 0
    if not found:
        print(f"golden vectors up to date ({counts})")
        return 0
    print("\n".join(found))
    if args.check:
        print(f"golden vectors are stale: run `{COMMAND} --write` if the change is deliberate")
        return 1
    print(f"(nothing written; `{COMMAND} --write` writes these changes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
