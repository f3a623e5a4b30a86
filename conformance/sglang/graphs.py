"""SGLang's per-forward canary under a replayed CUDA graph, on the CPU: what the decode graph
runner captures and what each replay of it runs (:mod:`conformance.graph_capture` gives the
graph semantics).

SGLang's decode graph runner (``model_executor/runner/decode_cuda_graph_runner.py``) captures
one graph per batch size at startup: ``capture_prepare`` builds a ``ForwardBatch`` over the
static buffers of its registry (``model_executor/cuda_graph_buffer_registry.py``), filled as
``_capture`` fills them (``seq_lens`` with the backend's ``seq_len_fill_value``, the index
buffers zeroed: every row is padding); its backend runs the forward twice, eagerly, as warm-up
(``runner_backend/full_cuda_graph_backend.py``: ``capture_one``), then captures a third run,
which executes nothing. The patched ``model.forward`` (``kv_canary/api.py``) runs the
manager's ``pre_ops_maybe_inside_graph`` and ``post_ops_maybe_inside_graph`` inside it, with
the chain's position assert off (``CanaryManager.__init__``) and the phase checker's asserts
off; ``mark_init_finished`` turns both on after the last capture. A DECODE or IDLE forward
(``ForwardMode.is_cuda_graph``: an IDLE one replays the graph of its padded size in the
runner's capture mode, every row padding) is then a replay: ``load_batch`` copies the live batch into the static buffers,
padded by each slot's policy (``fill_from``), and the graph runs the kernels it recorded over
them; ``pre_ops_outside_graph`` and ``post_ops_outside_graph`` run around it, eagerly, on the
live batch (``ModelRunner.forward``'s ``with_ops_outside_graph``).

Under speculative decoding (EAGLE) the same runner captures ``TARGET_VERIFY`` instead
(``self.capture_forward_mode``): ``captured_req_width`` tokens a row, the draft count, so
``bs * draft_token_num`` tokens in the token-axis buffers, and the capture batch's ``spec_info``
is what ``get_spec_info`` builds, an ``EagleVerifyInput`` whose ``draft_token_num`` is the
runner's ``speculative_num_draft_tokens``. A target verify up to the largest captured size is a
replay of it, its padding rows at the tail, ``draft_token_num`` tokens each.

EAGLE's draft model has two runners of its own (:data:`DRAFT_DECODE_RUNNER`,
:data:`DRAFT_EXTEND_RUNNER`). The draft decode runner (``speculative/
eagle_draft_cuda_graph_runner.py``) captures the whole multi-step draft as one graph: its
capture batch is a ``DECODE`` ``ForwardBatch`` whose ``input_ids`` and ``out_cache_loc``
EAGLE's ``draft_forward`` sets before each step's forward, and each step's forward runs inside
the draft model's canary bracket of that step (``with_active_single_forward_manager``, read,
not run). The leg captures one step's bracket per manager and replays it for every step: each
step's part of SGLang's graph records the same operations over a batch of the same fields. The
draft extend runner (``eagle_draft_extend_cuda_graph_runner.py``) captures ``DRAFT_EXTEND_V2``
with rows of ``captured_req_width`` tokens, its ``spec_info`` an ``EagleDraftExtendInput``
whose ``num_tokens_per_req`` is that width, inside the draft model's bracket too. An idle step
replays the graph its runner captures (every row is padding, and no plan of an idle step has
an entry): ``ForwardMode.is_cuda_graph``, run from source, sends an idle batch to the decode
graph runner, which replays the graph of its ``capture_forward_mode`` (its ``__init__``'s
choice, run from source by ``test_the_decode_runner_captures_the_mode_the_leg_replays_an_idle_step_through``):
``DECODE`` without EAGLE, and under EAGLE the target's ``TARGET_VERIFY`` graph, its rows the
draft count wide. The draft model's two runners' ``can_run_graph``, run from source, admit
a DP-attention rank's idle batch where every rank can replay (``prepare_for_draft`` and
``_draft_extend_for_decode`` then replay them, read): the draft decode graph for each draft
step, then the draft extend graph (:meth:`engine_model.engine.Engine.draft_idle`). Where they
do not admit it, EAGLE's worker runs the draft model's idle batch eagerly
(``_draft_forward_idle``, read). In a run that replays no graph, such an idle step has no row
in SGLang, which the leg does not lay out: neither side runs it
(``ManagerRun.idle_not_laid_out``); SGLang's canary, run on a batch of no row, changes no record,
ring row or slot counter (``test_an_eager_idle_step_changes_nothing_in_sglang_s_canary``).

Here, per manager (one per captured batch size, :meth:`ManagerRun.manager`):

- :class:`StaticBuffers`: the registry's slots the canary reads, sized for the captured batch,
  filled as at capture and by :meth:`StaticBuffers.fill_from` at each replay;
- :func:`capture_batch`: the capture's ``ForwardBatch`` (a ``ManagerBatchStandIn``), only the
  fields the runner's ``ForwardBatch(...)`` call passes (:func:`capture_keywords`, read from
  the installed release's source; a field it does not pass is None, as ``ForwardBatch``'s
  default), its ``spec_info`` a :class:`CaptureSpecInfo` in ``TARGET_VERIFY`` (None in
  ``DECODE``, a runner without speculative decoding);
- :func:`capture`: a warm-up run, then ``pre_ops_maybe_inside_graph`` captured as one graph
  and ``post_ops_maybe_inside_graph`` as another (SGLang's second warm-up is the capture's own
  run), every kernel launch of them opaque (:func:`opaque_launchers`); the model's KV store
  between them stays eager, the engine's work;
- :func:`replay`: the live batch copied in, the pre-graph replayed, the model's work, the
  post-graph replayed, with the outside ops eager around them.

A capture writes nothing into the canary buffers or the ring (every row is padding: no plan
has an entry), which :func:`capture` checks; it does count launches, as SGLang's warm-ups do
on a server: the run counters' warm-up share is kept (``CapturedDecode.warm_up``) and the
comparison with the reference leaves it out.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import reference
from conformance import driver, upstream
from conformance.graph_capture import Graph
from conformance.graph_capture import capture as capture_graph
from conformance.sglang import loading
from conformance.sglang.standins import ManagerBatchStandIn
from engine_model import Forward
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    DRAFT_EXTEND_V2,
    IDLE,
    TARGET_VERIFY,
    StepLabel,
)

__all__ = [
    "CAPTURES",
    "DECODE_RUNNER",
    "DRAFT_DECODE_RUNNER",
    "DRAFT_EXTEND_RUNNER",
    "RUNNERS",
    "SEQ_LEN_FILL_VALUE",
    "CaptureSpecInfo",
    "Runner",
    "CapturedDecode",
    "StaticBuffers",
    "capture",
    "capture_batch",
    "capture_keywords",
    "capture_mode",
    "capture_spec_info",
    "graph_dues",
    "opaque_launchers",
    "replay",
    "replayed_dues",
    "replayed_forward",
    "runner_file",
    "settle_runner",
    "unchecked_tokens",
]


@dataclass(frozen=True)
class Runner:
    """One of SGLang's CUDA graph runners that capture while the canary is installed: where
    releases keep it (below ``sglang/srt/``: the first of ``files`` that builds the capture
    batch), the attribute its capture ``ForwardBatch(...)`` call passes as ``forward_mode``,
    and the fields the captured code sets on that batch before the canary reads them
    (``set_in_graph``: EAGLE's ``draft_forward`` sets ``input_ids`` and ``out_cache_loc``
    before each draft step's forward)."""

    name: str
    files: tuple[str, ...]
    mode_attr: str
    set_in_graph: frozenset[str] = frozenset()


#: The decode graph runner: ``DECODE``, or ``TARGET_VERIFY`` under speculative decoding.
DECODE_RUNNER = Runner(
    "decode graph runner",
    ("model_executor/runner/decode_cuda_graph_runner.py", "model_executor/cuda_graph_runner.py"),
    "capture_forward_mode",
)
#: EAGLE's draft model: its multi-step draft decode (one graph of every draft step, each step's
#: canary bracket inside it) and its draft extend (``DRAFT_EXTEND_V2``).
DRAFT_DECODE_RUNNER = Runner(
    "draft decode graph runner",
    ("speculative/eagle_draft_cuda_graph_runner.py",),
    DECODE,  # ``ForwardMode.DECODE``
    frozenset({"input_ids", "out_cache_loc"}),
)
DRAFT_EXTEND_RUNNER = Runner(
    "draft extend graph runner",
    ("speculative/eagle_draft_extend_cuda_graph_runner.py",),
    "forward_mode",
)
RUNNERS = (DECODE_RUNNER, DRAFT_DECODE_RUNNER, DRAFT_EXTEND_RUNNER)
#: The graph each runner captures, by the name the leg gives it (:func:`capture_mode`): the
#: runner and the capture batch's forward mode.
CAPTURES = {
    DECODE: (DECODE_RUNNER, DECODE),
    TARGET_VERIFY: (DECODE_RUNNER, TARGET_VERIFY),
    DRAFT_DECODE.name: (DRAFT_DECODE_RUNNER, DECODE),
    DRAFT_EXTEND_V2: (DRAFT_EXTEND_RUNNER, DRAFT_EXTEND_V2),
}
#: The backend's ``get_cuda_graph_seq_len_fill_value`` (FlashInfer's, and most backends'): the
#: captured ``seq_lens`` and the padding rows' at replay (a decode's plan never reads it).
SEQ_LEN_FILL_VALUE = 1


def _capture_call(tree: ast.AST, mode_attr: str) -> ast.Call | None:
    """The ``ForwardBatch(...)`` call whose ``forward_mode`` is an attribute named
    ``mode_attr`` (``self.capture_forward_mode``, ``ForwardMode.DECODE``), the first one in a
    function whose name says it captures where there is one."""
    found = []
    for function in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] + [tree]:
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ForwardBatch":
                mode = next((k.value for k in node.keywords if k.arg == "forward_mode"), None)
                if isinstance(mode, ast.Attribute) and mode.attr == mode_attr:
                    found.append((0 if "capture" in getattr(function, "name", "") else 1, node))
    return min(found, key=lambda pair: pair[0])[1] if found else None


