"""Self-tests of the golden vectors: they regenerate byte for byte, and they cover what they claim."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import strategies as st_kv
from conformance import golden
from conformance.assertions import hexu
from conformance.golden.__main__ import main

SPEC_PINNED = {
    "fp-spec-16-bytes-partial": "0x6041580849e6407d",
    "fp-spec-16-bytes-all": "0x6041580849e6407d",
    "fp-spec-32-bytes-all": "0xb44181dfe9420039",
    "fp-spec-32-bytes-partial": "0xd6d75024dfd6c30c",
    "fp-spec-two-sources-all": "0xb6209a488c3f52b0",
}
MAX_TOTAL_BYTES = 300_000


@pytest.fixture(scope="module")
def rendered() -> dict[str, str]:
    return golden.render()


@pytest.fixture(scope="module")
def fingerprint_vectors() -> list[dict]:
    return golden.load(golden.FINGERPRINT_FILE)


@pytest.fixture(scope="module")
def write_verify_vectors() -> list[dict]:
    return golden.load(golden.WRITE_VERIFY_FILE)


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
    """All golden files together stay under 300 KB."""
    assert sum(len(text.encode()) for text in rendered.values()) < MAX_TOTAL_BYTES


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
    """The explicit-byte vectors hold the SPEC §2 hashes exactly."""
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
    assert {v["mode"] for v in fingerprint_vectors} == {0, 1, 2}
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
        if vector["mode"] == 0 or not vector["sources"]:
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
    assert {w["mode"] for w in worlds} == {0, 1, 2}
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
