"""Self-tests of the golden vectors: they regenerate byte for byte, and they cover what they claim."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import shutil

import numpy as np
import pytest
import torch

import canary
import strategies as st_kv
from conformance import golden
from conformance import test_golden_scale as scale_test
from conformance.assertions import hexu
from conformance.golden.__main__ import main
from conformance.golden.scale_scenarios import expand, scale_scenarios
from conformance.write_verify_support import (
    Snapshot,
    implementation_outcome,
    reference_outcome,
)
from reference import CanaryLaunchTag, RealKvHashMode

SPEC_PINNED = {
    "fp-spec-16-bytes-partial": "0x6041580849e6407d",
    "fp-spec-16-bytes-all": "0x6041580849e6407d",
    "fp-spec-32-bytes-all": "0xb44181dfe9420039",
    "fp-spec-32-bytes-partial": "0xd6d75024dfd6c30c",
    "fp-spec-two-sources-all": "0xb6209a488c3f52b0",
}
MAX_TOTAL_BYTES = 300_000
MAX_SCALE_BYTES = 50_000


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return golden.render()


@pytest.fixture(scope="module")
def fingerprint_vectors() -> list[dict]:
    return golden.load(golden.FINGERPRINT_FILE)


@pytest.fixture(scope="module")
def write_verify_vectors() -> list[dict]:
    return golden.load(golden.WRITE_VERIFY_FILE)


@pytest.fixture(scope="module")
def scale_vectors() -> dict[str, dict]:
    return {v["id"]: v for v in golden.load(golden.SCALE_FILE)}


def test_regenerating_changes_nothing(rendered):
    """Regenerating every file from the reference gives the stored files byte for byte."""
    assert golden.changes(rendered) == []
    for name, text in rendered.items():
        assert (golden.GOLDEN_DIR / name).read_text(encoding="utf-8") == text


def test_regeneration_is_deterministic(rendered):
    """Two regenerations in one process are identical: sorted keys, stable formatting, a final newline."""
    again = golden.render()
    assert again == rendered
    for text in rendered.values():
        assert text.endswith("}\n")
        doc = json.loads(text)
        assert golden._dumps(doc) + "\n" == text


def test_check_command_passes_on_the_stored_files(capsys):
    """``--check`` exits 0 on the files as stored and says they are up to date."""
    assert main(["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_check_fails_on_a_stale_file_and_write_restores_it(tmp_path, capsys):
    """A changed hash makes ``--check`` exit 1 naming the vector; the default run writes nothing; ``--write`` restores the file."""
    for name in golden.FILES:
        shutil.copy(golden.GOLDEN_DIR / name, tmp_path / name)
    path = tmp_path / golden.FINGERPRINT_FILE
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["vectors"][0]["hashes"][0] = hexu(12345)
    stale = golden._dumps(doc) + "\n"
    path.write_text(stale, encoding="utf-8")
    capsys.readouterr()

    assert main(["--check"], directory=tmp_path) == 1
    out = capsys.readouterr().out
    assert doc["vectors"][0]["id"] in out and "hashes" in out
    assert main([], directory=tmp_path) == 0
    assert path.read_text(encoding="utf-8") == stale
    assert main(["--write"], directory=tmp_path) == 0
    assert path.read_bytes() == (golden.GOLDEN_DIR / golden.FINGERPRINT_FILE).read_bytes()
    assert main(["--check"], directory=tmp_path) == 0


def test_files_are_small(rendered):
    """All golden files together stay under 300 KB, and scale.json (recipes and digests) under 50 KB."""
    assert sum(len(text.encode()) for text in rendered.values()) < MAX_TOTAL_BYTES
    assert len(rendered[golden.SCALE_FILE].encode()) < MAX_SCALE_BYTES


@pytest.mark.parametrize("name", golden.FILES)
def test_ids_are_stable_names_and_what_is_one_line(name):
    """Every vector has a unique lowercase id and a one-line ``what``."""
    vectors = golden.load(name)
    ids = [v["id"] for v in vectors]
    assert len(set(ids)) == len(ids)
    for vector in vectors:
        assert re.fullmatch(r"[a-z0-9_]+(-[a-z0-9_]+)*", vector["id"]), vector["id"]
        assert vector["what"] and "\n" not in vector["what"], vector["id"]


def test_spec_vectors_are_the_spec_table(fingerprint_vectors):
    """The explicit-byte vectors hold the CONTRACT §2 hashes exactly."""
    by_id = {v["id"]: v for v in fingerprint_vectors}
    for vid, value in SPEC_PINNED.items():
        assert by_id[vid]["hashes"] == [value], vid
        assert all("backing_hex" in s for s in by_id[vid]["sources"])


def test_the_same_bytes_through_two_dtypes_hash_the_same(fingerprint_vectors):
    """A uint8 and a float32 view of one seed's bytes have the same hashes: the dtype is only a view."""
    by_id = {v["id"]: v for v in fingerprint_vectors}
    a, b = by_id["fp-same-bytes-as-uint8-all"], by_id["fp-same-bytes-as-float32-all"]
    assert a["hashes"] == b["hashes"]
    assert len(set(a["hashes"])) > 1