def runner_file(runner: Runner = DECODE_RUNNER) -> Path:
    """The installed release's file of ``runner``: the first of its files that builds the
    capture's ``ForwardBatch`` (``LookupError``, naming the release and the files looked in,
    where none does)."""
    base = loading.sglang_root() / "srt"
    for name in runner.files:
        path = base / name
        if path.is_file() and _capture_call(ast.parse(path.read_text()), runner.mode_attr):
            return path
    raise LookupError(
        f"sglang {upstream.installed_version()}: no {runner.name} builds a capture "
        f"ForwardBatch(forward_mode=...{runner.mode_attr}, ...) in "
        + ", ".join(f"srt/{n}" for n in runner.files)
    )


@functools.cache
def capture_keywords(runner: Runner = DECODE_RUNNER) -> frozenset[str]:
    """The fields ``runner``'s capture ``ForwardBatch(...)`` call passes (its keywords), and
    those its captured code sets before the canary reads them."""
    call = _capture_call(ast.parse(runner_file(runner).read_text()), runner.mode_attr)
    assert call is not None
    return frozenset(k.arg for k in call.keywords if k.arg is not None) | runner.set_in_graph


@dataclass(frozen=True)
class StaticBuffers:
    """The slots of the runner's registry (``build_decode_registry``) and buffers
    (``runner_utils/buffers.py``) the canary reads, sized for one captured batch size: ``bs``
    rows, ``tokens`` tokens. Allocated as SGLang allocates them (zeros; ``rids_int`` 0 and
    ``bootstrap_room_ids_int`` -1, both there because the token oracle is on) and filled as
    ``_capture`` fills them (``seq_lens`` with :data:`SEQ_LEN_FILL_VALUE`, the index buffers
    zeroed)."""

    input_ids: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    out_cache_loc: torch.Tensor
    positions: torch.Tensor
    rids_int: torch.Tensor
    bootstrap_room_ids_int: torch.Tensor
    extend_seq_lens: torch.Tensor

    @classmethod
    def allocate(cls, bs: int, tokens: int) -> StaticBuffers:
        zeros = functools.partial(torch.zeros, dtype=torch.int64)
        return cls(
            input_ids=zeros(tokens), req_pool_indices=zeros(bs),
            seq_lens=torch.full((bs,), SEQ_LEN_FILL_VALUE, dtype=torch.int64),
            out_cache_loc=zeros(tokens), positions=zeros(tokens), rids_int=zeros(bs),
            bootstrap_room_ids_int=torch.full((bs,), -1, dtype=torch.int64),
            extend_seq_lens=torch.full((bs,), tokens // bs, dtype=torch.int32),
        )  # fmt: skip

    @property
    def width(self) -> int:
        """The tokens of a row: 1, or the captured draft count (``captured_req_width``)."""
        return int(self.input_ids.shape[0]) // int(self.req_pool_indices.shape[0])

    #: each slot's padding policy at replay (``PaddingPolicy``): its padded tail's value
    #: (``"width"``: the row's tokens, as the draft extend runner fills ``extend_seq_lens``), or
    #: None where the tail keeps what the last replay left (``FOREACH_COPY``)
    PADDING = {
        "input_ids": None,
        "req_pool_indices": 0,
        "seq_lens": SEQ_LEN_FILL_VALUE,
        "out_cache_loc": 0,
        "positions": 0,
        "rids_int": None,
        "bootstrap_room_ids_int": None,
        "extend_seq_lens": "width",
    }
    #: each slot's axis (``GraphSlot.axis``): rows, or tokens
    TOKEN_AXIS = frozenset({"input_ids", "out_cache_loc", "positions"})

    def fill_from(self, live: ManagerBatchStandIn, raw_bs: int, raw_tokens: int) -> None:
        """``CudaGraphBufferRegistry.fill_from`` of the live batch (its first ``raw_bs`` rows
        and ``raw_tokens`` tokens are live: a graph's padding stands at the tail): each slot's
        padded tail reset by its policy, then the live head copied in (a field the live batch
        lacks is skipped)."""
        for name, pad in self.PADDING.items():
            buffer = getattr(self, name)
            raw = raw_tokens if name in self.TOKEN_AXIS else raw_bs
            if pad is not None:
                buffer[raw:].fill_(self.width if pad == "width" else pad)
            source = getattr(live, name, None)
            if source is not None:
                buffer[:raw].copy_(source[:raw])


@dataclass(frozen=True)
class CaptureSpecInfo:
    """Stands for the ``spec_info`` a speculative runner gives its capture batch, as the canary
    reads it (``plan_input.py``, ``token_oracle/oracle_manager.py``): in ``TARGET_VERIFY`` the
    decode graph runner's ``get_spec_info`` builds an ``EagleVerifyInput`` whose
    ``draft_token_num`` is the runner's ``speculative_num_draft_tokens``; in ``DRAFT_EXTEND_V2``
    the draft extend runner builds an ``EagleDraftExtendInput`` whose ``num_tokens_per_req`` is
    its ``captured_req_width``; the draft decode runner's ``EagleDraftInput`` passes neither
    (the canary reads no ``spec_info`` in ``DECODE``). A field the runner's constructor does not
    pass is None. ``tests/suite/test_sglang_graphs.py`` reads both sides from source."""

    draft_token_num: int | None = None
    num_tokens_per_req: int | None = None


def capture_mode(forward: Forward, draft: bool = False) -> str:
    """The graph a forward replays (a key of :data:`CAPTURES`): ``TARGET_VERIFY`` for a target
    verify (the decode graph runner of a speculative server captures it), ``DRAFT_DECODE`` for
    a step of the draft model's multi-step draft decode, ``DRAFT_EXTEND_V2`` for its draft
    extend, ``DECODE`` for a decode or an idle step."""
    if forward.kind == "draft_decode":
        return DRAFT_DECODE.name
    if forward.mode in (TARGET_VERIFY, DRAFT_EXTEND_V2):
        return forward.mode
    if forward.mode == IDLE and len(forward.token_rows) > len(forward.plan["req_pool_indices"]):
        # rows wider than one token: an idle step of EAGLE's target runner, or of the draft
        # model's draft extend runner (``draft``: the draft model's forward)
        return DRAFT_EXTEND_V2 if draft else TARGET_VERIFY
    return DECODE


def capture_spec_info(name: str, width: int) -> CaptureSpecInfo | None:
    """The capture batch's ``spec_info`` of graph ``name`` whose rows hold ``width`` tokens
    (None: the decode graph runner without speculative decoding)."""
    if name == TARGET_VERIFY:
        return CaptureSpecInfo(draft_token_num=width)
    if name == DRAFT_EXTEND_V2:
        return CaptureSpecInfo(num_tokens_per_req=width)
    return CaptureSpecInfo() if name == DRAFT_DECODE.name else None


def capture_batch(
    buffers: StaticBuffers,
    mode,
    spec_info: CaptureSpecInfo | None = None,
    runner: Runner = DECODE_RUNNER,
) -> ManagerBatchStandIn:
    """The capture's ``ForwardBatch`` over ``buffers``, as ``runner`` builds it in ``mode``
    (for the decode graph runner, ``self.capture_forward_mode``) with ``spec_info`` (None
    without speculative decoding): only the fields its call passes, or its captured code sets
    (:func:`capture_keywords`), are set, each as the runner sets it; every other field the
    canary reads is None, ``ForwardBatch``'s default (``NotImplementedError`` where a release's
    call passes one this stand-in cannot fill)."""
    passed = capture_keywords(runner)
    bs = int(buffers.req_pool_indices.shape[0])
    values = {
        "forward_mode": mode,
        "batch_size": bs,
        "spec_info": spec_info,
        **{f.name: getattr(buffers, f.name) for f in dataclasses.fields(buffers)},
    }
    fields = {}
    for f in dataclasses.fields(ManagerBatchStandIn):
        if f.name not in passed:
            fields[f.name] = None
        elif f.name in values:
            fields[f.name] = values[f.name]
        else:
            raise NotImplementedError(
                f"the {runner.name} passes {f.name} to its capture batch "
                f"({runner_file(runner).name}): the stand-in does not know its static buffer"
            )
    return ManagerBatchStandIn(**fields)


def opaque_launchers(mods) -> tuple[tuple[object, str], ...]:
    """Every kernel launch the manager's inside-the-graph ops make, at the attribute its caller
    looks it up through (``loading.manager_modules`` binds each to the adapter's launcher or
    an interpreted kernel, whose writes no dispatch sees): the plan kernels
    (``runner/kernel_launcher.py``), the verify and write launchers (``endpoint.py``) and the
    phase checker's kernel (``utils/phase_checker.py``). The expected-token scatter runs in
    ``pre_ops_outside_graph``, outside the graph."""
    return (
        (mods.launcher, "launch_canary_plan_kernels"),
        (mods.endpoint, "launch_canary_verify_kernel"),
        (mods.endpoint, "launch_canary_write_kernel"),
        (mods.phase, "_phase_check_kernel"),
    )


@contextlib.contextmanager
def _stream_capturing():
    """Inside the block ``sglang.srt.utils.is_device_stream_capturing`` says True, wherever
    SGLang's modules imported it (the phase checker's debug message asks it)."""
    owners = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("sglang.srt") and hasattr(m, "is_device_stream_capturing")
    ]
    saved = [(m, m.is_device_stream_capturing) for m in owners]
    for m in owners:
        m.is_device_stream_capturing = lambda device=None: True
    try:
        yield
    finally:
        for m, f in saved:
            m.is_device_stream_capturing = f


