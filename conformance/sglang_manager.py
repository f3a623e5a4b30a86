"""SGLang's per-forward canary runtime over the engine model's histories, against the reference.

    python -m conformance.sglang_manager [--histories N] [--trials N]

SGLang runs its canary on every forward through ``single_forward_manager/manager.py``
(``SingleForwardManager``): outside the forward (or a CUDA graph's replay) its capacity checks
and the expected-token scatter (``req_to_expected_token_ids_manager.py``), then, where a graph
would capture them, the token oracle's expected inputs, ``PlanInput``, the plan of each buffer
group and the ``HEAD`` launches of its endpoints (``endpoint.py``, ``runner/kernel_launcher.py``),
the forward, and the ``TAIL`` launches; its cache sweep runs through ``runner/sweep.py``
(``SweepOrchestrator``, with ``sweep_plan_builder.py``). This leg runs all of that, unmodified
and on the CPU, on every step of engine-model histories (``engine_model/engine.py``), beside the
reference's run of the same steps (``conformance.engine_support.OracleRun``), and after every
step requires SGLang's state to equal the reference's: each endpoint's canary buffer, the
violation ring and its write index, the expected-token pool, and each launch tag's run
counters. KV moved without a forward (a retraction's restore, a relocation, a PD transfer) is
copied on both sides alike, as the engine does.

Then it makes faults of every class of :mod:`engine_model.faults` in such histories, runs the
class's settle through SGLang's runtime and the reference side by side (the decodes of the
settle in each of :data:`conformance.engine_support.SETTLE_MODES`, and in the draft model's
own forwards), and requires the same reports of both, where the class predicts them. From
the reports SGLang's runtime makes it counts which of its checks fired in which forward mode
(:func:`fired_table`; ``conformance/README.md`` keeps today's table, with why each cell that
never fires cannot).

One place is left out of the comparison, counted: SGLang's reports of the divergence [20] of
``docs/UPSTREAM.md`` (the draft model's draft extend), on both sides.

After every step SGLang's host side runs too: ``runner/violation_manager.py``
(``ViolationManager``, which copies the write index to the host one step late) and
``runner/violation_reporter.py`` (mode ``LOG``: a message per new row of the ring); at the end
of each history and trial every row of the ring must have been logged once, with its launch
tag, reasons, slot and position (:func:`logged_problems`). And a flipped KV byte of a cached
slot no request uses is read by an extend that shares the prefix (:func:`shared_prefix_trial`):
``REAL_KV`` in ``EXTEND``, through SGLang's runtime.

What runs of SGLang: the modules above, its ``state.py``, ``config.py``, ``buffer_group.py``,
``token_oracle/`` (``TokenOracleManager`` with its ``HashOracle``), ``plan_input.py``,
``runner/enable_warner.py`` and ``runner/future_tensor.py``, ``utils/phase_checker.py``
(``SimplePhaseChecker``, its Triton kernel interpreted), and its kernels' launchers as the
suite's adapter runs them on the CPU (``conformance/adapters/sglang.py``: SGLang's launchers,
their torch references where a release has no CPU path, its Triton kernels interpreted).
What stands in for the rest of SGLang, each in :func:`modules`:

- ``sglang.srt.utils``: ``is_device_stream_capturing`` (False: nothing captures on the CPU, as
  SGLang's own says for a CPU device), and ``utils.common.flatten_arrays_to_int64_tensor`` with
  the function it calls, executed from SGLang's own source in ``utils/common.py`` (whose module
  imports the serving stack);
- ``sglang.srt.runtime_context`` (``get_observability``, read only by
  ``CanaryConfig.from_env``, which the leg does not call: it builds ``CanaryConfig`` itself);
- pinned host memory: this CPU build of torch has no pinned allocator, so while SGLang's code
  runs, ``pin_memory=True`` asks for ordinary host memory, and the stream, event and capture
  calls of ``torch.cuda`` that older releases make are ``torch.cpu``'s (:func:`_cpu_only`);
- ``ForwardBatch``: :class:`ManagerBatchStandIn`, the fields of
  :class:`conformance.sglang_runtime.ForwardBatchStandIn` and those the manager reads besides
  (``batch_size``, ``out_cache_loc``, ``req_all_ids_flat``); a replayed graph's batch outside
  the graph holds its live rows only, inside it the padding rows too;
- ``ReqToTokenPool``: its ``req_to_token``, the engine's page table; the prefix cache: the
  sweep leg's ``RadixCacheStandIn``; ``Req`` (for ``compute_req_all_ids_info``): each running
  request's tokens as ``origin_input_ids``.

The buffer groups are SGLang's ``CanaryBufferGroup`` over the suite's world of each engine
(``conformance.engine_support.oracle_world``: per group a head and a tail canary buffer, one
KV source of 32 bytes a slot; the K half only, as SGLang runs without
``SGLANG_KV_CANARY_ENABLE_MHA_V``), and the manager is built with the capacities of each
forward (one verify capacity for both groups, as SGLang sizes it: the larger group's).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import importlib
import logging
import os
import re
import sys
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import reference
from conformance import driver, sglang_runtime, upstream
from conformance.driver import ReferenceSide
from conformance.engine_support import (
    BITS,
    DRAFT_SETTLE_MODES,
    KIND,
    SETTLE_MODES,
    SLOT,
    TAGS,
    ImplRun,
    OracleRun,
)
from conformance.sglang_runtime import (
    ForwardBatchStandIn,
    _package,
    _tensor,
    sglang_root,
)
from engine_model.engine import PREFILL_ENGINE, Engine, Forward, Move, Sweep
from engine_model.vocabulary import SWEEP

#: Histories the leg runs by default, and fault trials.
HISTORIES = 12
TRIALS = 2


@contextlib.contextmanager
def _cpu_only():
    """Inside the block, on a torch without CUDA (a CPU build): ``pin_memory=True`` asks torch's
    factories (and ``Tensor.pin_memory``) for ordinary host memory, as there is no pinned
    allocator; and the calls of ``torch.cuda`` that releases up to 0.5.20 make where later ones
    ask the tensor's device module (the phase checker's debug message, formatted on every
    phase change, asks ``is_current_stream_capturing``: False, nothing captures; the host copy
    of ``runner/future_tensor.py`` takes ``current_stream``, ``stream`` and ``Event``) are
    ``torch.cpu``'s; elsewhere nothing changes."""
    if torch.cuda.is_available():
        yield
        return
    names = ("zeros", "empty", "tensor", "ones", "full")
    saved = {n: getattr(torch, n) for n in names}
    saved_pin = torch.Tensor.pin_memory
    cuda_calls = ("is_current_stream_capturing", "current_stream", "stream", "Event")
    saved_cuda = {n: getattr(torch.cuda, n) for n in cuda_calls}

    def unpinned(factory):
        def call(*args, **kwargs):
            kwargs.pop("pin_memory", None)
            return factory(*args, **kwargs)

        return call

    for n in names:
        setattr(torch, n, unpinned(saved[n]))
    torch.Tensor.pin_memory = lambda self, *a, **k: self  # type: ignore[method-assign]
    torch.cuda.is_current_stream_capturing = lambda: False
    torch.cuda.current_stream = lambda device=None: torch.cpu.current_stream()
    torch.cuda.stream = torch.cpu.stream
    torch.cuda.Event = torch.cpu.Event
    try:
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)
        torch.Tensor.pin_memory = saved_pin  # type: ignore[method-assign]
        for n, f in saved_cuda.items():
            setattr(torch.cuda, n, f)


