"""The known-bad catalogue: canary with one realistic bug each, which the suite must kill.

Each member re-exports canary's API with exactly one bug patched in (see ``_mutate``), so it
can be tested like any implementation::

    pytest conformance --canary-impl strength.known_bad.addr_row_from_shape

``python -m strength.gate`` runs the suite on every entry of :data:`CATALOGUE`, expecting
each to be killed, and on every module of :data:`CORRECT`, expecting each to pass. A mutant
imports (and patches) canary globally, so it is only ever imported in a process of its own.
Bugs are safe by construction: no mutant writes outside the buffers it was given, and only the
``bounds_`` entries read outside them, on the CPU alone, where the suite's watch
(``conformance.bounds``) reports those reads and masks them off; the gate runs them on no other
device.

Each entry lists in ``dies_in`` the tests that must catch its bug (``fnmatch`` patterns of
``<suite module>::<test function>``, every parametrization included). What counts as a kill:
see ``strength/gate.py``.

To add a mutant, write ``strength/known_bad/<area prefix>_<bug>.py`` and add one :class:`Entry` line.
Modules whose name starts with ``probe_`` are not mutants of the catalogue: the gate's
self-tests use them to show how it judges runs that are not kills.
"""

from __future__ import annotations

from typing import NamedTuple

#: What a run of the suite on a module can come to (see ``strength.gate``).
OUTCOMES = ("passes", "killed", "error")

#: The parts of the contract a mutant's bug can sit in.
AREAS = (
    "validation",
    "addressing",
    "hashing",
    "launch-checks",
    "chain",
    "ring",
    "counters",
    "bounds",
    "scale",
    "plan",
    "history",
)


class Entry(NamedTuple):
    """One known-bad module: where its bug is, the bug in one line, the tests that must kill it,
    and what the suite must do."""

    module: str
    area: str
    bug: str
    dies_in: tuple[str, ...]
    expected: str = "killed"


#: Correct implementations: the suite must pass on each. ``correct_*`` modules here are canary
#: changed where the contract leaves the choice open (a GPU may choose so).
CORRECT = ("canary", "canary_torch", "strength.known_bad.correct_ring_claims_reversed")

#: Where a ``correct_*`` module's difference from canary can show: the tests it runs besides
#: the tour when the gate runs no ``--whole-suite`` (``scripts/tests.sh``; the nightly gate
#: runs it on the whole suite, as canary and canary_torch always are). For the reversed ring
#: claims, tests that compare the rows of launches that store several violations: run on the
#: whole suite with every ring comparison made by position instead of as a multiset, only
#: ``test_write_verify.py``'s tests and ``test_golden.py::test_write_verify_vector`` failed (a
#: correct engine history stores no rows). A gate without ``--whole-suite`` runs the stored
#: vectors, the ring test and the corruption test of those (16 s here alone; every test of
#: ``test_write_verify.py`` took about 100 s in the gate beside its other jobs); the nightly
#: gate runs the whole suite (``.ci/run`` leaves the variant to it: ``scripts/tests.sh``).
CORRECT_RUNS_IN = {
    "strength.known_bad.correct_ring_claims_reversed": (
        "test_golden.py::test_write_verify_vector",
        "test_write_verify.py::test_ring_is_fill_once_and_counts_past_capacity",
        "test_write_verify.py::test_each_corruption_is_reported_exactly",
    ),
}

_V, _A, _H, _L = "validation", "addressing", "hashing", "launch-checks"
_C, _R, _K, _B = "chain", "ring", "counters", "bounds"
_S, _P, _HI = "scale", "plan", "history"

# Where a bug must be caught: the suite's tests, as patterns of "<module>::<test function>".
_SV, _FP, _LV, _WV = (
    "test_source_validation.py::",
    "test_fingerprint.py::",
    "test_launch_refusals.py::",
    "test_write_verify.py::",
)
_GOLD_FP, _GOLD_WV = (
    "test_golden.py::test_fingerprint_vector",
    "test_golden.py::test_write_verify_vector",
)
_SPEC_VECTORS = "test_spec_vectors.py::test_spec_fingerprint_vectors"
_ENGINE = "test_engine.py::test_engine_histories_agree_with_the_reference_and_report_each_fault"
#: a refused config: the rule tests of CONTRACT §3
RULES = (
    _SV + "test_spec_examples",
    _SV + "test_each_rule_raises_its_error",
    _SV + "test_first_broken_rule_wins",
)
#: an accepted config: the valid-config tests of CONTRACT §3
ACCEPTS = (_SV + "test_valid_examples_are_accepted", _SV + "test_valid_configs_are_accepted")
#: a slot's bytes: the fingerprint's equality and read-window properties
ADDRESSING = (
    _FP + "test_fingerprint_equals_reference",
    _FP + "test_one_read_word_changes_only_its_slot",
    _FP + "test_bytes_outside_the_read_window_change_nothing",
    _FP + "test_dtype_does_not_matter",
    _FP + "test_addresses_past_2_to_the_31_and_32",
    _GOLD_FP,
)
#: the hash of read bytes: equality with the reference and the pinned vectors
HASHING = (
    _FP + "test_fingerprint_equals_reference",
    _FP + "test_partial_is_all_at_read_16",
    _SPEC_VECTORS,
    _GOLD_FP,
)
#: the chain, the ring and the counters: write/verify equality with the reference
WRITE_VERIFY = (
    _WV + "test_write_equals_reference",
    _WV + "test_verify_equals_reference",
    _WV + "test_write_then_verify_is_clean",
    _WV + "test_each_corruption_is_reported_exactly",
    _WV + "test_state_machine_of_writes_corruptions_and_verifies",
    _GOLD_WV,
)
#: the launch checks of write and verify
WV_LAUNCH = (
    _LV + "test_bad_launch_raises_before_any_work",
    _LV + "test_empty_plans_are_still_validated",
)