@dataclass
class CapturedDecode:
    """One manager's graph of the decode graph runner (``DECODE``, or ``TARGET_VERIFY`` under
    speculative decoding: its capture batch's mode): the manager, its static buffers and
    capture batch, the two graphs, the decisions the capture froze (``input_assert``: the
    write's input assert, ``valid_lens``: whether the captured plan input takes the
    expected-token valid lengths at all; a target verify's draft count is its capture batch's
    ``spec_info``), the run counters its warm-up added (tag -> launches, slots) and the replays
    made."""

    manager: object
    buffers: StaticBuffers
    batch: ManagerBatchStandIn
    pre: Graph
    post: Graph
    input_assert: bool
    valid_lens: bool
    warm_up: dict[str, np.ndarray]
    replays: int = 0


def _state(side) -> list[np.ndarray]:
    """The canary buffers, the ring and its write index of a ``ManagerRun``, copied."""
    out = [side.canary_buf(key).numpy().copy() for key in side.worlds]
    return out + [side.made.violation_ring.numpy().copy(), side.index()]


def capture(side, manager, bs: int, tokens: int, mode: str = DECODE) -> CapturedDecode:
    """``manager`` (new, its asserts off as SGLang builds it) captured as SGLang's runner of
    graph ``mode`` (a key of :data:`CAPTURES`) captures batch size ``bs`` (``tokens`` tokens:
    ``bs`` times the row's width, the draft count in ``TARGET_VERIFY`` and
    ``DRAFT_EXTEND_V2``), its asserts turned on after it as ``mark_init_finished`` does; the
    capture must leave the canary buffers and the ring as they were."""
    mods, device_state = side.mods, side.device_state
    buffers = StaticBuffers.allocate(bs, tokens)
    runner, forward_mode = CAPTURES[mode]
    spec_info = capture_spec_info(mode, tokens // bs)
    batch = capture_batch(buffers, loading.runtime().ForwardMode[forward_mode], spec_info, runner)
    before, counters = _state(side), _counters(device_state)
    chain = device_state.enable_chain_position_assert.clone()
    device_state.enable_chain_position_assert.fill_(0)
    opaque = opaque_launchers(mods)
    with loading.cpu_only():
        made = manager.pre_ops_maybe_inside_graph(batch)  # the first warm-up, eager
        manager.post_ops_maybe_inside_graph(batch, made)
        with _stream_capturing():
            pre = capture_graph(manager.pre_ops_maybe_inside_graph, batch, opaque=opaque)
            post = capture_graph(
                manager.post_ops_maybe_inside_graph, batch, pre.output, opaque=opaque
            )
    device_state.enable_chain_position_assert.copy_(chain)
    manager.phase_checker.enable_assert()
    after = _state(side)
    changed = [
        i for i, (a, b) in enumerate(zip(before, after, strict=True)) if not np.array_equal(a, b)
    ]
    assert not changed, f"the capture of batch size {bs} changed the canary's state: {changed}"
    warm_up = {k: v - counters[k] for k, v in _counters(device_state).items()}
    return CapturedDecode(
        manager=manager, buffers=buffers, batch=batch, pre=pre, post=post,
        input_assert=manager._should_enable_write_input_assert_for_launch(batch),
        valid_lens=batch.req_all_ids_lens is not None, warm_up=warm_up,
    )  # fmt: skip


def _counters(device_state) -> dict[str, np.ndarray]:
    return {
        name: getattr(device_state, name).numpy().copy()
        for name in ("kernel_run_counters", "slot_run_counters")
    }


def replay(side, captured: CapturedDecode, forward: Forward, outside, inside, model) -> object:
    """A replay of ``captured`` for ``forward``: ``pre_ops_outside_graph`` on the live batch
    (``outside``), its rows copied into the static buffers (from ``inside``, the live rows
    first), the pre-graph replayed, ``model(made, positions)`` (the forward's own work: its KV,
    positions it moves in the static buffer), the post-graph replayed, then
    ``post_ops_outside_graph``; SGLang's pre-ops output (the graph's own tensors)."""
    manager = captured.manager
    raw_bs, raw_tokens = int(outside.batch_size), int(outside.positions.shape[0])
    with loading.cpu_only():
        manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=outside)
        captured.buffers.fill_from(inside, raw_bs, raw_tokens)
        made = captured.pre.replay()
        model(made, captured.batch.positions)
        captured.post.replay()
        manager.post_ops_outside_graph()
    captured.replays += 1
    return made