def _from_source(path, names: tuple[str, ...], scope: dict) -> dict:
    """The top-level functions ``names`` of SGLang's file ``path``, executed from its source in
    ``scope``."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in body} == set(names), (path, names)
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    return scope


def _not_run(*args, **kwargs):
    raise AssertionError("the leg builds CanaryConfig itself; the serving stack is not run")


@functools.cache
def modules() -> types.SimpleNamespace:
    """SGLang's runtime modules this leg runs, with the stand-ins of the module docstring."""
    from array import array

    from conformance.adapters import sglang as adapter

    sglang_runtime.sweep_builder()  # the kernels, the runtime's packages, the walker stand-in
    root = sglang_root()
    for name in ("runner", "single_forward_manager", "token_oracle"):
        _package(f"sglang.srt.kv_canary.{name}")
    context = types.ModuleType("sglang.srt.runtime_context")
    context.get_observability = _not_run  # type: ignore[attr-defined]
    sys.modules.setdefault(context.__name__, context)
    _package("sglang.srt.utils")
    utils = sys.modules["sglang.srt.utils"]
    utils.is_device_stream_capturing = lambda device: False  # type: ignore[attr-defined]
    common = types.ModuleType("sglang.srt.utils.common")
    scope = _from_source(
        root / "srt" / "utils" / "common.py",
        ("flatten_arrays_to_pinned_cpu", "flatten_arrays_to_int64_tensor"),
        {"np": np, "torch": torch, "List": list, "array": array},
    )
    common.flatten_arrays_to_int64_tensor = scope["flatten_arrays_to_int64_tensor"]  # type: ignore[attr-defined]
    sys.modules.setdefault(common.__name__, common)
    kv = "sglang.srt.kv_canary"
    out = types.SimpleNamespace(
        adapter=adapter,
        config=importlib.import_module(f"{kv}.config"),
        state=importlib.import_module(f"{kv}.state"),
        buffer_group=importlib.import_module(f"{kv}.buffer_group"),
        endpoint=importlib.import_module(f"{kv}.endpoint"),
        launcher=importlib.import_module(f"{kv}.runner.kernel_launcher"),
        scatter=importlib.import_module(f"{kv}.req_to_expected_token_ids_manager"),
        manager=importlib.import_module(f"{kv}.single_forward_manager.manager"),
        sweep=importlib.import_module(f"{kv}.runner.sweep"),
        violations=importlib.import_module(f"{kv}.runner.violation_manager"),
        reporter=importlib.import_module(f"{kv}.runner.violation_reporter"),
        phase=importlib.import_module("sglang.srt.utils.phase_checker"),
        oracle=sglang_runtime.oracle_modules(),
    )
    # SGLang's launchers as the adapter runs them on CPU tensors (their references where a
    # release has no CPU path, the Triton kernels interpreted), bound where SGLang's runtime
    # looks them up
    out.endpoint.launch_canary_verify_kernel = adapter.launch_canary_verify_kernel
    out.endpoint.launch_canary_write_kernel = adapter.launch_canary_write_kernel
    out.launcher.launch_canary_plan_kernels = adapter.launch_canary_plan_kernels
    out.scatter.launch_scatter_req_token_ids_kernel = adapter.launch_scatter_req_token_ids_kernel
    namespace = adapter._interpreted_namespace(out.phase)
    out.phase._phase_check_kernel = namespace["_phase_check_kernel"]
    return out


