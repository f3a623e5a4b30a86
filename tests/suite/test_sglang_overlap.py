"""Overlap scheduling as SGLang orders it (``conformance/sglang/overlap.py``): the fence read
from the release's source, the overshoot decode's page table, and the support matrix's overlap
rows ([25])."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from conformance.sglang import histories, loading, manager_run, matrix, overlap
from engine_model import Engine

#: The files :func:`overlap.read_done_before_the_canary` reads.
SOURCES = (
    "srt/kv_canary/api.py",
    "srt/managers/scheduler.py",
    "srt/model_executor/runner/decode_cuda_graph_runner.py",
    "srt/layers/attention/base_attn_backend.py",
)


def _copy(tmp_path):
    for relative in SOURCES:
        target = tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(loading.sglang_root() / relative, target)
    return tmp_path


def test_the_release_s_fence_ends_before_the_canary_reads():
    """On the installed release (0.5.23: in the graph, after the attention metadata)."""
    assert overlap.read_done_before_the_canary() == "in the graph, after the attention metadata"


@pytest.mark.parametrize(
    "relative, old, new",
    [  # a fence of the whole forward; a backend whose decode reads end after the replay;
        # the canary's reads before the model's own
        ("srt/managers/scheduler.py", "self._apply_war_barrier()", "pass"),
        ("srt/layers/attention/base_attn_backend.py", "return SharedReadEnds.IN_REPLAY",
         "return SharedReadEnds.POST_REPLAY"),
        ("srt/kv_canary/api.py", "output = original(", "output = (original)("),
    ],
)  # fmt: skip
def test_a_release_that_fences_the_canary_s_reads_is_read_as_one(tmp_path, relative, old, new):
    """Able to fail: each of the three facts read from the source, changed, gives no early
    fence."""
    root = _copy(tmp_path)
    path = root / relative
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    assert overlap.read_done_before_the_canary(root) == ""
    path.write_text(text)
    assert overlap.read_done_before_the_canary(root)


def _overshoot_and_following():
    """The first overlap finish of history 0 whose next batch takes the finished row: the
    overshoot decode, the following prefill and the row."""
    row = next(r for r in matrix.ROWS if r.option == "overlap scheduling")
    (model,) = row.models
    engine = Engine(matrix._config(row, model, 0))
    made = []
    real = overlap.as_read

    def spy(overshoot, following, freed):
        made.append((overshoot, following, freed))
        return real(overshoot, following, freed)

    overlap.as_read = spy
    try:
        histories.history(0, engine=engine, scheduling=model.scheduling)
    finally:
        overlap.as_read = real
    return made


def test_the_overshoot_reads_the_next_batch_s_entries_in_the_freed_row_alone():
    made = _overshoot_and_following()
    changed = 0
    for overshoot, following, freed in made:
        read = overlap.as_read(overshoot, following, freed)
        before, after = overshoot.plan["req_to_token"], read.plan["req_to_token"]
        differs = np.argwhere(before != after)
        assert set(differs[:, 0].tolist()) <= {freed}
        if freed not in overshoot.plan["req_pool_indices"].tolist():
            assert not len(differs)  # a request at its row's end: known to finish, no overshoot
            continue
        at = int(np.flatnonzero(following.plan["req_pool_indices"] == freed)[0])
        n = int(following.plan["prefix_lens"][at] + following.plan["extend_seq_lens"][at])
        assert (after[freed, :n] == following.plan["req_to_token"][freed, :n]).all()
        assert (after[freed, n:] == before[freed, n:]).all()
        changed += len(differs) > 0
    assert changed, "no overshoot decode read a rewritten row in history 0"


def test_the_overlap_row_reports_only_where_the_next_batch_writes_first(monkeypatch):
    """History 0 of the overlap row through SGLang's runtime is silent where the fence waits
    for the whole forward; where the release's fence lets the next batch's writes land first
    it reports the replayed overshoot decode (its history cell, which
    ``test_the_docs_install_and_history_cells_are_today_s_runs`` runs)."""
    monkeypatch.setattr(overlap, "read_done_before_the_canary", lambda root=None: "")
    row = next(r for r in matrix.ROWS if r.option == "overlap scheduling")
    (model,) = row.models
    engine, reference_run, side = manager_run.sides(matrix._config(row, model, 0))
    histories.history(0, run=lambda step: side.run(reference_run, step), engine=engine,
                      scheduling=model.scheduling)  # fmt: skip
    assert not side.fired, side.fired


def test_an_eager_decode_is_fenced_whole_unless_it_publishes_an_event(tmp_path):
    """On the installed release an eager decode publishes no read-done event (the eager
    runner's only publish is a prefill's); able to fail: a release whose ``_execute_decode``
    published one is read as one whose eager decode is not fenced whole."""
    assert overlap.eager_decode_is_fenced()
    relative = "srt/model_executor/runner/eager_runner.py"
    source = (loading.sglang_root() / relative).read_text()
    at = source.index("    def _execute_decode(")
    body = source.index(":\n", at) + 2
    publish = "        self.model_runner.shared_read_done_event = read_done\n"
    target = tmp_path / relative
    target.parent.mkdir(parents=True)
    target.write_text(source[:body] + publish + source[body:])
    assert not overlap.eager_decode_is_fenced(tmp_path)


@pytest.mark.parametrize("graphs", [True, None], ids=["overlap, decode graphs", "no overlap"])
def test_an_overlap_row_s_fault_trial_settles_through_an_overshoot_decode(monkeypatch, graphs):
    """The overlap rows' fired cells come from fault trials whose settle starts with a request
    finishing in the overlap order (``trials.overlap_lead``): its overshoot decode, replaying a
    graph, read with the next batch's entries in the freed row, as the release's fence lets
    it; able to fail: a trial of a server without overlap makes no such decode."""
    from conformance.sglang import trials

    freed: list[int] = []
    real = overlap.as_read

    def spy(overshoot, following, row):
        freed.append(row)
        return real(overshoot, following, row)

    monkeypatch.setattr(overlap, "as_read", spy)
    (mode, _) = matrix.OVERLAP.settle_modes
    outcome, _, side = trials.fault_trial("page_swap", 0, mode, overlap_graphs=graphs)
    assert outcome == "reported"
    assert len(freed) == (0 if graphs is None else 1)