def replayed_forward(forward: Forward, captured: CapturedDecode) -> Forward:
    """``forward`` as the captured graph plans it: where the capture batch carried no
    ``req_all_ids_lens`` (the runner's call does not pass it), ``PlanInput`` never copies the
    valid lengths and every replay plans them 0: no verify entry gathers an expected token
    (the divergence [21] of ``docs/UPSTREAM.md``)."""
    if captured.valid_lens:
        return forward
    plan = dict(forward.plan)
    plan["req_to_verify_expected_tokens_valid_lens"] = np.zeros_like(
        np.asarray(plan["req_to_verify_expected_tokens_valid_lens"])
    )
    return dataclasses.replace(forward, plan=plan)


def unchecked_tokens(forward: Forward, replayed: Forward, capacity: int, pool) -> int:
    """The verify entries of ``forward`` whose expected token the plan of the live batch
    gathers and the replayed graph's plan (``replayed``) leaves unchecked (-1), all groups."""
    if replayed is forward or pool is None:
        return 0
    n = 0
    for group in forward.groups:
        tokens = []
        for step in (forward, replayed):
            vp, wp = driver.reference_plans(capacity, forward.write_req_capacity)
            reference.plan(
                vp, wp, **step.plan, **group.plan_arguments(), verify_capacity=capacity,
                req_to_verify_expected_tokens=pool,
            )  # fmt: skip
            valid = int(vp.verify_num_valid[0]) if int(vp.enable[0]) else 0
            tokens.append(np.asarray(vp.verify_expected_tokens[:valid]))
        n += int(((tokens[0] != -1) & (tokens[1] == -1)).sum())
    return n


