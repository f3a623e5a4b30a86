"""SGLang's per-forward runtime over an engine's history, beside the reference: the
``SingleForwardManager`` of each forward (eagerly, or by a replay of its captured CUDA graph
where SGLang replays one: :mod:`conformance.sglang.graphs`), the ``SweepOrchestrator`` at each
sweep and the host side's ``ViolationManager`` and ``ViolationReporter`` (:class:`ManagerRun`), the batches it is
given (:func:`manager_batches`), the check that its reporter logged every row of its ring
(:func:`logged_problems`), the reports of the divergence [20] that no side's comparison counts
(:func:`draft_extend_reports`), and a correct history run through it (:func:`run_history`)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import types
from collections import Counter
from typing import NoReturn

import numpy as np
import torch

import reference
from conformance import driver, upstream
from conformance.driver import ReferenceSide
from conformance.engine_support import BITS, KIND, SLOT, TAGS, ImplRun, OracleRun
from conformance.sglang import graphs, histories, loading, prefill_graphs, tree, wiring
from conformance.sglang.standins import (
    EngineTokenOracle,
    ManagerBatchStandIn,
    forward_batch,
    int64_tensor,
    request_ids,
    swept_cache,
)
from engine_model import PREFILL_ENGINE, Engine, EngineConfig, Forward, Move, Sweep
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    DRAFT_EXTEND_V2,
    EXTEND,
    FULL,
    HEAD,
    IDLE,
    MIXED,
    SWEEP,
    TAIL,
)

__all__ = [
    "ManagerRun",
    "ServerCannotStart",
    "draft_extend_reports",
    "logged_problems",
    "manager_batches",
    "run_history",
]


def manager_batches(
    forward: Forward, mods
) -> tuple[ManagerBatchStandIn, ManagerBatchStandIn] | None:
    """The batch SGLang's runtime sees outside the forward (a replayed graph's live rows
    only) and inside it, for ``forward`` (None: a forward SGLang never makes)."""
    inner = forward_batch(forward)
    if inner is None:
        return None
    fields = {f.name: getattr(inner, f.name) for f in dataclasses.fields(inner)}
    loc = int64_tensor(forward.group(FULL).out_cache_loc)
    rows = inner.req_pool_indices
    live = rows != 0 if forward.graph else torch.ones_like(rows, dtype=torch.bool)
    flat = lens = None
    if forward.scatter is not None:
        s = forward.scatter
        reqs = [
            types.SimpleNamespace(
                origin_input_ids=request_ids(s["flat_in"][a:b]), output_ids=request_ids([])
            )
            for a, b in zip(s["offsets"][:-1], s["offsets"][1:], strict=True)
        ]
        with loading.cpu_only():
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


def draft_extend_reports(engine: Engine, forward: Forward, rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` are the divergence [20] of ``docs/UPSTREAM.md``: in the draft model's
    ``DRAFT_EXTEND_V2`` (the EAGLE offset 1: the input at position ``p`` is the token of
    ``p + 1``), SGLang's oracle manager expects the oracle's token of ``p`` itself, so its
    input assert reports ``WRITE_TOKEN`` alone at each slot the forward writes, by its ``HEAD``
    and ``TAIL`` writes."""
    if forward.mode != DRAFT_EXTEND_V2 or engine.config.offset != 1 or not len(rows):
        return np.zeros(len(rows), dtype=bool)
    written = set()
    for g in forward.groups:
        written |= set(g.out_cache_loc.tolist())
    return (rows[:, BITS] == int(reference.FailReason.WRITE_TOKEN_MISMATCH)) & np.isin(
        rows[:, SLOT], list(written)
    )