@dataclass(frozen=True)
class ManagerBatchStandIn(ForwardBatchStandIn):
    """Stands for SGLang's ``ForwardBatch`` as the manager, its launches and the expected-token
    scatter read it: the fields of :class:`ForwardBatchStandIn` and ``batch_size``,
    ``out_cache_loc`` (the forward's slots in the full pool), ``req_all_ids_flat`` and
    ``req_all_ids_lens`` (each live row's known tokens, made by SGLang's
    ``compute_req_all_ids_info``; None where the engine keeps no expected-token pool)."""

    batch_size: int = 0
    out_cache_loc: torch.Tensor | None = None
    req_all_ids_flat: torch.Tensor | None = None


def manager_batches(
    forward: Forward, mods
) -> tuple[ManagerBatchStandIn, ManagerBatchStandIn] | None:
    """The batch SGLang's runtime sees outside the forward (a replayed graph's live rows
    only) and inside it, for ``forward`` (None: a forward SGLang never makes)."""
    inner = sglang_runtime.forward_batch(forward)
    if inner is None:
        return None
    fields = {f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)}
    loc = _tensor(forward.group("FULL").out_cache_loc)
    rows = inner.req_pool_indices
    live = rows != 0 if forward.graph else torch.ones_like(rows, dtype=torch.bool)
    flat = lens = None
    if forward.scatter is not None:
        s = forward.scatter
        reqs = [
            types.SimpleNamespace(
                origin_input_ids=array_of(s["flat_in"][a:b]), output_ids=array_of([])
            )
            for a, b in zip(s["offsets"][:-1], s["offsets"][1:], strict=True)
        ]
        with _cpu_only():
            flat, lens = mods.scatter.compute_req_all_ids_info(reqs)
    full = ManagerBatchStandIn(
        **fields, batch_size=int(rows.shape[0]), out_cache_loc=loc, req_all_ids_flat=flat
    )
    outside_fields = dict(fields)
    outside_fields.update(
        req_pool_indices=rows[live],
        req_all_ids_lens=lens,
        positions=inner.positions[
            : int(np.isin(forward.token_rows, np.flatnonzero(live.numpy())).sum())
        ],
    )
    outside = ManagerBatchStandIn(
        **outside_fields, batch_size=int(live.sum()), out_cache_loc=loc, req_all_ids_flat=flat
    )
    return outside, full


def array_of(values):
    from array import array

    return array("q", [int(v) for v in values])


