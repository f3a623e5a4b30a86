"""SGLang's canary runtime over the engine model's histories: its plan inputs, per forward mode.

    python -m conformance.sglang_runtime [--histories N]

SGLang builds the plan kernel's per-row inputs, on every forward, in its runtime
(``sglang/srt/kv_canary/plan_input.py``: ``PlanInput.fill_from_forward_batch``, one branch per
``ForwardMode``), from the fields of SGLang's ``ForwardBatch``. The engine model
(``engine_model/engine.py``) builds the same inputs from its own state. This leg runs SGLang's
code, unmodified and on the CPU, on a stand-in ``ForwardBatch`` made of each forward of
:data:`HISTORIES` engine histories (``conformance.sglang.histories``), and requires SGLang's
``PlanInput`` to equal the engine model's plan inputs, row by row: in every mode the model has
(``EXTEND``, ``DECODE``, a decode replaying a CUDA graph with its padding rows, ``MIXED``,
``IDLE``, ``TARGET_VERIFY``, the draft model's multi-step draft decode and its ``DRAFT_EXTEND_V2``,
a PD transfer's prefill on the prefill engine). It runs SGLang's
``TokenOracleManager.fill_expected_inputs`` (``token_oracle/oracle_manager.py``) on the same
stand-in with SGLang's ``HashOracle``, and requires its expected inputs to come from where the
engine model's come from: the oracle's tokens in the modes of
``engine_model.vocabulary.ORACLE_MODES``, the input ids in the others. It prints how many forwards
of each mode it compared, and fails when a mode was never reached.

What runs of SGLang: ``plan_input.PlanInput`` (it imports torch alone), ``TokenOracleManager``
and ``HashOracle`` with ``ExpectedInputs`` (torch alone too), and ``ForwardMode``,
executed from its own source in ``model_executor/forward_batch_info.py`` (whose module needs
SGLang's serving stack), both from the installed ``sglang`` wheel (``pip install --no-deps
sglang==X``; every release from 0.5.13 has them). What stands in for the rest of SGLang:

- ``ForwardBatchStandIn`` for ``model_executor.forward_batch_info.ForwardBatch``: the
  fields ``fill_from_forward_batch`` reads (``FORWARD_BATCH_FIELDS``), filled as SGLang's
  scheduler fills them in each mode: ``positions`` (each token's position, a graph's padding
  rows 0), ``seq_lens`` (a decode row's length with its new token; a target verify's written
  length, before its drafts), ``extend_prefix_lens`` (the first position each row writes) and
  ``extend_seq_lens`` (the tokens each row writes) in the extend modes, ``req_pool_indices``,
  ``req_all_ids_lens`` (each row's known tokens) and ``spec_info``;
- ``SpecInfoStandIn`` for EAGLE's verify and draft inputs (``draft_token_num``, the tokens
  each row of a target verify writes; ``num_tokens_per_req``, those of a draft extend);
- ``input_ids`` (the forward's), ``rids_int`` (a request's pool row as its id) and
  ``bootstrap_room_ids_int`` (None: no PD bootstrap room), which the token oracle manager
  reads (``TOKEN_ORACLE_FIELDS``).

At each cache sweep of a history it runs SGLang's ``sweep_plan_builder.py``
(``build_verify_plan_radix_sweep``) over the engine model's walk of its cache and requires its
plan to equal the model's sweep in each group (``compare_sweep``), with
``RadixCacheStandIn`` for ``mem_cache.unified_radix_cache.UnifiedRadixCache``
(``req_to_token_pool`` and the walk) and ``walk_radix_cache`` for ``radix_cache_walker.py``'s
``walk_radix_cache_for_canary`` (whose module needs SGLang's memory-cache stack).

It runs SGLang's ``req_to_token`` perturbation (``perturb/req_to_token.py``, unmodified, with
its slot picker, config and warm-up gate; probability 1, no warm-up) on the engine model after a
warm-up, through ``PerturbBatchStandIn`` (the ``ForwardBatch`` of the decode about to run)
and the engine's own page table as SGLang's ``ReqToTokenPool.req_to_token``, and judges the
entry it changes as the ``req_to_token`` fault class predicts, on the reference, over the
settle (``req_to_token_trial``); and SGLang's ``real_kv_used`` and ``real_kv_post_forward``
perturbations the same way, with SGLang's own ``CanaryBufferGroup`` and ``RealKvSource`` over
copies of the reference's KV pools (``kv_perturbation_trial``), and its
``real_kv_unused_cache`` over ``unlocked_cache`` (the stand-in walk of the tree's unlocked
nodes: the slots of cached prefixes no running request holds); and its ``next_token_swap``
(``maybe_perturb_swap_next_tokens``, the sampler's hook) on the tokens the engine's requests
just sampled (``swap_trial``). All five of SGLang's perturbations run.

It also runs SGLang's ``pool_patcher/buf_info_splice.py`` (``splice_kv_buf_info``, its patch
of a pool's ``get_contiguous_buf_infos``) on SGLang's own ``CanaryBufferGroup`` and a two-layer
MHA pool's buffer list, and copies pages over the spliced ``(ptr, len, item_len)`` lists as a
PD transfer engine does, item by item (``transfer``): every page's records must arrive with
its KV, and without the splice they must not (the check can fail).

A forward the model makes that SGLang never makes is not compared: a decode batch with padding
rows outside a graph (the contract's plan takes padding rows anywhere; SGLang's decode batch
has them only at a replayed graph's tail).

This module is the leg's command line; its parts are the modules of :mod:`conformance.sglang`:
the stand-ins in ``standins.py``, the comparisons in ``compare.py``, the perturbation trials in
``trials.py``, the PD splice in ``splice.py``, SGLang's modules loaded by ``loading.py``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from dataclasses import dataclass, field

from conformance import upstream
from conformance.sglang import loading
from conformance.sglang.compare import compare_plan_inputs, compare_sweep, expected_inputs
from conformance.sglang.histories import (
    EXPECTED_INPUTS_REQUIRED,
    REQUIRED,
    history,
    step_label,
)
from conformance.sglang.splice import SLOTS_MOVED, transfer
from conformance.sglang.trials import PERTURBATION_TRIALS
from engine_model import Engine
from engine_model.vocabulary import ORACLE_MODES

__all__ = ["HISTORIES", "Tally", "compare_histories", "main"]

#: Engine histories the leg runs.
HISTORIES = 24
#: The problems the leg prints at the most.
PRINTED = 20
#: The sweeps a run must reach, by whether the engine has a window.
SWEEP_KINDS = ("without a window", "with a window")


@dataclass
class Tally:
    """What the leg compared: forwards by step label, forwards whose expected inputs were
    compared by forward mode, sweeps by :data:`SWEEP_KINDS`, forwards SGLang never makes, and
    every difference as a line."""

    counts: Counter[str] = field(default_factory=Counter)
    expected_input_counts: Counter[str] = field(default_factory=Counter)
    sweeps: Counter[str] = field(default_factory=Counter)
    skipped: int = 0
    problems: list[str] = field(default_factory=list)


def _swept(tally: Tally, index: int, engine: Engine, sweep) -> None:
    lines = compare_sweep(engine, sweep)
    tally.sweeps[SWEEP_KINDS[engine.lut is not None]] += 1
    if lines:
        tally.problems.append(f"history {index}, sweep: " + "; ".join(lines))


def compare_histories(histories: int) -> Tally:
    """SGLang's ``PlanInput``, expected inputs and sweep plans against the engine model's, on
    every forward and sweep of the first ``histories`` histories."""
    tally = Tally()
    for index in range(histories):
        on_sweep = functools.partial(_swept, tally, index)
        for step, forward in enumerate(history(index, on_sweep=on_sweep)):
            lines = compare_plan_inputs(forward)
            if lines is None:
                tally.skipped += 1
                continue
            label = str(step_label(forward))
            tally.counts[label] += 1
            if lines:
                tally.problems.append(
                    f"history {index}, forward {step} ({label}): " + "; ".join(lines)
                )
            inputs = expected_inputs(forward)
            if inputs is not None:
                tally.expected_input_counts[forward.mode] += 1
            if inputs:
                tally.problems.append(
                    f"history {index}, forward {step} ({label}), expected inputs: "
                    + "; ".join(inputs)
                )
    return tally


def _print_comparisons(tally: Tally) -> None:
    equal = not tally.problems
    for name in REQUIRED:
        n = tally.counts[name]
        print(f"  {name}: {n} forwards equal" if equal else f"  {name}: {n}")
    print(f"  not compared (padding rows SGLang's batches never have): {tally.skipped}")
    counts = tally.expected_input_counts
    modes = sorted(counts, key=lambda m: (m not in ORACLE_MODES, m))
    print(
        "TokenOracleManager.fill_expected_inputs against the engine model: "
        + ", ".join(
            f"{m} {counts[m]} ({'the oracle' if m in ORACLE_MODES else 'the input ids'})"
            for m in modes
        )
        + (" forwards equal" if equal else "")
    )
    print(
        "build_verify_plan_radix_sweep against the engine model's sweep: "
        + ", ".join(f"{tally.sweeps[k]} {k}" for k in SWEEP_KINDS)
        + (" equal" if equal else "")
    )


def _run_perturbations(histories: int, problems: list[str]) -> dict[str, Counter[str]]:
    """Each of SGLang's perturbations in each history's trial: the outcomes by perturbation
    (the problems added to ``problems``)."""
    perturbed: dict[str, Counter[str]] = {}
    for name, trial in PERTURBATION_TRIALS.items():
        outcomes = perturbed[name] = Counter()
        for index in range(histories):
            outcome, lines = trial(index)
            outcomes[outcome] += 1
            problems += [f"history {index}, SGLang's {name} perturbation: {x}" for x in lines]
        print(
            f"SGLang's {name} perturbation on the engine model, judged as the class predicts: "
            + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
            + ("" if problems else " (every prediction met)")
        )
    return perturbed


def _never_reached(tally: Tally, perturbed: dict[str, Counter[str]]) -> list[str]:
    missing = [name for name in REQUIRED if not tally.counts[name]]
    missing += [f"a sweep {k}" for k in SWEEP_KINDS if not tally.sweeps[k]]
    missing += [
        f"expected inputs of {m}"
        for m in EXPECTED_INPUTS_REQUIRED
        if not tally.expected_input_counts[m]
    ]
    missing += [f"a {k} perturbation reported" for k, o in perturbed.items() if not o["reported"]]
    return missing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.sglang_runtime", description=__doc__
    )
    parser.add_argument("--histories", type=int, default=HISTORIES)
    options = parser.parse_args(argv)
    if not loading.load_or_say(loading.runtime):
        return 2
    version = upstream.installed_version()
    tally = compare_histories(options.histories)
    print(f"sglang {version}: PlanInput.fill_from_forward_batch against the engine model")
    _print_comparisons(tally)
    perturbed = _run_perturbations(options.histories, tally.problems)
    missing = _never_reached(tally, perturbed)
    for line in tally.problems[:PRINTED]:
        print(f"DIFFERS: {line}")
    if missing:
        print(f"NEVER REACHED: {', '.join(missing)}")
    lost = transfer(splice=True)
    control = transfer(splice=False)  # the KV layers alone: the check must see records stay
    print(
        "PD transfer over SGLang's splice_kv_buf_info: "
        + (f"{len(lost)} slots lost their records: {lost[:3]}" if lost else
           "every page's records arrive with its KV")
        + f" (without the splice, {len(control)} of {SLOTS_MOVED} slots arrive without their records)"
    )  # fmt: skip
    return 1 if tally.problems or missing or lost or not control else 0


if __name__ == "__main__":
    sys.exit(main())