#: The reason whose check a replayed graph's plan never makes ([21]).
TOKEN = int(reference.FailReason.VERIFY_TOKEN_MISMATCH)


def replayed_dues(dues: list | None, counted: list[int]) -> list | None:
    """A fault class's ``dues`` (:class:`engine_model.faults.base.Due`) as reports of replayed
    graphs can meet them, where the capture's plan input takes no valid lengths ([21]): the
    ``TOKEN`` bit left out of each due that needs all its bits, a due of that bit alone
    dropped, and so is a due that any one of its bits meets (at any of the fault's slots, or
    ``any_of``) where ``TOKEN`` is one of them: a record that differs in its token alone is
    reported by ``TOKEN`` alone there, eagerly, and by nothing under a replay (its chain
    shows the break one position on, at a slot the fault did not touch); each due changed
    counted in ``counted[0]``."""
    if dues is None:
        return None
    out = []
    for due in dues:
        if not due.bits & TOKEN:
            out.append(due)
            continue
        counted[0] += 1
        if due.bits & ~TOKEN and not (due.slot == -1 or due.any_of):
            out.append(dataclasses.replace(due, bits=due.bits & ~TOKEN))
    return out


def settle_runner(step: StepLabel) -> Runner:
    """The runner whose graphs a settle's decodes in ``step`` replay."""
    if step.draft:
        return DRAFT_DECODE_RUNNER
    return DRAFT_EXTEND_RUNNER if step.mode == DRAFT_EXTEND_V2 else DECODE_RUNNER


@contextlib.contextmanager
def graph_dues(cls, replays: bool, counted: list[int], runner: Runner = DECODE_RUNNER):
    """Inside the block, fault class ``cls`` predicts what a settle through SGLang's replayed
    graphs can report (:func:`replayed_dues`) where the settle's decodes replay graphs of
    ``runner`` (``replays``) and the installed runner's capture batch has no
    ``req_all_ids_lens``; elsewhere it is unchanged."""
    if not replays or "req_all_ids_lens" in capture_keywords(runner):
        yield
        return
    due, later = cls.due, cls.due_after_settle

    def replayed_due(*args, **kwargs):
        prediction = due(*args, **kwargs)
        if prediction is None:
            return None
        return replayed_dues(prediction[0], counted), prediction[1]

    cls.due = replayed_due
    cls.due_after_settle = lambda *a, **k: replayed_dues(later(*a, **k), counted)
    try:
        yield
    finally:
        del cls.due, cls.due_after_settle  # the class's own methods again