class ManagerRun(ImplRun):
    """SGLang's runtime over an engine's history: its buffer groups, endpoints, device state,
    a ``SingleForwardManager`` per forward and its ``SweepOrchestrator``, over the suite's
    worlds of the engine (materialized as :class:`ImplRun` makes them, whose moves and KV
    flips it keeps)."""

    #: whether a forward that replays a CUDA graph in SGLang replays one here (False: it runs
    #: eagerly, SGLang's Python afresh on the live batch; for the self-tests)
    replays_graphs = True
    #: whether ``EXTEND`` and ``MIXED`` forwards run as a server with breakable prefill graphs
    #: runs them: the canary on the prefill graph runner's replay batch
    #: (:mod:`conformance.sglang.prefill_graphs`)
    prefill_graphs = False
    #: the draft model's tokens a request in each draft decode step (EAGLE's ``topk``; 1: a
    #: chain), :meth:`tree_draft`
    draft_topk = 1
    #: where the history stopped because the release's server cannot start (run_history)
    cannot_start: ServerCannotStart | None = None

    def __init__(self, engine: Engine, reference_run: OracleRun, *, capture: bool = True):
        mods = loading.manager_modules()
        super().__init__(mods.adapter, torch.device("cpu"), engine, reference_run.states)
        self.mods = mods
        self.config = self._canary_config()
        self.device_state = self._device_state()
        self.groups = self._buffer_groups()
        self.endpoints = tuple(
            e
            for group in self.groups
            for e in mods.endpoint.build_endpoints_from_group(
                group=group, device_state=self.device_state
            )
        )
        self.steps = 0
        self.sweeper = mods.sweep.SweepOrchestrator(
            config=self.config, device_state=self.device_state, buffer_groups=self.groups,
            endpoints=self.endpoints, swa_window_size=engine.config.swa_window,
            outer_step_counter_getter=lambda: self.steps,
        )  # fmt: skip
        self.fired: Counter = Counter()
        self.step_counts: Counter = Counter()  # the steps run, by step label (run_history)
        self.step_labels: set[str] = set()  # the step labels run here, histories or trials
        self.pending: list[str] = []  # what differed in the step's plans, for compare
        self.plans_compared = 0
        self.divergent = 0  # SGLang's reports of the divergence [20]
        self.not_managed: Counter = Counter()  # forwards SGLang never makes, by mode
        self.d2h_stream = torch.cpu.Stream()  # SGLang's stream for host copies, on the CPU
        self.managers: dict = {}
        self.graphs: dict = {}  # a captured graph per manager capacities and mode (graphs.py)
        self.token_unchecked = 0  # verify entries a replayed graph leaves unchecked ([21])
        self.unchecked_by_mode: Counter = Counter()  # the same, by the graph's capture mode
        self.token_dues = 0  # fault dues whose TOKEN bit a replayed graph cannot report ([21])
        self.oracle = EngineTokenOracle(engine)  # one token table, refreshed every forward
        # the host side: SGLang's ViolationManager drains the ring one step late and its
        # ViolationReporter logs each new row (mode LOG), caught here
        self.violations = mods.violations.ViolationManager(
            config=self.config, device_state=self.device_state, d2h_stream=self.d2h_stream,
            outer_step_counter_getter=lambda: self.steps,
        )  # fmt: skip
        self.logged: list[str] = []
        if capture:  # a PD transfer's prefill engine logs into its decode engine's list
            handler = logging.Handler()
            handler.emit = lambda record: self.logged.append(record.getMessage())  # type: ignore[method-assign]
            reporter_log = logging.getLogger(mods.reporter.__name__)
            reporter_log.handlers = [handler]
            reporter_log.propagate = False

    def _canary_config(self):
        """SGLang's ``CanaryConfig`` of the engine, made by its own ``from_env`` from the
        options a server of the engine runs with (``--kv-canary log``, the engine's real-KV
        mode, a sweep every step; the ring of the suite's world, no stats log, and the input
        and token asserts of the engine)."""
        c = self.engine.config
        return loading.canary_config(
            self.mods.config,
            options={
                "kv_canary": "log",
                "kv_canary_real_data": self.mods.adapter.RealKvHashMode(c.mode).name,
                "kv_canary_sweep_interval": 1,
            },
            env={
                "SGLANG_KV_CANARY_RING_CAPACITY": self.made.violation_ring.shape[0],
                "SGLANG_KV_CANARY_STATS_PRINT_EVERY_N_STEPS": 0,
                "SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT": c.write_input_assert,
                "SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT": self.engine.pool is not None,
            },
        )

    def _device_state(self):
        """SGLang's ``CanaryDeviceState`` over the suite's ring, write index and pool."""
        state_mod = self.mods.state
        tags = len(self.mods.adapter.CanaryLaunchTag)
        return state_mod.CanaryDeviceState(
            violation_log=state_mod.ViolationLog(
                violation_ring=self.made.violation_ring,
                violation_write_index=self.made.violation_write_index,
            ),
            kernel_run_counters=torch.zeros(tags, dtype=torch.int64),
            slot_run_counters=torch.zeros(tags, dtype=torch.int64),
            enable_chain_position_assert=torch.ones(1, dtype=torch.int32),
            req_to_verify_expected_tokens=self.pool,
        )

    def _buffer_groups(self) -> tuple:
        """SGLang's ``CanaryBufferGroup`` of each group: the K half's head and tail buffers and
        one KV source of the group's pool."""
        bg, adapter, c = self.mods.buffer_group, self.mods.adapter, self.engine.config
        return tuple(
            bg.CanaryBufferGroup(
                kind=bg.PoolKind[g],
                k_head=self.canary_buf((g, HEAD)), k_tail=self.canary_buf((g, TAIL)),
                v_head=None, v_tail=None,
                real_kv_sources_k=(adapter.RealKvSource(
                    tensor=self.kv(g), page_size=1, num_bytes_per_token=self.kv(g).shape[1],
                    read_bytes=self.kv(g).shape[1],
                ),),
                real_kv_sources_v=(),
                swa_index_lut=None if g == FULL else self.lut,
                kv_token_id_vs_position_offset=c.offset,
            )
            for g in c.groups
        )  # fmt: skip

    def key(self, forward: Forward) -> tuple[int, int, int, bool]:
        """``forward``'s manager capacities: verify entries, rows, tokens, and whether it is the
        draft model's."""
        return (
            max(g.verify_capacity for g in forward.groups), forward.write_req_capacity,
            max(1, len(forward.write["positions"])), self.engine.config.offset == 1,
        )  # fmt: skip

    def manager(self, forward: Forward, key: tuple | None = None):
        """The ``SingleForwardManager`` of ``forward``'s capacities (one per size, as SGLang
        keeps one per captured batch size; ``key``: other capacities), made on first use."""
        key = self.key(forward) if key is None else key
        if key not in self.managers:
            self.managers[key] = self._new_manager(*key)
            self.managers[key].phase_checker.enable_assert()
        return self.managers[key]

    def _new_manager(self, verify: int, reqs: int, entries: int, draft: bool):
        mods = self.mods
        c = self.engine.config
        # what SGLang's ModelRunner gives the runner: none to a draft worker from 0.5.18 ([22])
        token_oracle = (
            mods.token_oracle.oracle_manager.TokenOracleManager(oracle=self.oracle)
            if wiring.runner_gets_token_oracle(draft)
            else None
        )
        return mods.manager.SingleForwardManager(
            config=self.config, device=self.device, device_state=self.device_state,
            buffer_groups=self.groups, endpoints=self.endpoints,
            req_to_token_pool=types.SimpleNamespace(req_to_token=self.table),
            swa_window_size=c.swa_window,
            per_forward_verify_capacity=verify, per_forward_write_req_capacity=reqs,
            per_forward_write_entry_capacity=entries,
            d2h_stream=self.d2h_stream, token_oracle_manager=token_oracle,
            swa_divergence_report=None, is_eagle_draft_decode=draft,
        )  # fmt: skip

    def forward(self, forward: Forward) -> Forward | None:
        """``forward`` through SGLang's runtime: eagerly, or a DECODE, IDLE or TARGET_VERIFY one
        by a replay of its captured graph (:meth:`replay`); the forward as SGLang ran it, for the
        reference (None: a forward SGLang never makes, not run)."""
        batches = manager_batches(forward, self.mods)
        if batches is None:
            return None
        outside, inside = batches
        if self.draft_topk > 1 and forward.kind == "draft_decode" and forward.mode != IDLE:
            self.tree_draft(forward, outside, inside)
        self.table.copy_(torch.from_numpy(forward.plan["req_to_token"]))
        lut = forward.groups[-1].full_to_swa_index_mapping
        if lut is not None:
            self.lut.copy_(torch.from_numpy(lut))
        self.oracle.refresh()
        if forward.graph and self.replays_graphs:
            return self.replay(forward, outside, inside)
        key = self.key(forward)
        if self.prefill_graphs and forward.mode in (EXTEND, MIXED):
            inside = prefill_graphs.replay_batch(inside) or inside
            # SGLang sizes the manager for the runner's largest batch: the padded one fits
            key = (*key[:2], int(inside.positions.shape[0]), key[3])
        manager = self.manager(forward, key)
        with loading.cpu_only():
            manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=outside)
            made = manager.pre_ops_maybe_inside_graph(inside)
            self.pending += self.plan_problems(forward, manager, made)
            self.model(forward, inside.positions)
            manager.post_ops_maybe_inside_graph(inside, made)
            manager.post_ops_outside_graph()
        return forward

    def model(self, forward: Forward, positions: torch.Tensor) -> None:
        """The forward's own work between the ``HEAD`` and ``TAIL`` launches: it stores its KV,
        and moves the positions it reads in place (``positions``: the batch's)."""
        for group in forward.groups:
            self.store_kv(group)
        if forward.tail_write:
            moved = int64_tensor(forward.tail_write["positions"])
            positions[: moved.shape[0]].copy_(moved)

    def replay(self, forward: Forward, outside, inside) -> Forward:
        """A forward that replays a CUDA graph: the graph of its manager and mode (the runner's
        capture mode, :func:`graphs.capture_mode`: the decode graph runner's ``TARGET_VERIFY``
        for a target verify, else its ``DECODE``; the draft model's draft decode and draft
        extend runners' for its forwards) captured on first use
        (:func:`conformance.sglang.graphs.capture`), then replayed over the live batch; the
        forward as the captured graph plans it (:func:`graphs.replayed_forward`). One manager
        of the draft model's capacities replays every step of its multi-step draft decode,
        where SGLang keeps one a step (``single_forward_indices``): each step's capture records
        the same operations, over a capture batch of the same fields."""
        key = self.key(forward)
        mode = graphs.capture_mode(forward, draft=key[3])
        if (key, mode) not in self.graphs:
            try:
                self.graphs[key, mode] = graphs.capture(
                    self, self._new_manager(*key), key[1], key[2], mode
                )
            except AttributeError as error:
                if mode == DRAFT_EXTEND_V2 and upstream.reproduces_on(
                    CAPTURE_WITHOUT_RIDS, upstream.installed_version()
                ):
                    raise ServerCannotStart(CAPTURE_WITHOUT_RIDS, mode, error) from error
                raise
        captured = self.graphs[key, mode]
        replayed = graphs.replayed_forward(forward, captured)
        pool = None if self.pool is None else self.pool.numpy().copy()

        def model(made, positions: torch.Tensor) -> None:
            manager = captured.manager
            self.pending += self.plan_problems(replayed, manager, made, captured.input_assert)
            unchecked = graphs.unchecked_tokens(forward, replayed, manager._verify_capacity, pool)
            self.token_unchecked += unchecked
            self.unchecked_by_mode[mode] += unchecked
            self.model(forward, positions)

        graphs.replay(self, captured, forward, outside, inside, model)
        return replayed

    def run(self, reference_run: OracleRun, step) -> None:
        """One step on SGLang's runtime and on the reference, then their states compared; a
        step of a PD transfer's prefill engine on that engine's sides."""
        if getattr(step, "engine", "") == PREFILL_ENGINE:
            peer = reference_run.peer_run()
            if self.peer is None:
                assert self.engine.peer is not None
                self.peer = ManagerRun(self.engine.peer, peer, capture=False)
                self.peer.host = self.host
            self.peer.run_here(peer, step)
        else:
            self.step_labels.add(str(histories.step_label(step)))
            self.run_here(reference_run, step)

    def run_here(self, reference_run: OracleRun, step) -> None:
        since, mine_since = reference_run.index, self.index()
        ran = step
        if isinstance(step, Move):
            driver.move(self, step)
        elif isinstance(step, Sweep):
            self.sweep_step(step)
        elif self.idle_not_laid_out(step):
            return
        else:
            ran = self.forward(step)
        if ran is None:
            # a forward SGLang never makes (padding rows amid a batch outside a replayed
            # graph): the suite's own launches of it on SGLang's kernels, on both sides
            self.not_managed[step.mode] += 1
            driver.run_step(self, reference_run, step, what=lambda launch: launch, config="")
            return
        ReferenceSide.forward_or_sweep(reference_run, ran)
        self.compare(reference_run, since, mine_since, step)
        with loading.cpu_only():
            self.violations.step()

    def tree_draft(self, forward: Forward, outside, inside) -> NoReturn:
        """A step of the draft model's multi-step draft as EAGLE drafting a tree gives it to the
        canary (:func:`tree.widen`: each request's position :attr:`draft_topk` times): replaying
        a graph, SGLang's capture of the draft decode graph at that width, else the manager's
        eager pre-ops on the live batch. SGLang's plan input raises there ([29]); where it does
        not, this raises ``AssertionError``: the leg does not model a tree's draft decode past
        the plan input (the branches' slots)."""
        k = self.draft_topk
        wide_out, wide_in = tree.widen(outside, k), tree.widen(inside, k)
        verify, reqs, tokens, draft = self.key(forward)
        key = (verify, reqs, tokens * k, draft)
        if forward.graph and self.replays_graphs:
            graphs.capture(self, self._new_manager(*key), reqs, tokens * k, DRAFT_DECODE.name)
        else:
            manager = self.manager(forward, key)
            with loading.cpu_only():
                manager.pre_ops_outside_graph(maybe_inaccurate_forward_batch=wide_out)
                manager.pre_ops_maybe_inside_graph(wide_in)
        raise AssertionError(
            f"a draft decode step of {k} tokens a request ran through SGLang's canary: the leg "
            "does not model a tree's draft decode past its plan input ([29] fixed?)"
        )

    def idle_not_laid_out(self, step) -> bool:
        """Whether ``step`` is an idle step of one of EAGLE's runners (a graph other than
        ``DECODE``) in a run that replays no graph: run eagerly, SGLang's batch has no row,
        which the leg does not lay out, so neither side runs it: SGLang's canary, run on a
        batch of no row, changes no record, ring row or slot counter, only launch counters
        (``test_an_eager_idle_step_changes_nothing_in_sglang_s_canary``)."""
        return (
            not self.replays_graphs
            and step.mode == IDLE
            and graphs.capture_mode(step, draft=self.engine.config.offset == 1) != DECODE
        )

    def sweep_step(self, step: Sweep) -> None:
        """SGLang's ``SweepOrchestrator`` at a sweep of the engine, over the stand-in prefix
        cache whose walk is the engine model's (every slot its cached prefixes hold)."""
        self.table.copy_(torch.from_numpy(self.engine.req_to_token))
        if self.lut is not None:
            self.lut.copy_(torch.from_numpy(self.engine.lut))
        self.sweeper.attach_radix_cache(swept_cache(self.table, step))
        self.steps += 1
        self.sweeper.maybe_run_sweep()

    def plan_problems(
        self, forward: Forward, manager, made, input_assert: bool | None = None
    ) -> list[str]:
        """SGLang's plans of each group and its expected inputs against the reference's for
        ``forward``: the reference's plan at the same capacities over the same page table,
        SWA table and expected-token pool (their valid entries compared); the expected inputs,
        where the input assert is on (``input_assert``: as a captured graph decided it), against
        the engine model's (but for [20])."""
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
        lines += self.expected_input_problems(forward, manager, made, input_assert)
        self.plans_compared += len(forward.groups)
        return lines

    def expected_input_problems(
        self, forward: Forward, manager, made, on: bool | None = None
    ) -> list[str]:
        """SGLang's expected inputs against the engine model's, where its input assert is on
        (``on``; None: as the manager decides for ``forward``), but for [20]."""
        write = forward.write
        if on is None:
            on = manager._should_enable_write_input_assert_for_launch(forward_batch(forward))
        n = len(write["positions"])
        if (
            not on
            or write["expected_input_tokens"] is None
            or (forward.mode == DRAFT_EXTEND_V2 and self.engine.config.offset == 1)
        ):
            return []
        lines = []
        live = np.asarray(forward.plan["req_pool_indices"])[forward.token_rows] != 0
        tokens = made.expected_inputs.tokens[:n].numpy()[live]  # padding rows write nothing
        if not np.array_equal(tokens, np.asarray(write["expected_input_tokens"])[live]):
            lines.append("expected input tokens differ from the engine model's")
        if not np.array_equal(made.expected_inputs.positions[:n].numpy(), write["positions"]):
            lines.append("expected input positions differ from the forward's")
        return lines

    def index(self) -> int:
        return int(self.made.violation_write_index[0])

    def compare(self, reference_run: OracleRun, since: int, mine_since: int, step) -> None:
        """SGLang's state against the reference's after ``step``: every endpoint's canary
        buffer, the reports each made during the step (as sets of rows: the order of a launch's
        rows is not the contract's), the expected-token pool and each tag's run counters (less
        what the graphs' captures counted: :meth:`warm_up`).
        SGLang's reports of the divergence [20] (:func:`draft_extend_reports`) are counted in
        ``divergent`` and left out."""
        what = f"step {self.engine.steps} ({self.engine.log[-1]})"
        lines = []
        for key, state in reference_run.states.items():
            if key[1] == SWEEP:
                continue
            diff = np.argwhere(self.canary_buf(key).numpy() != state.canary_buf)
            if len(diff):
                slots = sorted(set(diff[:, 0].tolist()))[:6]
                lines.append(f"{TAGS[key].name}'s canary buffer differs at slots {slots}")
        lines += self.report_problems(reference_run, since, mine_since, step)
        if self.pool is not None and not np.array_equal(self.pool.numpy(), reference_run.pool):
            lines.append("the expected-token pool differs")
        for key, state in reference_run.states.items():
            tag = int(TAGS[key])
            for name in ("slot_run_counter", "kernel_run_counter"):
                got = int(getattr(self.device_state, name + "s")[tag]) - self.warm_up(name, tag)
                want_n = int(getattr(state, name)[0])
                if got != want_n:
                    lines.append(f"{TAGS[key].name} {name}: SGLang {got}, the reference {want_n}")
        lines += self.pending
        self.pending = []
        assert not lines, f"{what}: " + "; ".join(lines)

    def warm_up(self, name: str, tag: int) -> int:
        """The launches (``kernel_run_counter``) or slots (``slot_run_counter``) of tag ``tag``
        that the graphs' captures counted: SGLang's warm-up runs before serving, which the
        reference never makes."""
        return sum(int(c.warm_up[name + "s"][tag]) for c in self.graphs.values())

    def report_problems(self, reference_run: OracleRun, since: int, mine_since: int, step):
        """SGLang's reports of ``step`` against the reference's, as sets of rows (but for
        [20]); each of SGLang's counted in ``fired`` by the step's label, tag and reasons."""
        ring = self.made.violation_ring.numpy()
        mine = ring[mine_since : min(self.index(), len(ring))]
        want = reference_run.rows(since)
        if isinstance(step, Forward):
            # where SGLang's input assert fires on every token, the reports of that check
            # are compared on neither side
            known = draft_extend_reports(self.engine, step, mine)
            self.divergent += int(known.sum())
            mine = mine[~known]
            want = want[~draft_extend_reports(self.engine, step, want)]
        for row in mine:
            self.fired[(str(histories.step_label(step)), int(row[KIND]), int(row[BITS]))] += 1
        if len(mine) != len(want) or not np.array_equal(
            np.unique(mine, axis=0), np.unique(want, axis=0)
        ):
            return [
                f"reports: SGLang {len(mine)} {mine[:2].tolist()}, "
                f"the reference {len(want)} {want[:2].tolist()}"
            ]
        return []


