"""The golden fingerprint scenarios (``fingerprint.json``), listed by hand: no Hypothesis draws.

Each is a dict with a stable ``id``, a one-line ``what``, its sources (a
:class:`~strategies.SourceLayout`, or one whose backing bytes are given explicitly as
``backing_hex``), whether they share one per-layer pool, its slots and its mode;
:mod:`conformance.golden` adds the reference's hashes and stores it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import strategies as st_kv
from conformance.support import mode_name
from strategies import ELEMENT_SIZES, SourceLayout

__all__ = ["fingerprint_scenarios"]


def _explicit(data: bytes) -> dict:
    """One row, one slot holding exactly ``data``, all of it read in ALL mode."""
    layout = st_kv.layout(rows=1, num_bytes_per_token=len(data))
    return {"layout": layout, "backing_hex": data.hex()}


def _every_slot(layouts: Sequence[SourceLayout]) -> list[int]:
    """Every slot all sources share, last first, then slot 0 again (order and repeats kept)."""
    capacity = min((layout.capacity for layout in layouts), default=8)
    return list(range(capacity - 1, -1, -1)) + ([0] if capacity else [])


def _fingerprint(vid, what, sources, mode, *, slots=None, shared=False) -> dict:
    entries = [s if isinstance(s, dict) else {"layout": s} for s in sources]
    if slots is None:
        slots = _every_slot([e["layout"] for e in entries])
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
            one(f"{vid}-{mode_name(mode).lower()}", what, sources, mode, **kwargs)

    # CONTRACT §2, byte for byte: these need no random fill, so they never move.
    powers = [_explicit(bytes.fromhex("01020408102040808182848890a0c0ff"))]
    words = [_explicit(bytes(range(32)))]
    low, high = _explicit(bytes(range(16))), _explicit(bytes(range(16, 32)))
    both("fp-spec-16-bytes", "CONTRACT §2: 01 02 04 .. C0 FF: 6041580849E6407D", powers, slots=[0])
    one("fp-spec-32-bytes-all", "CONTRACT §2: 00..1F: B44181DFE9420039", words, 2, slots=[0])
    one("fp-spec-32-bytes-partial", "CONTRACT §2: 00..1F: D6D75024DFD6C30C", words, 1, slots=[0])
    what = "CONTRACT §2: 00..0F then 10..1F: B6209A488C3F52B0"
    one("fp-spec-two-sources-all", what, [low, high], 2, slots=[0])
    what = "the CONTRACT §2 sources swapped: order matters"
    one("fp-spec-two-sources-reversed-all", what, [high, low], 2, slots=[0])

    # Every dtype over one geometry: page 2, a 16-byte hole, a row gap, a storage offset.
    for seed, dtype in enumerate(ELEMENT_SIZES, start=100):
        geometry = dict(rows=3, page_size=2, hole_bytes=16, gap_bytes=16, offset_bytes=16)
        both(
            f"fp-dtype-{dtype}",
            f"{dtype} view: page 2, 32 B/token, 16 B hole, 16 B row gap, offset 16, tail 7",
            [st_kv.layout(dtype=dtype, tail_bytes=7, seed=seed, **geometry)],
        )
    same = dict(rows=2, page_size=2, hole_bytes=16, seed=77)
    for dtype in ("uint8", "float32"):
        what = f"seed 77's bytes viewed as {dtype}: the dtype changes the view, never the hash"
        one(f"fp-same-bytes-as-{dtype}-all", what, [st_kv.layout(dtype=dtype, **same)], 2)

    # Page sizes and read windows.
    layout = st_kv.layout(dtype="int8", rows=6, num_bytes_per_token=16, seed=3)
    both("fp-page-1", "page 1: one slot per row, 16 B/token", [layout])
    layout = st_kv.layout(dtype="bfloat16", page_size=2, num_bytes_per_token=48, seed=4)
    both("fp-page-2", "page 2, 48 B/token read in full, bf16 rows", [layout])
    layout = st_kv.layout(dtype="float16", rows=2, page_size=16, num_bytes_per_token=16, seed=5)
    both("fp-page-16", "page 16: 32 slots on 2 rows, 16 B/token", [layout])
    layout = st_kv.layout(rows=3, page_size=5, read_bytes=16, seed=6)
    both("fp-page-5", "page 5 (not a power of two), 32 B/token, read 16", [layout])
    layout = st_kv.layout(
        dtype="int32", rows=3, page_size=2, num_bytes_per_token=64, read_bytes=32, seed=7
    )
    both("fp-read-32-of-64", "read 32 of 64 B/token: bytes past read_bytes unread", [layout])
    layout = st_kv.layout(rows=2, page_size=2, num_bytes_per_token=128, seed=8)
    both("fp-read-128", "128 B/token read in full (16 words per source)", [layout])

    # Holes, row gaps, storage offsets and N-D rows one at a time.
    layout = st_kv.layout(page_size=2, seed=9)
    one("fp-tight-all", "no hole, no gap, no offset: rows back to back", [layout], 2)
    layout = st_kv.layout(page_size=2, hole_bytes=48, seed=10)
    one("fp-holes-all", "a 48 B hole at the end of every row", [layout], 2)
    layout = st_kv.layout(page_size=2, gap_bytes=48, seed=11)
    one("fp-row-gaps-all", "48 B between rows: rows addressed by stride(0)", [layout], 2)
    layout = st_kv.layout(dtype="float32", page_size=2, offset_bytes=64, tail_bytes=9, seed=12)
    one("fp-storage-offset-all", "the view starts 64 B into its buffer", [layout], 2)
    nd_layout = functools.partial(st_kv.layout, rows=3, page_size=2)  # N-D rows, 2 pages
    layout = nd_layout(
        dtype="float16", num_bytes_per_token=64, gap_bytes=32, seed=13, row_shape=(4, 16)
    )
    both("fp-nd-heads-head-dim", "fp16 rows shaped (4 heads, 16 dims), a row gap", [layout])
    layout = nd_layout(
        dtype="bfloat16", num_bytes_per_token=48, hole_bytes=32, seed=14, row_shape=(2, 2, 16)
    )
    one("fp-nd-three-dims-all", "bf16 rows shaped (2, 2, 16), a 32 B hole", [layout], 2)
    layout = st_kv.layout(dtype="float32", rows=2, page_size=4, row_shape=(1, 32), seed=15)
    one("fp-nd-leading-one-all", "fp32 rows shaped (1, 32), page 4", [layout], 2)

    # Sparse fills: windows of zeros with one marked byte.
    for fill in ("first", "middle", "last"):
        layout = st_kv.layout(rows=3, page_size=2, fill=fill, seed=16)
        what = f"each window zero but its {fill} byte (PARTIAL of 'last' reads only zeros: 0)"
        both(f"fp-fill-{fill}", what, [layout])

    # Source counts.
    for mode in (0, 1, 2):
        what = "no sources: every hash is 0 and no slot is range-checked"
        one(f"fp-0-sources-{mode_name(mode).lower()}", what, [], mode, slots=[0, 5, 1, 100])
    layout = st_kv.layout(rows=2, page_size=2, seed=17)
    one("fp-1-source-none", "mode NONE with a source: every hash is 0", [layout], 0)
    two = [
        st_kv.layout(dtype="float16", rows=3, page_size=2, seed=18),
        st_kv.layout(
            dtype="int64", rows=2, page_size=4, num_bytes_per_token=48, read_bytes=32, seed=19
        ),
    ]
    both("fp-2-sources", "K and V of different dtypes and page sizes", two)
    one("fp-2-sources-reversed-all", "fp-2-sources-all with the sources swapped", two[::-1], 2)
    three = [
        st_kv.layout(rows=5, num_bytes_per_token=16, seed=20),
        st_kv.layout(dtype="bfloat16", rows=3, page_size=2, hole_bytes=16, seed=21),
        st_kv.layout(
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
        st_kv.layout(dtype="float16", rows=2, page_size=4, seed=23),
        st_kv.layout(dtype="int32", page_size=2, num_bytes_per_token=16, gap_bytes=16, seed=24),
        st_kv.layout(dtype="float8_e4m3fn", rows=8, num_bytes_per_token=64, read_bytes=48, seed=25),
        st_kv.layout(
            dtype="float32", rows=1, page_size=8, num_bytes_per_token=16, tail_bytes=3, seed=26
        ),
    ]
    for mode in (0, 1, 2):
        what = "four sources (the ABI maximum) of four dtypes"
        one(f"fp-4-sources-{mode_name(mode).lower()}", what, four, mode)

    # One shared per-layer pool, like a [num_layers, ...] KV buffer.
    kv = st_kv.layout(dtype="bfloat16", rows=3, page_size=2, seed=27)
    what = "K and V as equal layouts in one pool: each layer has its own bytes"
    one("fp-shared-kv-pair-all", what, [kv, kv], 2, shared=True)
    layer = st_kv.layout(dtype="float16", rows=2, page_size=2, hole_bytes=16, gap_bytes=16, seed=28)
    one("fp-shared-4-layers-partial", "four equal layers of one pool", [layer] * 4, 1, shared=True)
    one("fp-shared-mixed-all", "three different layouts in one pool", three, 2, shared=True)

    # Slot lists.
    page4 = [st_kv.layout(rows=3, page_size=4, num_bytes_per_token=16, seed=29)]
    one("fp-slots-empty-all", "no slots: an empty result", page4, 2, slots=[])
    what = "slots out of order, repeated, across page boundaries"
    one("fp-slots-scattered-all", what, page4, 2, slots=[11, 3, 4, 3, 0, 7, 8, 11, 5])
    what = "300 slots: three programs of 128, the last one masked"
    one("fp-slots-three-programs-all", what, page4, 2, slots=[(7 * i + 5) % 12 for i in range(300)])
    return vectors
