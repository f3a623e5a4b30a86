"""Conformance levels (``--canary-level core|full``, or ``CANARY_LEVEL``; default ``full``).

- ``core`` is what SGLang's kv_canary promises: the hashes, the addressing of a slot's bytes,
  the chain, the ring, the counters, rules 3 to 7 and 9 of ``RealKvSource``, and the launch
  semantics (CONTRACT §2-§7), with the checks SGLang's launchers make (the source count, the
  contiguity of every tensor, the expected-tensor rule, the slot stride) and its negative-ring
  rule (CONTRACT §10).
- ``full`` adds the contract's own additions, each marked *addition* in ``docs/CONTRACT.md``:
  rules 1, 2, 8 and 10 (§3), the launch checks of §4 and §8 that SGLang does not make (dtype,
  shape, device, slot ranges, offsets, checks of an empty plan), the decisions of §10 that are
  checks, and the arguments of the wrong kind (§11); the plan's and the scatter's own additions
  (§12 P1, P8-P13; §13 S1, S9-S11).

This table is the one place where a test declares its level: every test function of the suite
is a key, with its level, or, for a test whose cases differ, the patterns of its full-level
case ids (the text inside ``[...]``; ``*`` matches any run of characters) — its other cases are
core. A test of the suite missing here is a collection error. Both levels are strict; the
known-bad gate runs at ``full``.
"""

from __future__ import annotations

import functools
import re

CORE, FULL = "core", "full"
LEVELS_ORDER = (CORE, FULL)

#: Launch checks of CONTRACT §8 that SGLang does not make, for both launches (case ids
#: "write: ..." and "verify: ..."); the rest of §8 (source count, contiguity, slot stride of a
#: plan with entries, the expected-tensor rule) is core.
_LAUNCH_ADDITIONS = (
    "*: a source on another device",
    "*: slots past a source's capacity",
    "*: slot stride 36 bytes",
    "*: canary_buf int64",
    "*: ring int32",
    "*: ring [4, 7]",
    "*: canary_buf 4 bytes past alignment",
    "*: ring 1-D",
    "*: write index 0-D",
    "*: write index [1, 1]",
    "*: write index int64",
    "*: slot counter [2]",
    "*: kernel counter on meta",
    "*: chain assert int64",
    "write: write_offsets [cap]",
    "write: seeds int32",
    "write: num_valid_reqs on meta",
    "write: positions too short",
    "write: out_cache_loc float",
    "write: offsets decreasing",
    "write: offsets past the token arrays",
    "write: offsets start at -1",
    "write: seed 8 of 8 slots",
    "write: seed 4294967297 of 8 slots",
    "write: out_cache_loc int32 2147483647 of 8 slots",
    "write: offsets past the token arrays at 1099511627776",
    "write: slot 0 of a canary_buf of no slots",
    "write: seed slot 0 of a canary_buf of no slots",
    "write: out_cache_loc 12 of 8 slots",
    "verify: expected tokens [3]",
    "verify: prev slots int32",
    "verify: enable on meta",
    "verify: verify_num_valid int64",
    "verify: verify slot 8 of 8*",
    "verify: verify slot -1*",
    "verify: verify slot 1 past a 1-slot source",
    "verify: prev slot 30 of 8",
    "verify: verify slot 9223372036854775807",
    "verify: prev slot 4294967299 of 8",
)