def logged_problems(side: ManagerRun) -> list[str]:
    """After the last step: SGLang's host side drained (two more pumps: its copy of the write
    index runs one step late), every row of its ring must have been logged once by its
    ``ViolationReporter``, with its launch tag, reasons, slot and position, and nothing else."""
    with loading.cpu_only():
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


def sides(config: EngineConfig) -> tuple[Engine, OracleRun, ManagerRun]:
    """An engine of ``config``, its reference run and its run on SGLang's runtime."""
    engine = Engine(config)
    reference_run = OracleRun(engine)
    return engine, reference_run, ManagerRun(engine, reference_run)


#: ``docs/UPSTREAM.md``'s divergence [28]: up to 0.5.17, with the input assert on, the draft
#: extend graph's capture raises in the token oracle manager (no ``rids_int``).
CAPTURE_WITHOUT_RIDS = 28


class ServerCannotStart(Exception):
    """A graph capture raised as a divergence of ``docs/UPSTREAM.md`` says it raises on the
    installed release: SGLang's server of that configuration, which captures its graphs at
    startup, does not start (the tag, the captured mode, SGLang's exception)."""

    def __init__(self, tag: int, mode: str, error: BaseException):
        super().__init__(f"[{tag}] capturing {mode}: {type(error).__name__}: {error}")
        self.tag, self.mode, self.error = tag, mode, error