class EngineOracle:
    """Stands for SGLang's token oracle (``token_oracle/oracle.py``: ``HashOracle``, whose
    tokens SGLang's oracle sampler makes the sampled ones): the engine model's own, each
    request's true token at a position (``expected_tokens``, keyed by the request's pool row,
    which the batch stand-in gives as its id; 0 for a padding row)."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def expected_tokens(self, *, generalized_req_ids: torch.Tensor, positions: torch.Tensor):
        by_row = {r.row: r for r in self.engine.running.values()}
        out = [
            int(by_row[row].truth[pos]) if row in by_row and pos < len(by_row[row].truth) else 0
            for row, pos in zip(generalized_req_ids.tolist(), positions.tolist(), strict=True)
        ]
        return torch.tensor(out, dtype=torch.int32)


class ManagerRun(ImplRun):
    """SGLang's runtime over an engine's history: its buffer groups, endpoints, device state,
    a ``SingleForwardManager`` per forward and its ``SweepOrchestrator``, over the suite's
    worlds of the engine (materialized as :class:`ImplRun` makes them, whose moves and KV
    flips it keeps)."""

    def __init__(self, engine: Engine, oracle: OracleRun, *, capture: bool = True):
        mods = modules()
        super().__init__(mods.adapter, torch.device("cpu"), engine, oracle.states)
        self.mods = mods
        c = engine.config
        cfg_mod = mods.config
        self.config = cfg_mod.CanaryConfig(
            mode=cfg_mod.CanaryMode.LOG, ring_capacity=self.made.violation_ring.shape[0],
            sweep_interval=1, real_kv_hash_mode=mods.adapter.RealKvHashMode(c.mode),
            enable_write_input_assert=True, enable_verify_token_assert=engine.pool is not None,
            stats_print_every_n_steps=0,
        )  # fmt: skip
        tags = len(mods.adapter.CanaryLaunchTag)
        state = mods.state.CanaryDeviceState(
            violation_log=mods.state.ViolationLog(
                violation_ring=self.made.violation_ring,
                violation_write_index=self.made.violation_write_index,
            ),
            kernel_run_counters=torch.zeros(tags, dtype=torch.int64),
            slot_run_counters=torch.zeros(tags, dtype=torch.int64),
            enable_chain_position_assert=torch.ones(1, dtype=torch.int32),
            req_to_verify_expected_tokens=self.pool,
        )
        self.device_state = state
        bg = mods.buffer_group
        self.groups = tuple(
            bg.CanaryBufferGroup(
                kind=bg.PoolKind[g],
                k_head=self.canary_buf((g, "HEAD")), k_tail=self.canary_buf((g, "TAIL")),
                v_head=None, v_tail=None,
                real_kv_sources_k=(mods.adapter.RealKvSource(
                    tensor=self.kv(g), page_size=1, num_bytes_per_token=self.kv(g).shape[1],
                    read_bytes=self.kv(g).shape[1],
                ),),
                real_kv_sources_v=(),
                swa_index_lut=None if g == "FULL" else self.lut,
                kv_token_id_vs_position_offset=c.offset,
            )
            for g in c.groups
        )  # fmt: skip
        self.endpoints = tuple(
            e
            for group in self.groups
            for e in mods.endpoint.build_endpoints_from_group(group=group, device_state=state)
        )
        self.steps = 0
        self.sweeper = mods.sweep.SweepOrchestrator(
            config=self.config, device_state=state, buffer_groups=self.groups,
            endpoints=self.endpoints, swa_window_size=c.swa_window,
            outer_step_counter_getter=lambda: self.steps,
        )  # fmt: skip
        self.fired: Counter = Counter()
        self.modes: Counter = Counter()  # the steps run, by forward mode (run_history)
        self.pending: list[str] = []  # what differed in the step's plans, for compare
        self.plans_compared = 0
        self.divergent = 0  # SGLang's reports of the divergence [20]
        self.not_managed: Counter = Counter()  # forwards SGLang never makes, by mode
        self.d2h_stream = torch.cpu.Stream()  # SGLang's stream for host copies, on the CPU
        self.managers: dict = {}
        # the host side: SGLang's ViolationManager drains the ring one step late and its
        # ViolationReporter logs each new row (mode LOG), caught here
        self.violations = mods.violations.ViolationManager(
            config=self.config, device_state=state, d2h_stream=self.d2h_stream,
            outer_step_counter_getter=lambda: self.steps,
        )  # fmt: skip
        self.logged: list[str] = []
        if capture:  # a PD transfer's prefill engine logs into its decode engine's list
            handler = logging.Handler()
            handler.emit = lambda record: self.logged.append(record.getMessage())  # type: ignore[method-assign]
            reporter_log = logging.getLogger(mods.reporter.__name__)
            reporter_log.handlers = [handler]
            reporter_log.propagate = False

    def manager(self, forward: Forward):
        """The ``SingleForwardManager`` of ``forward``'s capacities (one per size, as SGLang
        keeps one per captured batch size), made on first use."""
        key = (
            max(g.verify_capacity for g in forward.groups), forward.write_req_capacity,
            max(1, len(forward.write["positions"])), self.engine.config.offset == 1,
        )  # fmt: skip
        if key not in self.managers:
            self.managers[key] = self._new_manager(*key)
            self.managers[key].phase_checker.enable_assert()
        return self.managers[key]

    def _new_manager(self, verify: int, reqs: int, entries: int, draft: bool):
        mods = self.mods
        c = self.engine.config
        oracle = mods.oracle.oracle_manager.TokenOracleManager(oracle=EngineOracle(self.engine))
        return mods.manager.SingleForwardManager(
            config=self.config, device=self.device, device_state=self.device_state,
            buffer_groups=self.groups, endpoints=self.endpoints,
            req_to_token_pool=types.SimpleNamespace(req_to_token=self.table),
            swa_window_size=c.swa_window,
            per_forward_verify_capacity=verify, per_forward_write_req_capacity=reqs,
            per_forward_write_entry_capacity=entries,
            d2h_stream=self.d2h_stream, token_oracle_manager=oracle, swa_divergence_report=None,
            is_eagle_draft_decode=draft,
        )  # fmt: skip

    def forward(self, forward: Forward) -> bool:
        """``forward`` through SGLang's runtime (False: a forward SGLang never makes, not run)."""
        batches = manager_batches(forward, self.mods)
        if batches is None:
            return False
        outside, inside = batches
        self.table.copy_(torch.from_numpy(forward.plan["req_to_token"]))
        lut = forward.groups[-1].full_to_swa_index_mapping
        if lut is not None:
            self.lut.copy_(torch.from_numpy(lut))
        manager = self.manager(forward)
        with _cpu_only():
            manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=outside)
            made = manager.pre_ops_maybe_inside_graph(inside)
            self.pending += self.plan_problems(forward, manager, made)
            for group in forward.groups:  # the forward stores its KV
                self.store_kv(group)
            if forward.tail_write:  # the model moved the positions it reads, in place
                inside.positions.copy_(_tensor(forward.tail_write["positions"]))
            manager.post_ops_maybe_inside_graph(inside, made)
            manager.post_ops_outside_graph()
        return True

    def run(self, oracle: OracleRun, step) -> None:
        """One step on SGLang's runtime and on the reference, then their states compared; a
        step of a PD transfer's prefill engine on that engine's sides."""
        if getattr(step, "engine", "") == PREFILL_ENGINE:
            peer = oracle.peer_run()
            if self.peer is None:
                assert self.engine.peer is not None
                self.peer = ManagerRun(self.engine.peer, peer, capture=False)
                self.peer.host = self.host
            self.peer.run_here(peer, step)
        else:
            self.run_here(oracle, step)

    def run_here(self, oracle: OracleRun, step) -> None:
        since, mine_since = oracle.index, self.index()
        if isinstance(step, Move):
            driver.move(self, step)
        elif isinstance(step, Sweep):
            self.sweep_step(step)
        elif not self.forward(step):
            # a forward SGLang never makes (padding rows amid a batch outside a replayed
            # graph): the suite's own launches of it on SGLang's kernels, on both sides
            self.not_managed[step.mode] += 1
            driver.run_step(self, oracle, step, what=lambda launch: launch, config="")
            return
        ReferenceSide.forward_or_sweep(oracle, step)
        self.compare(oracle, since, mine_since, step)
        with _cpu_only():
            self.violations.step()

    def sweep_step(self, step: Sweep) -> None:
        """SGLang's ``SweepOrchestrator`` at a sweep of the engine, over the stand-in prefix
        cache whose walk is the engine model's (every slot its cached prefixes hold)."""
        self.table.copy_(torch.from_numpy(self.engine.req_to_token))
        if self.lut is not None:
            self.lut.copy_(torch.from_numpy(self.engine.lut))
        self.sweeper.attach_radix_cache(sglang_runtime.swept_cache(self.table, step))
        self.steps += 1
        self.sweeper.maybe_run_sweep()

    def plan_problems(self, forward: Forward, manager, made) -> list[str]:
        """SGLang's plans of each group and its expected inputs against the reference's for
        ``forward``: the reference's plan at the same capacities over the same page table,
        SWA table and expected-token pool (their valid entries compared); the expected inputs,
        where the input assert is on, against the engine model's (but for [20])."""
        lines = []
        pool = None if self.pool is None else self.pool.numpy().copy()
        for i, group in enumerate(forward.groups):
            vp, wp = driver.reference_plans(manager._verify_capacity, forward.write_req_capacity)
            reference.plan(
                vp, wp, **forward.plan, **group.plan_arguments(),
                verify_capacity=manager._verify_capacity, req_to_verify_expected_tokens=pool,
            )  # fmt: skip
            got = driver.plan_host(made.verify_plans[i], made.write_plans[i])
            want = driver.plan_host(vp, wp)
            n = int(want[("verify", "verify_num_valid")][0])
            m = int(want[("write", "write_num_valid_reqs")][0])
            cut = {"verify": n, "write": m + 1}
            for key in driver.PLAN_FIELDS:
                g, w = got[key], want[key]
                if key[1] not in ("verify_num_valid", "enable", "write_num_valid_reqs"):
                    g, w = g[: cut[key[0]]], w[: cut[key[0]]]
                if g.shape != w.shape or not np.array_equal(g, w):
                    lines.append(
                        f"{group.group} {key[1]}: SGLang {g[:4].tolist()}, the reference {w[:4].tolist()}"
                    )
        write = forward.write
        on = manager._should_enable_write_input_assert_for_launch(
            sglang_runtime.forward_batch(forward)
        )
        n = len(write["positions"])
        if (
            on
            and write["expected_input_tokens"] is not None
            and not (forward.mode == "DRAFT_EXTEND_V2" and self.engine.config.offset == 1)
        ):
            live = np.asarray(forward.plan["req_pool_indices"])[forward.token_rows] != 0
            tokens = made.expected_inputs.tokens[:n].numpy()[live]  # padding rows write nothing
            if not np.array_equal(tokens, np.asarray(write["expected_input_tokens"])[live]):
                lines.append("expected input tokens differ from the engine model's")
            if not np.array_equal(made.expected_inputs.positions[:n].numpy(), write["positions"]):
                lines.append("expected input positions differ from the forward's")
        self.plans_compared += len(forward.groups)
        return lines

    def index(self) -> int:
        return int(self.made.violation_write_index[0])

    def compare(self, oracle: OracleRun, since: int, mine_since: int, step) -> None:
        """SGLang's state against the reference's after ``step``: every endpoint's canary
        buffer, the reports each made during the step (as sets of rows: the order of a launch's
        rows is not the contract's), the expected-token pool and each tag's run counters.
        SGLang's reports of the divergence [20] (:func:`draft_extend_reports`) are counted in
        ``divergent`` and left out."""
        what = f"step {self.engine.steps} ({self.engine.log[-1]})"
        lines = []
        for key, state in oracle.states.items():
            if key[1] == SWEEP:
                continue
            diff = np.argwhere(self.canary_buf(key).numpy() != state.canary_buf)
            if len(diff):
                slots = sorted(set(diff[:, 0].tolist()))[:6]
                lines.append(f"{TAGS[key].name}'s canary buffer differs at slots {slots}")
        ring = self.made.violation_ring.numpy()
        mine = ring[mine_since : min(self.index(), len(ring))]
        want = oracle.rows(since)
        if isinstance(step, Forward):
            # where SGLang's input assert fires on every token, the reports of that check
            # are compared on neither side
            known = draft_extend_reports(self.engine, step, mine)
            self.divergent += int(known.sum())
            mine = mine[~known]
            want = want[~draft_extend_reports(self.engine, step, want)]
        for row in mine:
            self.fired[(label(step), int(row[KIND]), int(row[BITS]))] += 1
        if len(mine) != len(want) or not np.array_equal(
            np.unique(mine, axis=0), np.unique(want, axis=0)
        ):
            lines.append(
                f"reports: SGLang {len(mine)} {mine[:2].tolist()}, "
                f"the reference {len(want)} {want[:2].tolist()}"
            )
        if self.pool is not None and not np.array_equal(self.pool.numpy(), oracle.pool):
            lines.append("the expected-token pool differs")
        for key, state in oracle.states.items():
            tag = int(TAGS[key])
            for name in ("slot_run_counter", "kernel_run_counter"):
                got = int(getattr(self.device_state, name + "s")[tag])
                want_n = int(getattr(state, name)[0])
                if got != want_n:
                    lines.append(f"{TAGS[key].name} {name}: SGLang {got}, the reference {want_n}")
        lines += self.pending
        self.pending = []
        assert not lines, f"{what}: " + "; ".join(lines)