def test_fingerprint_vectors_cover_the_features(fingerprint_vectors):
    """Fingerprint vectors cover all modes, >= 7 dtypes, page sizes 1/2/16, 0..4 sources, shared pools, holes, gaps, offsets, N-D rows, sparse fills and explicit bytes."""
    layouts = [
        st_kv.SourceLayout(**{**s["layout"], "row_shape": tuple(s["layout"]["row_shape"])})
        for v in fingerprint_vectors
        for s in v["sources"]
    ]
    assert {v["mode"] for v in fingerprint_vectors} == set(RealKvHashMode)
    assert len({layout.dtype for layout in layouts}) >= 7
    assert {1, 2, 16} <= {layout.page_size for layout in layouts}
    assert {len(v["sources"]) for v in fingerprint_vectors} == {0, 1, 2, 3, 4}
    assert any(v["shared"] and len(v["sources"]) >= 2 for v in fingerprint_vectors)
    assert any("backing_hex" in s for v in fingerprint_vectors for s in v["sources"])
    assert any(layout.hole_bytes for layout in layouts)
    assert any(layout.gap_bytes for layout in layouts)
    assert any(layout.offset_bytes for layout in layouts)
    assert any(len(layout.row_shape) >= 3 for layout in layouts)
    assert any(layout.read_bytes < layout.num_bytes_per_token for layout in layouts)
    assert set(st_kv.FILLS) <= {layout.fill for layout in layouts}
    assert any(not v["slots"] for v in fingerprint_vectors)
    for vector in fingerprint_vectors:
        assert len(vector["hashes"]) == len(vector["slots"]), vector["id"]
        if vector["mode"] == RealKvHashMode.NONE or not vector["sources"]:
            assert set(vector["hashes"]) <= {hexu(0)}, vector["id"]


def _steps(vectors, op):
    return [step[op] for v in vectors for step in v["steps"] if op in step]


