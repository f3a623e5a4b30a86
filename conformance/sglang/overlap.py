"""Overlap scheduling as SGLang orders it, for the histories of the support matrix's overlap rows.

SGLang's overlap loop (``managers/scheduler.py``: ``event_loop_overlap``) launches batch ``k``
(``run_batch``), fences the schedule stream behind that forward's reads of the buffers the
scheduler shares (``_apply_war_barrier``), then processes batch ``k - 1``'s results and
prepares batch ``k + 1`` on the schedule stream while the forward runs. Two consequences, both
read from the installed release's source (:func:`read_done_before_the_canary`):

- a request that batch ``k - 1`` finished (by a stop token: only a finish by length is known
  when batch ``k`` is prepared, ``_reqs_finishing_inflight``) is still in batch ``k``, one
  decode past its end ("a finished row reappears for one overshoot tick",
  ``batch_result_processor.py``); its pool row and pages are freed while batch ``k`` runs;
- where the fence is an event that a replayed decode graph records before the model's forward
  (from 0.5.14: before the replay; from 0.5.18: in the graph, after the attention backend's
  metadata, ``SharedReadEnds.IN_REPLAY``), the next batch's page-table writes may land before
  the canary's per-forward code, which runs inside the model's forward
  (``kv_canary/api.py``: ``_patch_model_forward``), reads that row. An eager decode publishes
  no event (:func:`eager_decode_is_fenced`): the fence waits for the whole forward.

:func:`finish` makes the first in an engine's history: the overshoot decode, the release, and
the next waiting request admitted into the freed row and prefilled, as a loaded server's next
batch takes it (the model admits a request with its row; SGLang allocates rows at prepare, the
row freed last first). :func:`as_read` gives the overshoot decode the page table its canary
reads when the next batch's writes land first, the order the fence allows, not one it forces.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from conformance.sglang import loading
from engine_model import Engine, Forward

__all__ = ["as_read", "eager_decode_is_fenced", "finish", "read_done_before_the_canary"]

_SCHEDULER = "srt/managers/scheduler.py"
_DECODE_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
_BACKEND = "srt/layers/attention/base_attn_backend.py"
_EAGER_RUNNER = "srt/model_executor/runner/eager_runner.py"


def read_done_before_the_canary(root=None) -> str:
    """Where the installed release's scheduler lets the next batch's writes start during a
    replayed decode graph, read from its source: ``"before the replay"``, ``"in the graph,
    after the attention metadata"``, or ``""`` where nothing lets them start before the
    forward ends (no WAR fence event: the schedule stream waits for the whole forward)."""
    root = loading.sglang_root() if root is None else root
    scheduler = (root / _SCHEDULER).read_text()
    runner_path = root / _DECODE_RUNNER
    api = (root / "srt/kv_canary/api.py").read_text()
    wrapper = api[api.find("def _patch_model_forward") :]
    in_forward = (
        0 <= wrapper.find("pre_ops_maybe_inside_graph(") < wrapper.find("output = original(")
    )
    if not in_forward or "def _apply_war_barrier" not in scheduler or not runner_path.is_file():
        return ""
    loop = scheduler[scheduler.index("def event_loop_overlap") :]
    if "self._apply_war_barrier()" not in loop[: loop.find("\n    def ")]:
        return ""
    runner = runner_path.read_text()
    if "def _record_in_graph_metadata_prep_done" in runner:
        backend = (root / _BACKEND).read_text()
        ends = backend[backend.index("def shared_read_ends") :][:600]
        body = runner[runner.find("def run_once():") :]  # the captured forward
        marks = [body.find(m) for m in ("self._run_in_graph_metadata_prep(",
                                        "self._record_in_graph_metadata_prep_done()")]  # fmt: skip
        prep, model = min((m for m in marks if m >= 0), default=-1), body.find("out = forward(")
        if "return SharedReadEnds.IN_REPLAY" in ends and 0 <= prep < model:
            return "in the graph, after the attention metadata"
        return ""
    replay = runner.find("output = self.backend.replay(")
    event = runner.rfind("war_fastpath_read_done_event = read_done", 0, replay)
    return "before the replay" if 0 <= event < replay else ""


def eager_decode_is_fenced(root=None) -> bool:
    """Whether an eager decode leaves the fence to wait for the whole forward, read from the
    installed release's source: its eager runner (``model_executor/runner/eager_runner.py``,
    from 0.5.14; ``model_runner.py`` before) publishes a read-done event in no method but
    ``_execute_extend`` (a prefill's)."""
    root = loading.sglang_root() if root is None else root
    marks = ("maybe_publish_prefill_shared_read_done(", "read_done_event = read_done")
    for relative in (_EAGER_RUNNER, "srt/model_executor/model_runner.py"):
        path = root / relative
        if not path.is_file():
            continue
        method = ""
        for line in path.read_text().splitlines():
            if line.startswith("    def "):
                method = line.split("(")[0].removeprefix("    def ")
            if any(m in line for m in marks) and method != "_execute_extend":
                return False
    return True


def finish(engine: Engine, pick: int, graph: bool, pad: int, new_tokens: int, chunk: int, keep):
    """A request finishing under overlap: the decode it makes past its end (replaying a graph
    where ``graph``), then its release, then a request of ``new_tokens`` admitted into the
    freed row and prefilled (``chunk``) as the next batch; each step given to ``keep`` as it
    is made, the overshoot decode as its canary reads it (:func:`as_read`, where the installed
    release's fence lets the next batch's writes land first: the next batch is made first on a
    copy of the engine, whose steps are the engine's own)."""
    rows = {r.rid: r.row for r in engine.running.values()}
    overshoot = engine.decode(pad, graph=True) if graph else engine.decode(0)
    early = read_done_before_the_canary() if graph else not eager_decode_is_fenced()
    if overshoot is not None and early:
        ahead = copy.deepcopy(engine)
        rid = _release_and_admit(ahead, pick, new_tokens)
        following = ahead.prefill(chunk) if rid is not None else None
        if following is not None:
            overshoot = as_read(overshoot, following, rows[rid])
    keep(overshoot)
    if _release_and_admit(engine, pick, new_tokens) is not None:
        keep(engine.prefill(chunk))


def _release_and_admit(engine: Engine, pick: int, new_tokens: int) -> int | None:
    """The finish of ``pick`` (its request id; None: nothing finishes), then a new request
    of ``new_tokens`` admitted (into the row freed last: the finished one's)."""
    rid = engine.finish(pick)
    if rid is not None:
        engine.admit(new_tokens, 0)
    return rid


def as_read(overshoot: Forward, following: Forward, row: int) -> Forward:
    """``overshoot`` with its page table as its canary reads it when ``following`` (the next
    batch) has written row ``row`` first: that row's entries up to the new owner's length are
    the following forward's, the rest of the table as the overshoot decode planned it."""
    rows = following.plan["req_pool_indices"]
    at = np.flatnonzero(rows == row)
    live = overshoot.plan["req_pool_indices"]
    if not len(at) or row not in live.tolist():
        return overshoot
    n = int(following.plan["prefix_lens"][at[0]] + following.plan["extend_seq_lens"][at[0]])
    table = overshoot.plan["req_to_token"].copy()
    table[row, :n] = following.plan["req_to_token"][row, :n]
    return dataclasses.replace(overshoot, plan={**overshoot.plan, "req_to_token": table})
