"""The detection table (docs/DETECTION.md) is up to date, and says what the hash modes promise.

Its trials are a function of its inputs (``tools.detection_table.inputs``). Where the document's
stamp holds (those inputs unchanged since every trial ran for it), the properties run on the
trials of :data:`QUICK`; otherwise, and with ``CANARY_DETECTION_FULL=1`` (the nightly job), on
every trial.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine_model import KV_BYTES
from engine_model.faults import (
    FAULT_KINDS,
    FAULTS,
    KV_BYTE_FAULTS,
    KV_FAULTS,
    MOVE_FAULTS,
    READ_BYTES,
    UNSEEABLE,
)
from reference import FailReason, RealKvHashMode
from tools import detection_table as dt

REAL_KV = FailReason.VERIFY_REAL_KV_HASH_MISMATCH


#: Trials of pages of 1, 2 and 4 slots, with and without a window and the EAGLE offset.
QUICK = (0, 4, 8, 9)


def indices() -> tuple[int, ...]:
    """The trials the properties run on."""
    if os.environ.get("CANARY_DETECTION_FULL") == "1" or not dt.DOC.exists():
        return tuple(range(dt.TRIALS))
    return QUICK if dt.stamp_holds(dt.DOC.read_text()) else tuple(range(dt.TRIALS))


@pytest.fixture(scope="module")
def results():
    """(kind, mode) -> {trial index: its outcome}."""
    chosen = indices()
    return {
        (kind, mode): {i: dt.trial(kind, mode, i) for i in chosen}
        for kind in FAULT_KINDS
        for mode in RealKvHashMode
    }


def test_the_quick_trials_cover_every_kind_of_engine():
    configs = [dt.trial_config(FAULT_KINDS[0], 0, i) for i in QUICK]
    assert {c.page_size for c in configs} == {1, 2, 4}
    assert {bool(c.swa_window) for c in configs} == {False, True}
    assert {c.offset for c in configs} == {0, 1}


def test_a_changed_input_or_text_breaks_the_stamp(monkeypatch):
    text = "# a table\n"
    document = dt.stamped(text)
    assert dt.stamp_holds(document)
    assert not dt.stamp_holds(document.replace("a table", "a tablE"))
    monkeypatch.setattr(dt, "inputs_digest", lambda: "0" * 64)
    assert not dt.stamp_holds(document)


def test_the_document_is_up_to_date():
    full = os.environ.get("CANARY_DETECTION_FULL") == "1"
    assert dt.main(["--check", "--full"] if full else ["--check"]) == 0


def test_every_class_has_a_place_in_most_histories(results):
    """Most histories have a place for each class (a class only the target model's canary has
    is placed in the histories without the EAGLE offset, half of them)."""
    for key, trials in results.items():
        share = FAULTS[key[0]].place_share / (2 if FAULTS[key[0]].target_model_only else 1)
        assert sum(t is not None for t in trials.values()) >= int(len(trials) * share), key


def test_no_history_misses_a_due_report(results):
    for key, trials in results.items():
        for t in trials.values():
            assert t is None or not t[2], (key, t)


def test_mode_all_reports_every_fault_outside_a_sliding_window(results):
    """...but a fault the draft model's canary cannot see, in a history with the EAGLE offset,
    and one of a class whose prediction may be nothing (``always_due`` False), which is then
    silent with nothing due, and reported in most of its places all the same."""
    for kind in set(FAULT_KINDS) - set(UNSEEABLE):
        placed = reported = 0
        for i, t in results[kind, RealKvHashMode.ALL].items():
            config = dt.trial_config(kind, RealKvHashMode.ALL, i)
            if config.offset and not FAULTS[kind].seen_by_draft_model:
                assert t is None or t[0] is None, (kind, i)  # unseen there, and silent
            elif t is not None and not config.swa_window:
                placed, reported = placed + 1, reported + (t[0] is not None)
                assert t[0] is not None or not FAULTS[kind].always_due, (kind, i)
                assert t[0] is not None or not t[2], (kind, i)  # silent: nothing was due
        assert 2 * reported >= placed, (kind, reported, placed)


def test_a_kv_byte_is_reported_exactly_where_the_mode_reads_it(results):
    for kind in KV_BYTE_FAULTS:
        for mode, read in READ_BYTES.items():
            for i, t in results[kind, mode].items():
                if t is None:
                    continue
                rng = np.random.default_rng(i)
                rng.integers(0, 2**10)
                byte = int(rng.integers(0, KV_BYTES))
                assert (t[0] is not None) == (byte < read), (kind, mode, i, byte, t)
                assert t[1] in (0, REAL_KV), (kind, mode, i, t)  # REAL_KV alone


def test_no_mode_reads_kv_for_the_other_classes(results):
    """Only a class that changes KV bytes, or moves KV without a forward (which may leave a
    record and its KV apart), is ever reported with ``REAL_KV``; or one that hands a page in use
    to another request: two requests then write its slots, and a verify may read one's record
    over the other's KV (under a window, the ``SWA`` verify may also read a record not written
    yet: stale memory)."""
    for kind in set(FAULT_KINDS) - set(KV_FAULTS) - set(MOVE_FAULTS):
        if FAULTS[kind].frees_pages_in_use:
            continue
        for mode in RealKvHashMode:
            for t in results[kind, mode].values():
                assert t is None or not t[1] & REAL_KV, (kind, mode, t)


def test_an_unseeable_class_is_never_reported_and_says_why(results):
    """A class the registry calls unseeable is reported in no history of any mode, and its
    reason is written; every other class is reported in some history of mode ALL."""
    assert UNSEEABLE  # a dropped KV store
    for kind in FAULT_KINDS:
        seen = any(
            t is not None and t[0] is not None for t in results[kind, RealKvHashMode.ALL].values()
        )
        assert seen != (kind in UNSEEABLE), kind
        for mode in RealKvHashMode:
            assert (
                all(t is None or t[0] is None for t in results[kind, mode].values())
                or kind not in UNSEEABLE
            )
        assert (len(FAULTS[kind].unseeable) > 20) == (kind in UNSEEABLE)


#: The classes of faults of the page table and what hands pages out, which SGLang's draft and
#: target models share.
PAGE_TABLE_FAULTS = tuple(k for k in FAULT_KINDS if FAULTS[k].__module__.endswith(".page_table"))


def _unreported_by_the_draft_model(results) -> list:
    """``(kind, mode)`` of each page-table class that the draft model's canary (the histories
    with the EAGLE offset) misses where due, or reports in no history of the mode."""
    missed = []
    for kind in PAGE_TABLE_FAULTS:
        for mode in RealKvHashMode:
            draft = [
                t
                for i, t in results[kind, mode].items()
                if t is not None and dt.trial_config(kind, mode, i).offset
            ]
            if any(t[2] for t in draft) or all(t[0] is None for t in draft):
                missed.append((kind, mode))
    return missed


def test_the_draft_model_s_canary_alone_reports_the_shared_page_table_s_faults(results):
    """SGLang's draft and target models share one page table and allocator; the suite runs the
    draft model's canary over an engine of its own (CONTRACT §15, a named choice). What that
    changes: a fault of the page table, which both canaries read on a server, is promised of
    each canary in its own histories. The draft model's canary alone (the histories with the
    EAGLE offset) reports each such class wherever it is due, in some history of every mode.
    Able to fail: outcomes where the draft model's canary never reports one class."""
    assert len(PAGE_TABLE_FAULTS) == 6, PAGE_TABLE_FAULTS
    for kind in PAGE_TABLE_FAULTS:
        assert FAULTS[kind].seen_by_draft_model and not FAULTS[kind].target_model_only, kind
    assert _unreported_by_the_draft_model(results) == []
    blind = {
        key: {
            i: t if t is None or not dt.trial_config(key[0], key[1], i).offset else (None, *t[1:])
            for i, t in trials.items()
        }
        for key, trials in results.items()
    }
    assert len(_unreported_by_the_draft_model(blind)) == 6 * len(RealKvHashMode)
