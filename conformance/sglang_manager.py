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
settle in each of :data:`engine_model.vocabulary.SETTLE_MODES`, in the draft model's own
forwards, and in a target verify replaying a graph, ``MANAGER_SETTLE_MODES``), and requires the
same reports of both, where the class predicts them. From
the reports SGLang's runtime makes it counts which of its checks fired in which forward mode
(``conformance.sglang.fired``; ``conformance/README.md`` keeps today's table, with why each
cell that never fires cannot).

Each manager gets the token oracle SGLang's ``ModelRunner.init_token_oracle`` gives its runner
(``conformance.sglang.wiring``, run from the release's source): from 0.5.18 a draft worker gets
none, and the draft model's canary with the write's input assert on raises at its first forward
that is not a decode ([22] of ``docs/UPSTREAM.md``, which the leg shows once on a draft model's
history and expects where [22]'s script reproduces it); the draft model's histories and trials
then run with the assert off, as an EAGLE server must, and without a cache sweep: SGLang's
scheduler attaches its radix cache to the target model's canary alone (``wiring.servable``,
``wiring.radix_cache_owner``), so a fault trial of the draft model promises no report a sweep
would make (``conformance.engine_support.swept_dues``). Every history and trial is of one
configuration SGLang serves (``histories.served_scheduling``): the target model's without
speculative decoding, or under EAGLE (target verifies, the input assert as the draft's runner
allows it: the setting is the server's), or the draft model's.

One place is left out of the comparison, counted: SGLang's reports of the divergence [20] of
``docs/UPSTREAM.md`` (the draft model's draft extend, where its runner has a token oracle and
so its input assert on), on both sides. And one divergence
changes what the reference is given, counted: a replayed graph's captured ``PlanInput`` takes
no expected-token valid lengths ([21]), so the reference plans a replayed step with those
lengths 0, as the graph does (the verify entries whose token goes unchecked are counted), and
a fault settled by replays is judged without the ``TOKEN`` bit its class predicts
(``graphs.graph_dues``); both are expected on the releases [21]'s script reproduces on.

After every step SGLang's host side runs too: ``runner/violation_manager.py``
(``ViolationManager``, which copies the write index to the host one step late) and
``runner/violation_reporter.py`` (mode ``LOG``: a message per new row of the ring); at the end
of each history and trial every row of the ring must have been logged once, with its launch
tag, reasons, slot and position (``logged_problems``). And a flipped KV byte of a cached
slot no request uses is read by an extend that shares the prefix (``shared_prefix_trial``):
``REAL_KV`` in ``EXTEND``, through SGLang's runtime.

What runs of SGLang: the modules above, its ``state.py``, ``config.py``, ``buffer_group.py``,
``token_oracle/`` (``TokenOracleManager`` with its ``HashOracle``), ``plan_input.py``,
``runner/enable_warner.py`` and ``runner/future_tensor.py``, ``utils/phase_checker.py``
(``SimplePhaseChecker``, its Triton kernel interpreted), and its kernels' launchers as the
suite's adapter runs them on the CPU (``conformance/adapters/sglang.py``: SGLang's launchers,
their torch references where a release has no CPU path, its Triton kernels interpreted).
What stands in for the rest of SGLang, each in ``loading.manager_modules``:

- ``sglang.srt.utils``: ``is_device_stream_capturing`` (False: nothing captures on the CPU, as
  SGLang's own says for a CPU device), and ``utils.common.flatten_arrays_to_int64_tensor`` with
  the function it calls, executed from SGLang's own source in ``utils/common.py`` (whose module
  imports the serving stack);
- ``sglang.srt.runtime_context`` (``get_observability``): the leg's ``CanaryConfig`` is made by
  SGLang's own ``CanaryConfig.from_env`` from the options a server of the engine runs with
  (``loading.canary_config``: ``--kv-canary log``, the engine's real-KV mode, a sweep every
  step, and every environment variable ``from_env`` reads set), the options given where the
  release reads them (``get_observability()`` from 0.5.20, the server args before);
- pinned host memory: this CPU build of torch has no pinned allocator, so while SGLang's code
  runs, ``pin_memory=True`` asks for ordinary host memory, and the stream, event and capture
  calls of ``torch.cuda`` that older releases make are ``torch.cpu``'s (``cpu_only``: exactly
  the calls the runtime's source makes, read by ``loading.torch_device_calls``);
- ``ForwardBatch``: ``ManagerBatchStandIn``, the fields of ``ForwardBatchStandIn`` and those
  the manager reads besides (``batch_size``, ``out_cache_loc``, ``req_all_ids_flat``); a
  replayed graph's batch outside the graph holds its live rows only;
- SGLang's decode graph runner (``conformance.sglang.graphs``): a ``DECODE``, ``IDLE`` or
  ``TARGET_VERIFY`` step that SGLang runs as a CUDA graph replay (``ForwardMode.is_cuda_graph``)
  replays here a graph of the manager's inside-the-graph ops (``conformance.graph_capture``),
  captured once per batch size and mode (``DECODE``, which an idle step replays too, or, as a
  speculative server's runner captures it, ``TARGET_VERIFY`` with its draft count, which the
  target model's idle steps replay there) on the batch
  the runner's ``capture_prepare`` builds (its static buffers, every row padding, ``seq_lens``
  the fill value, only the fields its ``ForwardBatch(...)`` call passes, read from the
  release's source, and in ``TARGET_VERIFY`` a ``spec_info`` holding the one field of
  ``get_spec_info``'s that the canary reads, ``draft_token_num``), after one warm-up run and
  with the phase checker's and chain position asserts off, as at SGLang's startup, every kernel
  launch recorded as one operation; each replay copies the live batch into the static buffers
  padded as the runner's registry pads them (``fill_from``), then runs only what was recorded,
  the model's KV store eager between the two graphs and ``pre_ops_outside_graph`` and
  ``post_ops_outside_graph`` eager around them. The capture's launches (SGLang's warm-ups) are
  counted apart from the run counters the reference is compared with;
- the token oracle (``HashOracle``): ``EngineTokenOracle``, the engine model's tokens as one
  table gathered by tensor work alone, as ``HashOracle`` computes, refreshed in place before
  every forward, so that a replayed graph answers afresh;
- the phase checker's kernel runs interpreted with the ``debug`` SGLang's decorator gives it,
  so that its device assert raises as on a GPU (Triton's interpreter would only print it);
- ``ReqToTokenPool``: its ``req_to_token``, the engine's page table; the prefix cache: the
  sweep leg's ``RadixCacheStandIn``; ``Req`` (for ``compute_req_all_ids_info``): each running
  request's tokens as ``origin_input_ids``.

The buffer groups are SGLang's ``CanaryBufferGroup`` over the suite's world of each engine
(``conformance.engine_support.oracle_world``: per group a head and a tail canary buffer, one
KV source of 32 bytes a slot; the K half only, as SGLang runs without
``SGLANG_KV_CANARY_ENABLE_MHA_V``), and the manager is built with the capacities of each
forward (one verify capacity for both groups, as SGLang sizes it: the larger group's).

This module is the leg's command line; its parts are the modules of :mod:`conformance.sglang`:
SGLang's runtime beside the reference in ``manager_run.py``, the fault trials in ``trials.py``,
the table of fired checks in ``fired.py``, the stand-ins in ``standins.py``, SGLang's modules
loaded by ``loading.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter

from conformance import upstream
from conformance.sglang import loading, memory, wiring
from conformance.sglang.fired import fired_table, readme_never_cells, table_problems
from conformance.sglang.histories import REQUIRED
from conformance.sglang.manager_run import (
    ServerCannotStart,
    draft_input_assert_refusal,
    logged_problems,
    run_history,
)
from conformance.sglang.trials import fault_trial, shared_prefix_trial
from engine_model import faults
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    DRAFT_EXTEND_V2,
    DRAFT_SETTLE_MODES,
    MANAGER_SETTLE_MODES,
    MOVE_STEP,
    SETTLE_MODES,
    SWEEP_STEP,
    TARGET_VERIFY,
)

__all__ = ["HISTORIES", "SHARED_PREFIX_TRIALS", "TRIALS", "main"]

#: Histories the leg runs by default, and fault trials a class and settle mode.
HISTORIES = 12
TRIALS = 2
#: Shared-prefix trials per fault trial a class and settle mode.
SHARED_PREFIX_TRIALS = 4
#: The divergence of ``docs/UPSTREAM.md`` whose reports the leg leaves out, counted.
DRAFT_EXTEND_DIVERGENCE = 20
#: The divergence of ``docs/UPSTREAM.md`` whose checks a replayed graph never makes, counted.
GRAPH_TOKEN_DIVERGENCE = 21
#: The divergence of ``docs/UPSTREAM.md`` that stops the draft model's canary with the input
#: assert on (its runner has no token oracle), shown once.
DRAFT_RUNNER_DIVERGENCE = 22


def _positive(text: str) -> int:
    """A count of at least 1 (0 would let the leg pass without running it)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


#: The graphs the leg captures (``graphs.CAPTURES``), and the steps that replay each.
GRAPHS_REPLAYED_BY = {
    DECODE: "DECODE and IDLE steps",
    TARGET_VERIFY: "target verifies and the target model's IDLE steps under EAGLE",
    DRAFT_DECODE.name: "the draft model's draft decode and IDLE steps",
    DRAFT_EXTEND_V2: "its draft extends and IDLE steps",
}


def _correct_histories(histories: int) -> tuple[list[str], Counter]:
    """The first ``histories`` correct histories through SGLang's runtime, printed: the step
    labels they never reached, and the counts of the divergences ([20]: SGLang's reports of
    it; [21]: the verify entries a replayed graph left unchecked)."""
    step_counts: Counter = Counter()
    counts: Counter = Counter()
    not_managed: Counter = Counter()
    stopped: list[str] = []
    for index in range(histories):
        side = run_history(index)
        if side.cannot_start is not None:
            stopped.append(f"history {index} at its first {side.cannot_start}")
            counts[f"cannot capture {side.cannot_start.mode}"] += 1
        step_counts.update(side.step_counts)
        not_managed.update(side.not_managed)
        counts.update(
            plans=side.plans_compared,
            **{str(DRAFT_EXTEND_DIVERGENCE): side.divergent,
               str(GRAPH_TOKEN_DIVERGENCE): side.token_unchecked},
        )  # fmt: skip
        for (_, mode), captured in side.graphs.items():
            counts.update({f"graphs {mode}": 1, f"replays {mode}": captured.replays})
        counts.update({f"unchecked {m}": n for m, n in side.unchecked_by_mode.items()})
    print(f"{histories} correct histories, equal after every step, silent:")
    print(f"  pages and pool rows chosen by: {memory.allocators()[1]}")
    print(
        f"  stopped where SGLang's server would not start ({len(stopped)}): "
        + ("; ".join(stopped) or "none")
    )
    for name, n in sorted(step_counts.items()):
        print(f"  {name}: {n}")
    print(f"  plans of a group and expected inputs equal the reference's: {counts['plans']}")
    print(
        f"  forwards SGLang never makes (run by the suite's launches): {sum(not_managed.values())}"
    )
    labels = (*REQUIRED, str(SWEEP_STEP), str(MOVE_STEP))
    print(
        f"  SGLang's reports of the divergence [20] (draft extend, EAGLE offset): "
        f"{counts[str(DRAFT_EXTEND_DIVERGENCE)]}"
    )
    for name, replayed_by in GRAPHS_REPLAYED_BY.items():
        print(
            f"  {name} graphs captured (a manager's capacities each, per history): "
            f"{counts['graphs ' + name]}, replayed by {replayed_by}: {counts['replays ' + name]}"
        )
    print(
        f"  verify entries whose token a replayed graph's plan leaves unchecked, the divergence "
        f"[21]: {counts[str(GRAPH_TOKEN_DIVERGENCE)]} ("
        + ", ".join(f"{name} graphs {counts['unchecked ' + name]}" for name in GRAPHS_REPLAYED_BY)
        + ")"
    )
    return [label for label in labels if not step_counts[label]], counts


def _fault_trials(trials: int) -> tuple[Counter, list[str]]:
    """``trials`` fault trials of every class in every settle mode, and the shared-prefix
    trials, printed: the checks SGLang's runtime fired, and the problems."""
    settle_modes = (*SETTLE_MODES, *DRAFT_SETTLE_MODES, *MANAGER_SETTLE_MODES)
    fired: Counter = Counter()
    outcomes: Counter = Counter()
    problems = []
    token_dues = 0
    for fault_class in faults.FAULTS:
        for settle_mode in settle_modes:
            for t in range(trials):
                index = t * len(settle_modes) + settle_modes.index(settle_mode)
                try:
                    outcome, lines, side = fault_trial(fault_class, index, settle_mode)
                except ServerCannotStart as stop:  # raised only where the divergence says
                    outcomes[
                        (fault_class, f"not run, such a server does not start [{stop.tag}]")
                    ] += 1
                    continue
                outcomes[(fault_class, outcome)] += 1
                fired.update(side.fired)
                token_dues += side.token_dues
                problems += [f"{fault_class} {settle_mode} trial {t}: {line}" for line in lines]
    for index in range(trials * SHARED_PREFIX_TRIALS):  # a cached byte read by a sharing extend
        side = shared_prefix_trial(index)
        fired.update(side.fired)
        problems += [f"shared prefix trial {index}: {x}" for x in logged_problems(side)]
    print("fault trials (each class, each settle mode), SGLang's reports equal to the reference's:")
    for fault_class in faults.FAULTS:
        print(
            f"  {fault_class}: "
            + ", ".join(f"{o} {n}" for (k, o), n in sorted(outcomes.items()) if k == fault_class)
        )
    print(f"  predicted reports whose TOKEN a replayed graph cannot make, [21]: {token_dues}")
    print("checks SGLang's runtime fired, reports per forward mode (fault trials):")
    for line in fired_table(fired):
        print("  " + line)
    return fired, problems


def _upstream_problems(fired: Counter, counts: Counter) -> list[str]:
    """The README's table of fired checks, on the release it was made on (a cell it says cannot
    fire never does, and every other cell fires), and [20] and [21] as expectations: present on
    the releases their scripts reproduce on ([20] only where an EAGLE server runs the input
    assert, :func:`conformance.sglang.wiring.eagle_input_assert`) (for [21], in the replays of
    every graph the leg captures, :data:`GRAPHS_REPLAYED_BY`, but one whose capture a divergence
    stops), so that a fix upstream shows as an unexpected pass, and absent elsewhere."""
    problems = []
    version = upstream.installed_version()
    release, cannot = readme_never_cells()
    if release == version:
        problems += table_problems(fired, cannot)
    for tag, what in ((DRAFT_EXTEND_DIVERGENCE, "reports"), (GRAPH_TOKEN_DIVERGENCE, "entries")):
        expected = upstream.reproduces_on(tag, version)
        if tag == DRAFT_EXTEND_DIVERGENCE and expected:  # the draft's assert, as served
            expected = wiring.eagle_input_assert()
        seen = counts[str(tag)]
        if expected is not None and (seen > 0) != expected:
            problems.append(
                f"[{tag}] {'expected but not seen' if expected else 'seen but not expected'} "
                f"on sglang {version}: {seen} {what}"
            )
    if upstream.reproduces_on(GRAPH_TOKEN_DIVERGENCE, version):  # in every graph captured
        problems += [
            f"[{GRAPH_TOKEN_DIVERGENCE}] expected but not seen in {mode} replays on sglang {version}"
            for mode in GRAPHS_REPLAYED_BY
            if not counts[f"unchecked {mode}"] and not counts[f"cannot capture {mode}"]
        ]
    return problems


def _draft_refusal_problems() -> list[str]:
    """The draft model's history with the write's input assert on, its runner wired as SGLang's
    ``ModelRunner`` wires it, printed: the ``RuntimeError`` of [22] where its script reproduces
    it, the capture that stops such a server where [28] does (the leg runs EAGLE's histories
    with the assert off in both cases, as a server must), else none."""
    oracle = "a token oracle" if wiring.runner_gets_token_oracle(True) else "no token oracle"
    try:
        refusal = draft_input_assert_refusal()
    except ServerCannotStart as stop:  # raised only where the divergence reproduces
        print(f"the draft model's canary with the input assert on, its runner given {oracle}: "
              f"such a server does not start, {stop}")  # fmt: skip
        return []
    print(f"the draft model's canary with the input assert on, its runner given {oracle} as "
          f"SGLang's ModelRunner gives it: {refusal or 'runs through'}")  # fmt: skip
    version = upstream.installed_version()
    expected = upstream.reproduces_on(DRAFT_RUNNER_DIVERGENCE, version)
    if expected is None or (refusal is not None) == expected:
        return []
    seen = "expected but not seen" if expected else "seen but not expected"
    what = refusal or "the draft model ran with the assert on"
    return [f"[{DRAFT_RUNNER_DIVERGENCE}] {seen} on sglang {version}: {what}"]


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
    if not loading.load_or_say(loading.manager_modules):
        return 2
    print(
        f"sglang {upstream.installed_version()}: SGLang's per-forward runtime against the reference"
    )
    never, counts = _correct_histories(options.histories)
    problems = _draft_refusal_problems()
    fired, trial_problems = _fault_trials(options.trials)
    problems += trial_problems
    problems += [f"the correct histories never reached {m}" for m in never]
    problems += _upstream_problems(fired, counts)
    for line in problems:
        print(f"problem: {line}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