_PK, _GOLD_PLAN = "test_plan.py::", "test_golden_plan.py::test_plan_vector"
#: the plan kernel: equality with the reference, and the stored plans
PLAN = (_PK + "test_plan_equals_reference", _GOLD_PLAN)

# One line per entry, so that adding a mutant is adding a line.
# fmt: off
CATALOGUE: tuple[Entry, ...] = (
    # CONTRACT §3: RealKvSource validation
    Entry("strength.known_bad.val_page_size_zero_accepted", _V, "rule 3 checks page_size >= 0, so 0 is accepted", RULES),
    Entry("strength.known_bad.val_message_word_changed", _V, "rule 4's message says 'nonzero' for 'positive'", RULES),
    Entry("strength.known_bad.val_bool_accepted", _V, "rule 2 takes bool for an int", RULES),
    Entry("strength.known_bad.val_numpy_int_refused", _V, "rule 2 refuses numpy integers", ACCEPTS),
    Entry("strength.known_bad.val_numpy_int_mode_refused", _V, "modes, tags and capacities refuse numpy integers", ("test_argument_kinds.py::test_numpy_integers_are_ints_in_the_context", "test_argument_kinds.py::test_fingerprint_takes_a_numpy_integer_mode", "test_buffers.py::test_allocate_takes_a_numpy_integer_capacity")),
    Entry("strength.known_bad.val_read_bytes_bound_exclusive", _V, "rule 5 refuses read_bytes == num_bytes_per_token", ACCEPTS),
    Entry("strength.known_bad.val_rules_6_7_swapped", _V, "rule 7 (row stride) is checked before rule 6 (ndim)", (_SV + "test_spec_examples", _SV + "test_first_broken_rule_wins")),
    Entry("strength.known_bad.val_rows_dense_last_dim_only", _V, "rule 8 checks only the last dim's stride", RULES),
    Entry("strength.known_bad.val_narrow_row_unchecked", _V, "rule 9 (row holds page_size slots) is missing", RULES),
    Entry("strength.known_bad.val_alignment_unchecked", _V, "rule 10 (16-byte aligned data_ptr) is missing", RULES),
    # CONTRACT §3-§4: where a slot's bytes are
    Entry("strength.known_bad.addr_row_from_shape", _A, "rows addressed by their byte size, not stride(0)", ADDRESSING),
    Entry("strength.known_bad.addr_snapshot_at_first_use", _A, "a source is copied at first use; later writes unseen", (_FP + "test_hash_follows_the_live_tensor",)),
    Entry("strength.known_bad.addr_page_mapping_modulo", _A, "row = s % page_size instead of s // page_size", ADDRESSING),
    Entry("strength.known_bad.addr_int32_row_offset", _A, "the row's byte offset wraps to int32", (_FP + "test_addresses_past_2_to_the_31_and_32",)),
    Entry("strength.known_bad.addr_storage_offset_ignored", _A, "base address is the storage's start, not data_ptr()", ADDRESSING),
    Entry("strength.known_bad.addr_stride_in_elements", _A, "row stride taken in elements, not bytes", ADDRESSING),
    Entry("strength.known_bad.addr_col_from_read_bytes", _A, "slot column = (s % page_size) * read_bytes", ADDRESSING),
    # CONTRACT §2, §4: the hash
    Entry("strength.known_bad.hash_partial_reads_read_bytes", _H, "PARTIAL reads read_bytes instead of 16", (*HASHING, _FP + "test_bytes_outside_the_read_window_change_nothing")),
    Entry("strength.known_bad.hash_partial_reads_8_bytes", _H, "PARTIAL reads 8 bytes instead of 16", (*HASHING, _FP + "test_one_read_word_changes_only_its_slot")),
    Entry("strength.known_bad.hash_big_endian_words", _H, "words are folded big-endian", HASHING),
    Entry("strength.known_bad.hash_sources_reversed", _H, "sources are combined in reverse order", (*HASHING, _FP + "test_source_order_matters")),
    Entry("strength.known_bad.hash_combine_without_splitmix", _H, "sources combined by h ^= fold, no splitmix64", HASHING),
    Entry("strength.known_bad.hash_signed_state", _H, "splitmix64 shifts as int64, so >> is arithmetic", HASHING),
    Entry("strength.known_bad.hash_golden_gamma", _H, "splitmix64 adds the golden-gamma increment", HASHING),
    # CONTRACT §4: launch checks of fingerprint
    Entry("strength.known_bad.launch_cap_skipped_in_fingerprint", _L, "fingerprint skips the 4-source cap, folds 4", (_FP + "test_launch_checks_source_cap*",)),
    Entry("strength.known_bad.launch_none_checks_slots", _L, "mode NONE still checks slot ranges", (_FP + "test_none_and_no_sources_read_nothing",)),
    Entry("strength.known_bad.launch_slot_range_value_error", _L, "an out-of-range slot raises ValueError", (_FP + "test_launch_checks_slot_range", *WV_LAUNCH)),
    Entry("strength.known_bad.launch_cap_after_device_check", _L, "the 4-source cap is checked after the device check", (_FP + "test_launch_checks_source_cap_comes_first",)),
    Entry("strength.known_bad.launch_slot_named_after_int64_cast", _L, "a refused slot is named by its int64 cast (uint64 2^63 as -2^63)", (_FP + "test_a_refused_slot_is_named_as_given",)),
    # CONTRACT §8: launch checks of write and verify
    Entry("strength.known_bad.launch_disabled_plan_index_checked", _L, "a disabled verify plan is index-checked", (_LV + "test_disabled_verify_is_not_index_checked", _WV + "test_disabled_verify_only_counts_the_launch")),
    Entry("strength.known_bad.launch_source_range_unchecked", _L, "write/verify skip the source capacity check", WV_LAUNCH),
    Entry("strength.known_bad.launch_expected_tensors_unchecked", _L, "write takes expected tensors with the assert off", WV_LAUNCH),
    # CONTRACT §6-§7: the hash chain
    Entry("strength.known_bad.chain_slot0_verified", _C, "verify checks padding slot 0 instead of skipping it", WRITE_VERIFY),
    Entry("strength.known_bad.chain_prev0_is_anchor", _C, "prev slot 0 is taken as the anchor, not 'unchecked'", WRITE_VERIFY),
    Entry("strength.known_bad.chain_xor_then_mix", _C, "chain step is splitmix64(a ^ b ^ c), not mix3", WRITE_VERIFY),
    Entry("strength.known_bad.chain_real_kv_folded", _C, "write folds real_kv_hash into the chain", WRITE_VERIFY),
    Entry("strength.known_bad.chain_advances_on_expected", _C, "the chain advances on expected, not actual, values", WRITE_VERIFY),
    Entry("strength.known_bad.chain_position_assert_unseeded", _C, "the position assert runs for anchor-started requests", WRITE_VERIFY),
    Entry("strength.known_bad.chain_write_skips_slot0", _C, "write skips slot 0 as if it were padding", WRITE_VERIFY),
    Entry("strength.known_bad.chain_token_checked_without_flag", _C, "verify checks tokens with the flag off", WRITE_VERIFY),
    # CONTRACT §5: the violation ring
    Entry("strength.known_bad.ring_wraps", _R, "the ring wraps around instead of filling once", (_WV + "test_ring_is_fill_once_and_counts_past_capacity", *WRITE_VERIFY)),
    Entry("strength.known_bad.ring_index_stops_at_capacity", _R, "the write index stops at the capacity", (_WV + "test_ring_is_fill_once_and_counts_past_capacity", *WRITE_VERIFY)),
    # CONTRACT §6-§7: the run counters
    Entry("strength.known_bad.counters_num_valid_unclamped", _K, "verify_num_valid is not clamped to [0, cap]", WRITE_VERIFY),
    Entry("strength.known_bad.counters_skipped_entries_counted", _K, "slot_run_counter counts -1 entries", WRITE_VERIFY),
    Entry("strength.known_bad.counters_padding_not_counted", _K, "slot_run_counter leaves out padding entries", WRITE_VERIFY),
    Entry("strength.known_bad.counters_kernel_run_only_when_enabled", _K, "a disabled verify is not counted", (_WV + "test_disabled_verify_only_counts_the_launch", *WRITE_VERIFY)),
    Entry("strength.known_bad.counters_kernel_run_per_request", _K, "kernel_run_counter counts write requests", WRITE_VERIFY),
    # CONTRACT §4, §8: no launch reads outside its buffers (seen by the CPU's watch alone)
    Entry("strength.known_bad.bounds_fold_reads_slot_minus_1", _B, "a -1 slot reads the row before each source", (_FP + "test_fingerprint_equals_reference", _GOLD_FP, _GOLD_WV)),
    Entry("strength.known_bad.bounds_write_reads_past_request", _B, "write reads one entry past each request", (_WV + "test_write_equals_reference", _GOLD_WV)),
    Entry("strength.known_bad.bounds_verify_reads_past_plan", _B, "verify reads one entry past the plan", (_WV + "test_verify_equals_reference", _GOLD_WV)),
    Entry("strength.known_bad.bounds_slots_checked_in_int32", _B, "launch slot ranges are checked on a 32-bit copy", (_LV + "test_bad_launch_raises_before_any_work",)),
    # Bugs that live only at engine scale: each is listed with its property of
    # conformance/test_scale.py alone (the vectors of test_golden_scale.py kill four of them
    # too, but would add 20 s to each run under the interpreter)
    Entry("strength.known_bad.scale_chain_restarts_per_4096_chunk", _S, "write restarts the running hash every 4096 entries of a request", ("test_scale.py::test_long_prefill_in_chunks_equals_reference",)),
    Entry("strength.known_bad.scale_write_grid_capped_at_256", _S, "the write grid is capped at 256 programs, later requests unwritten", ("test_scale.py::test_many_requests_in_one_launch_equal_reference",)),
    Entry("strength.known_bad.scale_page_index_wraps_at_64", _S, "the in-page index is kept in 6 bits (s % page_size & 63)", ("test_scale.py::test_big_pages_and_pools_fingerprint_equals_reference",)),
    Entry("strength.known_bad.scale_slot_index_16_bits", _S, "fingerprint keeps slot indices as int16", ("test_scale.py::test_big_pages_and_pools_fingerprint_equals_reference",)),
    Entry("strength.known_bad.scale_verify_one_persistent_lap", _S, "verify's persistent grid of 32768 entries makes one lap only", ("test_scale.py::test_long_verify_sweep_equals_reference",)),
    Entry("strength.known_bad.scale_verify_stops_at_65536_entries", _S, "verify's grid is capped at 65536 entries, later entries unchecked", ("test_plan.py::test_an_engine_scale_plan_feeds_one_verify_launch",)),
    # CONTRACT §12-§13: the plan kernel and the expected-token scatter
    Entry("strength.known_bad.plan_window_start_off_by_one", _P, "an SWA window starts at prefix - window + 1", PLAN),
    Entry("strength.known_bad.plan_chain_reset_at_window_head", _P, "an SWA window's head gets previous slot -1", PLAN),
    Entry("strength.known_bad.plan_seed_from_wrong_position", _P, "the write seed is read at prefix - 2, not prefix - 1", PLAN),
    Entry("strength.known_bad.plan_padding_rows_counted", _P, "padding rows' stale extend lengths count into the write offsets", (*PLAN, _PK + "test_a_padding_row_contributes_nothing_wherever_it_stands")),
    Entry("strength.known_bad.plan_overflow_still_scatters", _P, "an overflowing plan still writes its first capacity entries", (_PK + "test_overflow_disables_the_plan_and_leaves_its_entries_untouched", _GOLD_PLAN)),
    Entry("strength.known_bad.plan_prev_slot_untranslated", _P, "previous slots skip the SWA table", PLAN),
    Entry("strength.known_bad.plan_expected_token_past_valid_len", _P, "expected tokens are read past the valid length", PLAN),
    Entry("strength.known_bad.plan_padding_constant_one", _P, "REQ_POOL_IDX_PADDING is exported as 1 (the kernels keep 0)", ("test_spec_vectors.py::test_plan_constant_is_the_contracts",)),
    Entry("strength.known_bad.scatter_spills_into_next_row", _P, "the scatter writes tokens past a row's end into the next rows", ("test_scatter.py::test_scatter_equals_reference", "test_golden_plan.py::test_scatter_vector")),
    # Bugs that only a history shows: state kept between launches, keyed by the tensors an engine
    # reuses every step (conformance/test_engine.py; every single-launch property passes)
    Entry("strength.known_bad.history_plan_caches_row_slots", _HI, "the plan reuses the slots it read for a pool row in earlier launches", (_ENGINE,)),
    Entry("strength.known_bad.history_plan_window_never_slides_back", _HI, "an SWA window start never moves back when a row is recycled", (_ENGINE,)),
    Entry("strength.known_bad.history_scatter_appends_only", _HI, "the scatter writes only tokens past those it wrote to a row before", (_ENGINE,)),
    Entry("strength.known_bad.history_plan_verify_built_once_per_buffer", _HI, "a verify plan buffer handed to the plan again (a replayed graph's) keeps its first launch's entries", (_ENGINE,)),
)
# fmt: on