def run_history(index: int, steps: int = histories.STEPS) -> ManagerRun:
    """History ``index`` of :func:`conformance.sglang.histories.history`, with the events its
    server makes (:func:`histories.served_scheduling`: under EAGLE or without it, the engine
    as that server runs it, :func:`wiring.servable`), on SGLang's runtime and the reference,
    compared after every step (an ``AssertionError`` names the first step where they differ);
    the runtime side, with its counts. Where a graph's capture raises as a divergence says it
    does on the installed release, the history stops there (:attr:`ManagerRun.cannot_start`):
    such a server does not start."""
    eagle = histories.speculative(index)
    engine, reference_run, side = sides(wiring.servable(histories.engine_config(index), eagle))
    run = functools.partial(side.run, reference_run)

    def counted(step) -> None:
        run(step)
        side.step_counts[str(histories.step_label(step))] += 1

    try:
        histories.history(index, steps, run=counted, engine=engine,
                          scheduling=histories.served_scheduling(index))  # fmt: skip
    except ServerCannotStart as stop:
        side.cannot_start = stop
    if reference_run.index or side.index() != side.divergent:
        raise AssertionError(f"history {index}: a correct history reported")
    logged = logged_problems(side)
    assert not logged, f"history {index}: {logged}"
    return side


#: The draft model's history that :func:`draft_input_assert_refusal` runs (one with the offset).
DRAFT_HISTORY = 6


def draft_input_assert_refusal(index: int = DRAFT_HISTORY) -> str | None:
    """The draft model's history ``index`` (the EAGLE offset) with the write's input assert on,
    each manager given what SGLang's ``ModelRunner`` gives a draft worker
    (:func:`wiring.runner_gets_token_oracle`): the ``RuntimeError`` SGLang's runtime raises
    (the step and the message), or None when the history runs through ([22])."""
    served = wiring.servable(histories.engine_config(index, eagle_offset=1))
    engine, reference_run, side = sides(dataclasses.replace(served, write_input_assert=True))
    try:
        histories.history(index, histories.STEPS, run=functools.partial(side.run, reference_run),
                          engine=engine, scheduling=histories.served_scheduling(index))  # fmt: skip
    except RuntimeError as error:
        return f"step {engine.steps} ({engine.log[-1]}): {error}"
    return None