def test_write_verify_vectors_cover_the_features(write_verify_vectors):
    """Write/verify vectors cover every corruption kind, both asserts, the ring edges, clamping, enable 0, padding, prev slots and the token check."""
    vectors = write_verify_vectors
    writes, verifies = _steps(vectors, "write"), _steps(vectors, "verify")
    corruptions = _steps(vectors, "corrupt")
    assert {"field", "kv_inside", "kv_outside", "page_swap", "stale"} <= {
        c["kind"] for c in corruptions
    }
    assert {c["field"] for c in corruptions if c["kind"] == "field"} == {0, 1, 2, 3}
    worlds = [v["world"] for v in vectors]
    assert {w["mode"] for w in worlds} == set(RealKvHashMode)
    assert {len(w["sources"]) for w in worlds} >= {0, 1, 2, 4}
    assert {0, 1, 7} <= {w["chain_assert"] for w in worlds}
    assert {32, 40, 64} <= {w["slot_stride_bytes"] for w in worlds}
    assert any(w["ring_capacity"] == 0 for w in worlds)
    assert any(0 < w["ring_start"] == w["ring_capacity"] for w in worlds)
    assert any(w["ring_start"] > w["ring_capacity"] for w in worlds)

    # input assert on, num_valid below 0 and above the capacity, padding, skipped entries
    assert any(w["input_assert"] for w in writes)
    assert any(w["num_valid"] < 0 for w in writes)
    assert any(w["num_valid"] > len(w["requests"]) for w in writes)
    assert any(w["padding"] for w in writes)
    assert any(-1 in r["slots"] for w in writes for r in w["requests"])
    assert any(not r["slots"] for w in writes for r in w["requests"])
    assert any(0 in r["slots"] for w in writes for r in w["requests"])
    assert any(r["seed"] >= 0 for w in writes for r in w["requests"])
    assert any(2**63 - 1 in r["positions"] for w in writes for r in w["requests"])

    assert {0, 1, 2} <= {v["enable"] for v in verifies}
    assert {True, False} <= {v["check_token"] for v in verifies}
    assert any(v["num_valid"] < 0 for v in verifies)
    assert any(v["num_valid"] > len(v["slots"]) for v in verifies)
    assert any(0 in v["slots"] for v in verifies)
    prevs = {p for v in verifies for p in v["prev_slots"]}
    assert {0, -1, -2} <= prevs
    assert any(-1 in v["expected_tokens"] for v in verifies)

    # every FailReason bit is stored somewhere, and some ring overflows past its capacity
    bits = 0
    for vector in vectors:
        for row in vector["expected"]["ring_rows"]:
            bits |= int(row[7], 16)
    assert bits == 0b111111
    assert any(
        v["expected"]["write_index"] > v["world"]["ring_capacity"] > v["world"]["ring_start"]
        for v in vectors
    )
    for vector in vectors:
        expected = vector["expected"]
        assert len(expected["records"]) == vector["world"]["num_slots"]
        assert len(expected["write_index_after_step"]) == len(vector["steps"])


# ---------------------------------------------------------------------------------------------
# Scale vectors (scale.json): recipes, their expansion, the preset op and the comparison.

SCALE_IDS = [
    "fp-scale-page-128",
    "fp-scale-page-96",
    "fp-scale-pool-past-2-16",
    "wv-scale-prefill-4096",
    "wv-scale-decode-300",
    "wv-scale-sweep-33000",
]


def _expanded_text(recipe: dict) -> str:
    """A digest of everything ``recipe`` expands to (a short failure message)."""
    return hashlib.sha256(repr(expand(recipe)).encode()).hexdigest()


def test_scale_recipes_expand_deterministically(scale_vectors):
    """Every stored recipe is a small dict of ints (and a dtype) and expands to the same
    descriptions twice, whatever numpy's global random state: only ``default_rng(seed)``."""
    assert list(scale_vectors) == SCALE_IDS
    for vid, vector in scale_vectors.items():
        recipe = vector["recipe"]
        assert set(vector) == {"id", "what", "recipe", "expected"}, vid
        assert all(
            isinstance(v, (int, str)) or (isinstance(v, list) and len(v) <= 8)
            for v in recipe.values()
        ), vid
        np.random.seed(1)
        first = _expanded_text(recipe)
        np.random.seed(2)
        np.random.random(1000)
        assert _expanded_text(recipe) == first, vid
    assert [v["recipe"] for v in scale_vectors.values()] == [s["recipe"] for s in scale_scenarios()]