#: Every test of the suite ("module.py::function"): its level, or its full-level case patterns.
LEVELS: dict[str, str | tuple[str, ...]] = {
    # §2 hashes and §1 enums
    "test_spec_vectors.py::test_spec_fingerprint_vectors": CORE,
    "test_spec_vectors.py::test_enums_are_the_contracts": CORE,
    "test_spec_vectors.py::test_plan_constant_is_the_contracts": CORE,
    # §3 RealKvSource: rules 1, 2, 8 and 10 are additions
    "test_source_validation.py::test_spec_examples": (
        "tensor=*",  # rule 1
        "page_size=2.0",  # rule 2, as are the next four
        "page_size=True",
        "num_bytes_per_token='32'",
        "read_bytes=None",
        "1-D tensor and page_size=0.5",
        "row too narrow, int8 sizes",  # rule 2: numpy sizes taken as Python ints
        "rows not contiguous",  # rule 8, as are the next three
        "no rows, rows not dense",
        "a size-1 dim beside a transposed pair",
        "a broadcast (stride 0) dim in a row",
        "data_ptr % 16 == 4",  # rule 10
    ),
    "test_source_validation.py::test_valid_examples_are_accepted": CORE,
    "test_source_validation.py::test_source_is_frozen_and_keyword_only": CORE,
    "test_source_validation.py::test_valid_configs_are_accepted": FULL,  # draws numpy sizes (rule 2)
    "test_source_validation.py::test_each_rule_raises_its_error": ("1", "2", "8", "10"),
    "test_source_validation.py::test_first_broken_rule_wins": FULL,  # ranks rules 1, 2, 8, 10 too
    # §4 fingerprint: the checks of a source's device and of slot ranges are additions
    "test_fingerprint.py::test_fingerprint_equals_reference": CORE,
    "test_fingerprint.py::test_one_read_word_changes_only_its_slot": CORE,
    "test_fingerprint.py::test_bytes_outside_the_read_window_change_nothing": CORE,
    "test_fingerprint.py::test_source_order_matters": CORE,
    "test_fingerprint.py::test_partial_is_all_at_read_16": CORE,
    "test_fingerprint.py::test_none_and_no_sources_read_nothing": CORE,
    "test_fingerprint.py::test_dtype_does_not_matter": CORE,
    "test_fingerprint.py::test_hash_follows_the_live_tensor": CORE,
    "test_fingerprint.py::test_a_source_whose_storage_starts_at_an_odd_address": CORE,
    "test_fingerprint.py::test_nd_rows_hash_as_their_bytes": CORE,
    "test_fingerprint.py::test_addresses_past_2_to_the_31_and_32": CORE,
    "test_fingerprint.py::test_launch_checks_source_cap": CORE,
    "test_fingerprint.py::test_launch_checks_source_cap_comes_first": CORE,
    "test_fingerprint.py::test_launch_checks_device": FULL,
    "test_fingerprint.py::test_launch_checks_slot_range": FULL,
    "test_fingerprint.py::test_a_refused_slot_is_named_as_given": FULL,
    # stored vectors of §2-§7
    "test_golden.py::test_fingerprint_vector": CORE,
    "test_golden.py::test_write_verify_vector": CORE,
    "test_golden_scale.py::test_scale_vector": CORE,
    "test_golden_plan.py::test_plan_vector": CORE,
    # the 4096-request scatter is past SGLang's 511 (CONTRACT §13 S8)
    "test_golden_plan.py::test_scatter_vector": ("scatter-4096",),
    # §8 launch checks
    "test_launch_refusals.py::test_bad_launch_raises_before_any_work": _LAUNCH_ADDITIONS,
    # an empty plan is checked in full: SGLang's slot-stride check needs entries
    "test_launch_refusals.py::test_empty_plans_are_still_validated": (
        *_LAUNCH_ADDITIONS,
        "*: slot stride 24 bytes",
    ),
    "test_launch_refusals.py::test_entries_past_num_valid_are_not_validated": CORE,
    "test_launch_refusals.py::test_disabled_verify_is_not_index_checked": CORE,
    "test_launch_refusals.py::test_launches_at_the_edges_run": CORE,
    # §5 plans: capacities <= 0 are SGLang's refusal; the kinds of a capacity are §11
    "test_buffers.py::test_allocate_refuses_a_capacity_below_one": CORE,
    "test_buffers.py::test_allocate_refuses_a_capacity_that_is_no_int": FULL,
    "test_buffers.py::test_allocate_takes_a_numpy_integer_capacity": FULL,
    "test_buffers.py::test_allocate_takes_keywords_only": CORE,
    "test_buffers.py::test_allocated_plans_have_the_contract_shapes": CORE,
    "test_buffers.py::test_context_and_plans_are_frozen_and_keyword_only": CORE,
    "test_buffers.py::test_plans_past_256_entries_are_accepted": CORE,
    # §11 arguments of the wrong kind, numpy integers
    "test_argument_kinds.py::test_wrong_kinds_of_arguments_are_refused": FULL,
    "test_argument_kinds.py::test_fingerprint_refuses_wrong_kinds_of_arguments": FULL,
    "test_argument_kinds.py::test_fingerprint_takes_its_arguments_as_the_contract_spells_them": CORE,
    "test_argument_kinds.py::test_numpy_integers_are_ints_in_the_context": FULL,
    "test_argument_kinds.py::test_fingerprint_takes_a_numpy_integer_mode": FULL,
    # §6-§7 write and verify, the ring, the counters
    "test_write_verify.py::test_write_equals_reference": CORE,
    "test_write_verify.py::test_verify_equals_reference": CORE,
    "test_write_verify.py::test_write_then_verify_is_clean": CORE,
    "test_write_verify.py::test_each_corruption_is_reported_exactly": CORE,
    "test_write_verify.py::test_bytes_outside_read_windows_never_report": CORE,
    "test_write_verify.py::test_ring_is_fill_once_and_counts_past_capacity": CORE,
    "test_write_verify.py::test_disabled_verify_only_counts_the_launch": CORE,
    "test_write_verify.py::test_state_machine_of_writes_corruptions_and_verifies": CORE,
    # the same properties at engine scale
    "test_scale.py::test_long_prefill_in_chunks_equals_reference": CORE,
    "test_scale.py::test_many_requests_in_one_launch_equal_reference": CORE,
    "test_scale.py::test_long_verify_sweep_equals_reference": CORE,
    "test_scale.py::test_big_pages_and_pools_fingerprint_equals_reference": CORE,
    # §12 the plan kernel, §13 the scatter: P1 and P8-P13, S1 and S9-S11 are additions
    "test_plan.py::test_plan_equals_reference": CORE,
    "test_plan.py::test_overflow_disables_the_plan_and_leaves_its_entries_untouched": CORE,
    "test_plan.py::test_a_padding_row_contributes_nothing_wherever_it_stands": CORE,
    "test_plan.py::test_permuting_the_requests_permutes_the_entries": CORE,
    "test_plan.py::test_plan_write_verify_over_an_engines_steps_is_clean": CORE,
    "test_plan.py::test_a_changed_page_table_entry_is_reported_as_the_reference_predicts": CORE,
    "test_plan.py::test_an_engine_scale_plan_feeds_one_verify_launch": CORE,
    "test_engine.py::test_engine_histories_agree_with_the_reference_and_report_each_fault": CORE,
    "test_engine.py::test_draft_steps_verify_drafts_past_the_snapshot": CORE,
    "test_engine.py::test_a_recycled_row_s_draft_reads_stop_at_its_own_snapshot": CORE,
    "test_engine.py::test_each_fault_class_is_reported_where_it_predicts": CORE,
    "test_plan_refusals.py::test_plan_refuses_each_broken_argument": (
        "P1:*",
        "P8:*",
        "P9:*",
        "P10:*",
        "P11:*",
        "P12:*",
        "P13:*",
    ),
    "test_plan_refusals.py::test_scatter_refuses_each_broken_argument": (
        "S1:*",
        "S9:*",
        "S10:*",
        "S11:*",
    ),
    "test_scatter.py::test_scatter_equals_reference": CORE,
    # S8's cap is the contract's decision: SGLang refuses past 511 requests
    "test_scatter.py::test_scatter_takes_every_batch_the_plan_takes": ("512", "4096"),
}


