"""canary.fingerprint against the reference on a hand-picked set of layouts, every mode."""

import numpy as np
import pytest
import torch

import canary
import reference
import strategies as st_kv


def layout(**fields) -> st_kv.SourceLayout:
    """Three rows of two 32-byte tokens (seed 11) but for ``fields``."""
    return st_kv.layout(**{"rows": 3, "page_size": 2, "seed": 11, **fields})


FP8 = "float8_e4m3fn" if hasattr(torch, "float8_e4m3fn") else "uint8"

LAYOUTS = {
    "page_size 1": layout(page_size=1, rows=6),
    "page_size 2": layout(),
    "page_size 16": layout(page_size=16, rows=2),
    "holes": layout(hole_bytes=32, read_bytes=16),
    "per-layer view, gap and offset": layout(gap_bytes=192, offset_bytes=512, tail_bytes=64),
    "bf16 [rows, heads, dim]": layout(dtype="bfloat16", row_shape=(2, 16)),
    "fp16 with a gap": layout(dtype="float16", gap_bytes=32),
    "fp8": layout(dtype=FP8),
    "int32 with offset": layout(dtype="int32", offset_bytes=48),
    "sparse: last byte only": layout(fill="last"),
}


def hashes(layouts, slots, mode):
    made = [st_kv.materialize(item, "cpu") for item in layouts]
    got = canary.fingerprint([m.build(canary) for m in made], torch.tensor(slots), mode=mode)
    want = reference.fingerprint([m.reference_source() for m in made], np.asarray(slots), mode)
    return got.numpy(), want


@pytest.mark.parametrize("mode", list(canary.RealKvHashMode), ids=["NONE", "PARTIAL", "ALL"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_one_source(name, mode):
    """One source of each hand-picked layout hashes exactly like the reference."""
    item = LAYOUTS[name]
    slots = list(range(item.capacity))[::-1] + [0, item.capacity - 1]
    got, want = hashes([item], slots, mode)
    np.testing.assert_array_equal(got, want, strict=True, err_msg=f"{name}: {item!r}")
    if mode and item.fill == "dense":
        assert len(set(got[: item.capacity].tolist())) == item.capacity, "distinct slots collide"


@pytest.mark.parametrize("mode", list(canary.RealKvHashMode), ids=["NONE", "PARTIAL", "ALL"])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 4])
def test_zero_to_four_sources(count, mode):
    """0-4 sources of different layouts combine exactly like the reference."""
    picked = [
        LAYOUTS[n] for n in ("page_size 2", "holes", "bf16 [rows, heads, dim]", "int32 with offset")
    ]
    picked = picked[:count]
    slots = [5, 0, 3, 1, 4, 2]
    got, want = hashes(picked, slots, mode)
    np.testing.assert_array_equal(got, want, strict=True)
    if count == 0 or mode == canary.RealKvHashMode.NONE:
        assert not got.any()