def test_scale_recipes_refuse_unknown_and_missing_keys(scale_vectors):
    """A recipe with a misspelt or a missing key is refused, not expanded with a default."""
    recipe = scale_vectors["wv-scale-prefill-4096"]["recipe"]
    with pytest.raises(ValueError, match=re.escape("unknown keys ['token']")):
        expand({**recipe, "token": 1})
    with pytest.raises(ValueError, match=re.escape("missing keys ['chunk']")):
        expand({k: v for k, v in recipe.items() if k != "chunk"})


def _slots_of(batch) -> list[int]:
    return [s for r in batch.requests for s in r.slots]


def test_scale_fingerprint_recipes_hold_their_edges(scale_vectors):
    """The fingerprint recipes reach what their ids promise: in-page edges of pages 128 and 96,
    a shared pool of two sources, every power-of-two edge of a pool past 2^16, the last slot."""
    page128 = expand(scale_vectors["fp-scale-page-128"]["recipe"])
    (layout,) = page128.layouts
    assert (
        layout.page_size == 128 and 2048 <= layout.capacity and page128.mode == RealKvHashMode.ALL
    )
    assert layout.read_bytes == 16 and layout.num_bytes_per_token <= 32
    in_page = {s % 128 for s in page128.slots}
    assert {0, 1, 63, 64, 65, 127} <= in_page
    assert len({s // 128 for s in page128.slots}) >= 4
    assert layout.capacity - 1 in page128.slots

    page96 = expand(scale_vectors["fp-scale-page-96"]["recipe"])
    assert page96.shared and len(page96.layouts) == 2 and page96.mode == RealKvHashMode.PARTIAL
    assert {layout.page_size for layout in page96.layouts} == {96}
    assert {0, 63, 64, 95} <= {s % 96 for s in page96.slots}
    assert len({s // 96 for s in page96.slots}) >= 4

    pool = expand(scale_vectors["fp-scale-pool-past-2-16"]["recipe"])
    (layout,) = pool.layouts
    capacity = layout.capacity
    assert capacity > 2**16 and layout.page_size == 16 and layout.read_bytes == 16
    for k in range(capacity.bit_length()):
        if 2**k < capacity:
            assert {2**k - 1, 2**k, min(2**k + 1, capacity - 1)} <= set(pool.slots), k
    assert capacity - 1 in pool.slots
    for case in (page128, page96, pool):
        assert {layout.fill for layout in case.layouts} == {"dense"}
    for vid in SCALE_IDS[:3]:
        case = expand(scale_vectors[vid]["recipe"])
        hashes = scale_vectors[vid]["expected"]["hashes"]
        assert len(hashes) == len(case.slots), vid
        assert len(set(hashes)) == len(set(case.slots)), vid  # dense fills: no two alike


def _reported(vector) -> list[int]:
    """The slots of the stored ring rows of a write/verify scale vector, in file order."""
    return [int(row[1], 16) for row in vector["expected"]["ring_rows"]]


def test_scale_write_verify_recipes_report_exactly_their_wrong_entries(scale_vectors):
    """The write/verify recipes have the sizes of their ids, their verify plans are clean but
    for the entries given a wrong expectation, and the stored ring rows are exactly those."""
    world, steps = expand(scale_vectors["wv-scale-prefill-4096"]["recipe"])
    (op1, first), (op2, second), (op3, verify) = steps
    assert (op1, op2, op3) == ("write", "write", "verify") and world.reads_kv
    (request,) = first.requests
    assert len(request.slots) == 4096 and request.seed == -1
    assert request.positions == tuple(range(4096)) and 0 not in request.tokens
    assert [s // 64 for s in request.slots[:64]] != sorted(s // 64 for s in request.slots[:64])
    (chunk,) = second.requests
    assert len(chunk.slots) == 64 and chunk.seed == request.slots[-1]
    assert chunk.positions == tuple(range(4096, 4160))
    assert world.ring_capacity == 64 and verify.capacity == 4160
    plan = st_kv.plan_for_chains(st_kv.chains_written(first) + st_kv.chains_written(second))
    assert verify.slots == tuple(e[0] for e in plan)
    assert verify.prev_slots == tuple(e[3] for e in plan)
    wrong = [k for k, e in enumerate(plan) if verify.expected_positions[k] != e[2]]
    assert 3 <= len(wrong) <= 8 and verify.expected_tokens == tuple(e[1] for e in plan)
    vector = scale_vectors["wv-scale-prefill-4096"]
    assert sorted(_reported(vector)) == sorted(plan[k][0] for k in wrong)

    world, steps = expand(scale_vectors["wv-scale-decode-300"]["recipe"])
    (_, prefill), (_, decode), (_, verify) = steps
    assert len(world.sources) == 2 and verify.capacity == 900
    assert [len(r.slots) for r in prefill.requests] == [2] * 300
    assert [len(r.slots) for r in decode.requests] == [1] * 300
    tails = sorted(r.slots[-1] for r in prefill.requests)
    assert sorted(r.seed for r in decode.requests) == tails
    assert [r.seed for r in decode.requests] != [r.slots[-1] for r in prefill.requests]
    plan = st_kv.plan_for_chains(st_kv.chains_written(prefill) + st_kv.chains_written(decode))
    wrong = [k for k, e in enumerate(plan) if verify.expected_tokens[k] != e[1]]
    assert 2 <= len(wrong) <= 8 and verify.expected_positions == tuple(e[2] for e in plan)
    vector = scale_vectors["wv-scale-decode-300"]
    assert sorted(_reported(vector)) == sorted(plan[k][0] for k in wrong)

    world, steps = expand(scale_vectors["wv-scale-sweep-33000"]["recipe"])
    (op1, preset), (op2, verify) = steps
    assert (op1, op2) == ("preset", "verify") and world.mode == RealKvHashMode.PARTIAL
    assert world.num_slots > 2**16 and world.ring_capacity == 1024
    assert [len(r.slots) for r in preset.requests] == [1000] * 33
    assert max(_slots_of(preset)) > 2**16 and verify.capacity == 33000
    plan = st_kv.plan_for_chains(st_kv.chains_written(preset))
    wrong = [k for k, e in enumerate(plan) if verify.expected_positions[k] != e[2]]
    assert 33 <= len(wrong) <= 40 and {2**15 - 1, 2**15, 32999} <= set(wrong)
    assert len([k for k in wrong if k >= 2**15]) >= 2
    assert all(b - a <= 2000 for a, b in zip([0, *wrong], [*wrong, 33000], strict=True))
    vector = scale_vectors["wv-scale-sweep-33000"]
    assert sorted(_reported(vector)) == sorted(plan[k][0] for k in wrong)
    assert vector["expected"]["write_index_after_step"] == [0, len(wrong)]


def _tiny_world(**changes) -> st_kv.CanaryWorld:
    layout = st_kv.layout(rows=3, page_size=4, num_bytes_per_token=16, seed=5)
    # a CanaryWorld holds plain ints
    mode, kind = int(RealKvHashMode.ALL), int(CanaryLaunchTag.HEAD_K_FULL)
    world = st_kv.CanaryWorld((layout,), mode, 12, 32, 4, 1, kind, 1, 7)
    return dataclasses.replace(world, **changes)


def _tiny_batch() -> st_kv.WriteBatch:
    request = st_kv.WriteRequest(-1, (3, 5, 9), (11, 12, 13), (0, 1, 2))
    return st_kv.WriteBatch((request,), 1, (), False, (), ())


class _NoLaunches:
    """An implementation whose launchers must not be called."""

    def __getattr__(self, name):
        raise AssertionError(f"the preset op used the implementation's {name}")


def test_preset_gives_the_world_only_the_reference_records():
    """A preset step lays down the records the reference's write gives and nothing else: the
    ring, the write index and both counters stay as they were, on the reference's side and on
    the implementation's, which runs no launch for it."""
    world, batch = _tiny_world(), _tiny_batch()
    initial = Snapshot.of_world(st_kv.materialize_world(world, "cpu"))
    written = reference_outcome(world, [("write", batch)]).final
    assert written.slot_run_counter != initial.slot_run_counter  # a write moves them
    for outcome in (
        reference_outcome(world, [("preset", batch)]),
        implementation_outcome(_NoLaunches(), world, [("preset", batch)], "cpu"),
    ):
        final = outcome.final
        assert outcome.index_after == [world.ring_start] and not outcome.stray
        assert np.array_equal(final.ring, initial.ring)
        assert final.slot_run_counter == initial.slot_run_counter
        assert final.kernel_run_counter == initial.kernel_run_counter
        assert np.array_equal(final.canary_buf, written.canary_buf)
        assert not np.array_equal(final.canary_buf, initial.canary_buf)
    steps = golden.steps_of({"steps": [{"preset": golden.plain(batch)}]})
    assert steps == [("preset", batch)]


_TINY_PREFILL = {
    "kind": "write_verify",
    "plan": "prefill",
    "seed": 8,
    "rows": 2,
    "page_size": 8,
    "bytes_per_token": 16,
    "read_bytes": 16,
    "mode": int(RealKvHashMode.ALL),  # a recipe holds plain ints, as its JSON does
    "ring_capacity": 4,
    "kernel_kind": int(CanaryLaunchTag.TAIL_K_FULL),
    "tokens": 8,
    "chunk": 4,
    "wrong_positions": 1,
}


def _tiny_vector() -> dict:
    return {
        "id": "wv-tiny",
        "what": "a small prefill",
        "recipe": _TINY_PREFILL,
        "expected": golden.scale_expected(_TINY_PREFILL),
    }


class _FlipsAToken:
    """``canary``, but its first write launch flips bit 3 of slot ``slot``'s stored token."""

    def __init__(self, slot: int):
        self.slot = slot
        self.flipped = False

    def __getattr__(self, name):
        return getattr(canary, name)

    def launch_canary_write_kernel(self, *, context, **kwargs):
        canary.launch_canary_write_kernel(context=context, **kwargs)
        if not self.flipped:
            context.canary_buf[self.slot, :8].view(torch.int64)[0] ^= 8
            self.flipped = True


def test_scale_comparison_names_the_differing_slot(scale_vectors):
    """A scale vector whose stored result differs fails the comparison: a flipped hash names
    its slot; a flipped records digest says the implementation still equals the reference;
    an implementation that stores one wrong token is named by slot and field."""
    vector = scale_vectors["fp-scale-pool-past-2-16"]
    assert scale_test.scale_problems(canary, "cpu", vector) == []
    slots = expand(vector["recipe"]).slots
    hashes = list(vector["expected"]["hashes"])
    hashes[-2] = hexu(int(hashes[-2], 16) ^ 1)
    flipped = {**vector, "expected": {"hashes": hashes}}
    problems = "\n".join(scale_test.scale_problems(canary, "cpu", flipped))
    assert f"(slot {slots[-2]}): hash got" in problems and "stale" in problems

    tiny = _tiny_vector()
    assert scale_test.scale_problems(canary, "cpu", tiny) == []
    digest = tiny["expected"]["records_sha256"]
    stale = {**tiny, "expected": {**tiny["expected"], "records_sha256": digest[::-1]}}
    problems = "\n".join(scale_test.scale_problems(canary, "cpu", stale))
    assert "records_sha256 got" in problems and "stale" in problems

    world, steps = expand(_TINY_PREFILL)
    slot = steps[0][1].requests[0].slots[2]
    problems = "\n".join(scale_test.scale_problems(_FlipsAToken(slot), "cpu", tiny))
    assert "records_sha256 got" in problems and "differs from the stored vector" not in problems
    assert f"slot {slot}: token got" in problems and "stale" not in problems