def logged_problems(side: ManagerRun) -> list[str]:
    """After the last step: SGLang's host side drained (two more pumps: its copy of the write
    index runs one step late), every row of its ring must have been logged once by its
    ``ViolationReporter``, with its launch tag, reasons, slot and position, and nothing else."""
    with _cpu_only():
        side.violations.step()
        side.violations.step()
    ring = side.made.violation_ring.numpy()[: min(side.index(), len(side.made.violation_ring))]
    want = Counter(
        (
            reference.CanaryLaunchTag(int(r[KIND])).name,
            "+".join(
                f.name.lower().removesuffix("_mismatch")
                for f in reference.FailReason
                if int(r[BITS]) & int(f)
            ),
            int(r[SLOT]),
            int(r[reference.ViolationField.POSITION]),
        )
        for r in ring
    )
    got: Counter = Counter()
    for message in side.logged:
        first = message.splitlines()[0]
        if not first.startswith("kv_canary violation: "):
            continue
        fields = dict(kv.split("=", 1) for kv in first.split(": ", 1)[1].split())
        got[(fields["launch_tag"], fields["fail_reason"], int(fields["slot_idx"]),
             int(fields["position"]))] += 1  # fmt: skip
    if got == want:
        return []
    return [
        f"SGLang's violation reporter logged {sum(got.values())} rows, its ring holds "
        f"{sum(want.values())}: missing {list((want - got).items())[:2]}, extra "
        f"{list((got - want).items())[:2]}"
    ]


