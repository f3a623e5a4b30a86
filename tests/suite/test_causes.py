"""A failing run names its distinct causes before the details: each once (the exception an
implementation raised, or the first field that differs from the reference), with how many
tests it explains and one rerun line; the details keep their paragraph."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from conformance import causes

from .runs import BROKEN_FINGERPRINT, command_word, pasted, suite, verdict

RAISES = "RuntimeError: fingerprint is not wired up yet"


@pytest.mark.parametrize(
    ("error", "text", "cause"),
    [
        (RuntimeError("fingerprint is not wired up yet"), "", RAISES),
        (AssertionError("raised RuntimeError: fingerprint is not wired up yet; CONTRACT §11 "
                        "requires TypeError with a kv-canary message"), "", RAISES),
        (None, "E   AssertionError: raised RuntimeError: fingerprint is not wired up yet, but "
               "CONTRACT §4 gives ValueError", RAISES),
        (None, "fingerprint(mode=NONE) raised RuntimeError: fingerprint is not wired up yet, but "
               "CONTRACT §4 refuses nothing here", RAISES),
        (None, "fingerprint(mode=ALL, 1 sources: one pool past 2^20 slots, page 65; 78 slots): "
               "entry 0 (slot 0) = 0x852d81ae2fd07209, but the reference gives "
               "0xf252579480198a43 (78 of 78 entries differ)",
         "fingerprint returns a hash other than the reference's"),
        (None, "golden vector fp-scale-page-96 differs from the reference's result in "
               "conformance/golden/scale.json\n  (a pool):\n      entry 0 (slot 0): hash got "
               "0xde1a2b315b2c0df2, want 0x30e28d80111f1126",
         "fingerprint returns a hash other than the reference's"),
        (None, "golden vector wv-ring-overflow differs from the reference's result in "
               "conformance/golden/write_verify.json\n  (a world):\n  slot 3: prev_hash got "
               "0x0000000000000001, want 0x0000000000000002, token got 1, want 2",
         "the first differing field: prev_hash of a canary record"),
        (None, "after verify of a corrupted world:\n  ring row 0 (slot 2): expected_token got 0, "
               "want -1\n[world]", "the first differing field: expected_token of a ring row"),
        (None, "plan of a batch differs:\n  verify_prev_slot_indices[3] got 17, want -1",
         "the first differing field: verify_prev_slot_indices"),
        (None, "E   assert 3 == 4", "assert 3 == 4"),
    ],
    ids=["raised", "raised, caught by the suite", "raised, in the message", "refused nothing",
         "a hash", "a stored hash", "a record", "a ring row", "a plan", "anything else"],
)  # fmt: skip
def test_the_cause_of_a_failure(error, text, cause):
    assert causes.cause_of(error, text) == cause


def test_causes_are_grouped_by_their_words_not_their_numbers():
    """One cause whatever slot or count it names; the most frequent first, each once."""
    failures = [
        ("conformance/test_a.py::test_x[1]", "ValueError: slot 17 out of range"),
        ("conformance/test_a.py::test_x[2]", "ValueError: slot 3 out of range"),
        ("conformance/test_b.py::test_y", "the first differing field: token of a canary record"),
        ("conformance/test_a.py::test_z", "ValueError: slot 99 out of range"),
    ]
    grouped = causes.group(failures)
    assert [(g.cause, g.count) for g in grouped] == [
        ("ValueError: slot 17 out of range", 3),
        ("the first differing field: token of a canary record", 1),
    ]
    assert grouped[0].first == "conformance/test_a.py::test_x[1]"
    assert grouped[0].modules == {"test_a.py": 3}
    lines = causes.lines(grouped, lambda test_id: f"rerun {test_id}")
    assert lines[0] == "3 tests: ValueError: slot 17 out of range"
    assert lines.count("    rerun one: rerun conformance/test_a.py::test_x[1]") == 1
    assert sum(line.startswith("    rerun one: ") for line in lines) == 2


@pytest.fixture(scope="module")
def broken_run(tmp_path_factory):
    """Two quick modules on an implementation whose every fingerprint raises."""
    folder: Path = tmp_path_factory.mktemp("one-cause")
    (folder / "broken.py").write_text(BROKEN_FINGERPRINT)
    done = suite("conformance.test_spec_vectors", "conformance.test_golden", "--canary-impl",
                 "./broken.py", "--canary-report", "r.json", cwd=folder)  # fmt: skip
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert verdict(done) == "verdict: FAILED (exit status 1)"
    return folder, done


def test_one_cause_behind_many_failures_is_named_once_before_the_details(broken_run):
    folder, done = broken_run
    out = done.stdout
    failed = int(re.findall(r"^=* ?(\d+) failed", out, re.M)[-1])
    assert failed > 50, out[-2000:]
    heading = re.search(rf"^=+ kv-canary: {failed} failures, 1 cause .*=+$", out, re.M)
    assert heading, out[-6000:]
    assert heading.start() < out.index("= FAILURES =")
    section = out[heading.end() : out.index("= FAILURES =")]
    assert f"\n{failed} tests: {RAISES}\n" in section, section
    [rerun] = re.findall(r"^    rerun one: (.*)$", section, re.M)
    assert command_word(rerun) == sys.executable
    again = pasted(rerun, cwd=folder)
    assert again.returncode == 1 and re.search(r"^=* ?1 failed in ", again.stdout, re.M), (
        again.stdout[-2000:] + again.stderr[-2000:]
    )
    document = json.loads((folder / "r.json").read_text())
    [cause] = document["causes"]
    assert (cause["cause"], cause["tests"], cause["rerun"]) == (RAISES, failed, rerun)


def test_the_details_keep_their_paragraphs(broken_run):
    """Every failure is still announced and detailed: the grouping adds, it leaves nothing out."""
    _, done = broken_run
    failed = int(re.findall(r"^=* ?(\d+) failed", done.stdout, re.M)[-1])
    assert len(re.findall(r"^kv-canary: FAILED ", done.stdout, re.M)) == failed
    assert len(re.findall(r"^_{3,} test_\w+.* _{3,}$", done.stdout, re.M)) == failed