class UndeclaredLevel(LookupError):
    """A test of the suite that this table does not name."""


def split_nodeid(nodeid: str) -> tuple[str, str | None]:
    """("module.py::function", case id or None) of a suite node id."""
    name, _, case = nodeid.removeprefix("conformance/").partition("[")
    return name, (case[:-1] if case else None)


@functools.cache
def _pattern(pattern: str) -> re.Pattern:
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")))


def level_of(nodeid: str) -> str:
    """The level of the suite's test ``nodeid`` (``conformance/test_x.py::test_y[case]``)."""
    return declared_level(*split_nodeid(nodeid))


def declared_level(name: str, case: str | None) -> str:
    """The level of case ``case`` (None: a test without cases) of test ``module.py::function``."""
    try:
        declared = LEVELS[name]
    except KeyError:
        raise UndeclaredLevel(
            f"{name} declares no conformance level: add it to LEVELS in conformance/levels.py"
        ) from None
    if isinstance(declared, str):
        return declared
    if case is not None and any(_pattern(p).fullmatch(case) for p in declared):
        return FULL
    return CORE


def runs_at(level: str, test_level: str) -> bool:
    """Whether a test of ``test_level`` runs at ``level`` (full runs everything)."""
    return LEVELS_ORDER.index(test_level) <= LEVELS_ORDER.index(level)