def label(step) -> str:
    """A step's forward mode as the leg counts it (``SWEEP`` for a cache sweep)."""
    return "SWEEP" if isinstance(step, Sweep) else sglang_runtime.label(step)


def draft_extend_reports(engine: Engine, forward: Forward, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` are the divergence [20] of ``docs/UPSTREAM.md``: in the draft model's
    ``DRAFT_EXTEND_V2`` (the EAGLE offset 1: the input at position ``p`` is the token of
    ``p + 1``), SGLang's oracle manager expects the oracle's token of ``p`` itself, so its
    input assert reports ``WRITE_TOKEN`` alone at each slot the forward writes, by its ``HEAD``
    and ``TAIL`` writes."""
    if forward.mode != "DRAFT_EXTEND_V2" or engine.config.offset != 1 or not len(rows):
        return np.zeros(len(rows), dtype=bool)
    written = set()
    for g in forward.groups:
        written |= set(g.out_cache_loc.tolist())
    return (rows[:, BITS] == int(reference.FailReason.WRITE_TOKEN_MISMATCH)) & np.isin(
        rows[:, SLOT], list(written)
    )


#: The checks of the kernels' reports (``FAIL_REASON_BITS``), as the firing table names them.
CHECKS = {
    "CHAIN": reference.FailReason.VERIFY_CHAIN_HASH_MISMATCH,
    "POSITION": reference.FailReason.VERIFY_POSITION_MISMATCH,
    "REAL_KV": reference.FailReason.VERIFY_REAL_KV_HASH_MISMATCH,
    "TOKEN": reference.FailReason.VERIFY_TOKEN_MISMATCH,
    "WRITE_TOKEN": reference.FailReason.WRITE_TOKEN_MISMATCH,
    "WRITE_POSITION": reference.FailReason.WRITE_POSITION_MISMATCH,
}


def run_history(index: int, steps: int = 40) -> ManagerRun:
    """History ``index`` of :func:`conformance.sglang_runtime.history` on SGLang's runtime and
    the reference, compared after every step (an ``AssertionError`` names the first step
    where they differ); the runtime side, with its counts."""
    engine = Engine(sglang_runtime.config(index))
    oracle = OracleRun(engine)
    side = ManagerRun(engine, oracle)

    def run(step) -> None:
        side.run(oracle, step)
        side.modes[label(step) if not isinstance(step, Move) else "KV moved without a forward"] += 1

    sglang_runtime.history(index, steps, run=run, engine=engine)
    if oracle.index or side.index() != side.divergent:
        raise AssertionError(f"history {index}: a correct history reported")
    logged = logged_problems(side)
    assert not logged, f"history {index}: {logged}"
    return side


def fault_trial(kind: str, index: int, mode: str) -> tuple[str, list[str], ManagerRun]:
    """A fault of class ``kind`` made after a warm-up (no padding rows amid a batch, as SGLang
    makes them) and settled with decodes in ``mode``, on SGLang's runtime and the reference
    side by side (their states compared after every step); the reference's reports judged as
    the class predicts (:func:`conformance.engine_support.inject_and_settle`).
    ``(outcome, problems, side)``: ``reported``, ``silent`` (nothing due, nothing reported)
    or ``no place``."""
    from conformance.engine_support import inject_and_settle, warm_up
    from engine_model.faults import FAULTS

    cls = FAULTS[kind]
    base = dataclasses.replace(sglang_runtime.config(index), seed=9500 + index, mode=index % 3)
    if mode in DRAFT_SETTLE_MODES:  # the draft model's canary
        base = dataclasses.replace(base, offset=1)
    if cls.target_model_only:
        base, mode = dataclasses.replace(base, offset=0), cls.settle_mode
    engine = Engine(base)
    oracle = OracleRun(engine)
    side = ManagerRun(engine, oracle)
    run = functools.partial(side.run, oracle)
    warm_up(engine, run, pad=0)
    made = inject_and_settle(
        engine, oracle, kind, index, index % 32, run, flip=side.flip, mode=mode
    )
    if made is None:
        return "no place", [], side
    _, problems, first = made
    problems = problems + logged_problems(side)
    return ("reported" if first is not None else "silent"), problems, side


def shared_prefix_trial(index: int) -> ManagerRun:
    """A KV byte of a cached slot no request uses flipped (the ``kv_unused_cache`` class, mode
    ``ALL``), then a request admitted sharing that prefix and prefilled: its ``EXTEND``
    forward's ``TAIL`` verify reads the shared slots' KV, through SGLang's runtime and the
    reference side by side (equal after every step); the runtime side, whose ``fired`` counts
    the reports (``REAL_KV`` in ``EXTEND`` where the flipped slot is in the shared part)."""
    from conformance.engine_support import warm_up
    from engine_model import faults

    base = dataclasses.replace(sglang_runtime.config(index), seed=9900 + index, mode=2, offset=0)
    engine = Engine(base)
    oracle = OracleRun(engine)
    side = ManagerRun(engine, oracle)
    run = functools.partial(side.run, oracle)
    warm_up(engine, run, pad=0)
    fault = faults.make(engine, "kv_unused_cache", index, index)
    if fault is not None and fault.flip is not None:
        oracle.flip(*fault.flip)
        side.flip(*fault.flip)
        for share in range(1, len(engine.cache) + 1):
            if engine.admit(2, share=share) is not None:
                break
        step = engine.prefill(engine.config.context_len)
        if step is not None:
            run(step)
    return side


def divergence_expected(tag: int) -> bool | None:
    """Whether ``docs/UPSTREAM.md``'s divergence ``tag`` reproduces on the installed release
    (its range in ``conformance/upstream_table.py``; None: a release the project does not
    list)."""
    from conformance.upstream_table import DIVERGENCES

    order = [r.version for r in upstream.RELEASES]
    version = upstream.installed_version()
    if version not in order:
        return None
    first, last = (order.index(v) for v in DIVERGENCES[tag].reproduces)
    return first <= order.index(version) <= last


def fired_counts(fired: Counter) -> dict[tuple[str, str], int]:
    """Reports per ``(check, forward mode)``, every mode that ran: 0 where the check never
    fired there."""
    modes = sorted({m for m, _, _ in fired})
    return {
        (name, mode): sum(n for (m, _, bits), n in fired.items() if m == mode and bits & int(bit))
        for name, bit in CHECKS.items()
        for mode in modes
    }


def fired_table(fired: Counter) -> list[str]:
    """The checks SGLang's runtime fired, per forward mode, as markdown rows."""
    counts = fired_counts(fired)
    modes = sorted({mode for _, mode in counts})
    lines = ["| check | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes)]
    for name in CHECKS:
        cells = [str(counts[name, mode] or "never") for mode in modes]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


#: The README's short names of the modes in the table of fired checks.
_README_MODES = {
    "draft DECODE": "DECODE of the draft model",
    "graph DECODE": "DECODE replaying a graph",
}


def readme_never_cells() -> tuple[str, set[tuple[str, str]]]:
    """The release of ``conformance/README.md``'s table of the checks SGLang's runtime fired
    ("Today on X, ..."), and its cells that say the check cannot fire (``cannot``, or a
    divergence's tag): ``(check, mode)`` pairs, the modes as :func:`fired_table` names them."""
    text = (Path(__file__).resolve().parent / "README.md").read_text()
    release = re.search(r"Today on (\S+), the checks SGLang's runtime fired", text)
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    header = next(line for line in lines if line.startswith("| check |"))
    modes = [_README_MODES.get(m, m) for m in (c.strip() for c in header.strip("|").split("|"))]
    never = set()
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in CHECKS:
            never |= {
                (cells[0], mode)
                for mode, cell in zip(modes[1:], cells[1:], strict=True)
                if cell == "cannot" or cell.startswith("[")
            }
    if release is None or not never:
        raise LookupError("conformance/README.md has no table of the checks SGLang fired")
    return release.group(1), never


def table_problems(fired: Counter, cannot: set[tuple[str, str]]) -> list[str]:
    """Where the run's fired checks disagree with a table whose ``cannot`` cells never fire
    and whose other cells do (:func:`readme_never_cells`)."""
    never = {cell for cell, n in fired_counts(fired).items() if n == 0}
    return [
        f"{check} never fired in {mode}, which the README says it does"
        for check, mode in sorted(never - cannot)
    ] + [
        f"{check} fired in {mode}, which the README says it cannot"
        for check, mode in sorted(cannot - never)
    ]


def _positive(text: str) -> int:
    """A count of at least 1 (0 would let the leg pass without running it)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.sglang_manager", description=__doc__
    )
    parser.add_argument("--histories", type=_positive, default=HISTORIES)
    parser.add_argument(
        "--trials",
        type=_positive,
        default=os.environ.get("CANARY_MANAGER_TRIALS", str(TRIALS)),  # argparse applies type
        help="fault trials a class and mode (default: CANARY_MANAGER_TRIALS, else %(default)s)",
    )
    options = parser.parse_args(argv)
    try:
        modules()
    except ImportError as error:  # no sglang, or one without the runtime
        print(f"error: {error}", file=sys.stderr)
        return 2
    from engine_model.faults import FAULTS

    modes_settled = (*SETTLE_MODES, *DRAFT_SETTLE_MODES)

    print(
        f"sglang {upstream.installed_version()}: SGLang's per-forward runtime against the reference"
    )
    modes: Counter = Counter()
    divergent = plans = 0
    not_managed: Counter = Counter()
    for index in range(options.histories):
        side = run_history(index)
        modes.update(side.modes)
        plans += side.plans_compared
        divergent += side.divergent
        not_managed.update(side.not_managed)
    print(f"{options.histories} correct histories, equal after every step, silent:")
    for name, n in sorted(modes.items()):
        print(f"  {name}: {n}")
    print(f"  plans of a group and expected inputs equal the reference's: {plans}")
    print(
        f"  forwards SGLang never makes (run by the suite's launches): {sum(not_managed.values())}"
    )
    never = [
        m for m in (*sglang_runtime.REQUIRED, "SWEEP", "KV moved without a forward") if not modes[m]
    ]
    print(f"  SGLang's reports of the divergence [20] (draft extend, EAGLE offset): {divergent}")
    fired: Counter = Counter()
    outcomes: Counter = Counter()
    problems = []
    for kind in FAULTS:
        for mode in modes_settled:
            for t in range(options.trials):
                index = t * len(modes_settled) + modes_settled.index(mode)
                outcome, lines, side = fault_trial(kind, index, mode)
                outcomes[(kind, outcome)] += 1
                fired.update(side.fired)
                problems += [f"{kind} {mode} trial {t}: {line}" for line in lines]
    for index in range(options.trials * 4):  # a flipped cached byte read by a sharing extend
        side = shared_prefix_trial(index)
        fired.update(side.fired)
        problems += [f"shared prefix trial {index}: {x}" for x in logged_problems(side)]
    print("fault trials (each class, each settle mode), SGLang's reports equal to the reference's:")
    for kind in FAULTS:
        print(
            f"  {kind}: "
            + ", ".join(f"{o} {n}" for (k, o), n in sorted(outcomes.items()) if k == kind)
        )
    print("checks SGLang's runtime fired, reports per forward mode (fault trials):")
    for line in fired_table(fired):
        print("  " + line)
    problems += [f"the correct histories never reached {m}" for m in never]
    # the README's table, on the release it was made on: a cell it says cannot fire never
    # does, and every other cell fires
    release, cannot = readme_never_cells()
    if release == upstream.installed_version():
        problems += table_problems(fired, cannot)
    # [20] as an expectation: present on the releases its script reproduces on, so that a fix
    # upstream shows as an unexpected pass, and absent elsewhere
    expected = divergence_expected(20)
    if expected is not None and (divergent > 0) != expected:
        problems.append(
            f"[20] {'expected but not seen' if expected else 'seen but not expected'} on "
            f"sglang {upstream.installed_version()}: {divergent} reports"
        )
    for line in problems:
        print(f"problem: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
