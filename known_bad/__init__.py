"""The known-bad catalogue: canary with one realistic bug each, which the suite must kill.

Each member re-exports canary's API with exactly one bug patched in (see ``_mutate``), so it
can be tested like any implementation::

    pytest conformance --canary-impl known_bad.addr_row_from_shape

``python -m conformance.gate`` runs the suite on every entry of :data:`CATALOGUE`, expecting
each to be killed, and on every module of :data:`CORRECT`, expecting each to pass. A mutant
imports (and patches) canary globally, so it is only ever imported in a process of its own.
Bugs are safe by construction: no mutant reads or writes outside the buffers it was given,
so a kill is a failed property, never a crash.

To add a mutant, write ``known_bad/<area prefix>_<bug>.py`` and add one :class:`Entry` line.
"""

from __future__ import annotations

from typing import NamedTuple

#: What a run of the suite on a module can come to (see ``conformance.gate``).
OUTCOMES = ("passes", "killed", "error")

#: The parts of the contract a mutant's bug can sit in.
AREAS = ("validation", "addressing", "hashing", "launch-checks", "chain", "ring", "counters")


class Entry(NamedTuple):
    """One known-bad module: where its bug is, the bug in one line, and what the suite must do."""

    module: str
    area: str
    bug: str
    expected: str = "killed"


#: Correct implementations: the suite must pass on each.
CORRECT = ("canary", "canary.torch_backend")

_V, _A, _H, _L = "validation", "addressing", "hashing", "launch-checks"
_C, _R, _K = "chain", "ring", "counters"

# One line per entry, so that adding a mutant is adding a line.
# fmt: off
CATALOGUE: tuple[Entry, ...] = (
    # SPEC §3: RealKvSource validation
    Entry("known_bad.val_page_size_zero_accepted", _V, "rule 3 checks page_size >= 0, so 0 is accepted"),
    Entry("known_bad.val_message_word_changed", _V, "rule 4's message says 'nonzero' for 'positive'"),
    Entry("known_bad.val_bool_accepted", _V, "rule 2 takes bool for an int"),
    Entry("known_bad.val_numpy_int_refused", _V, "rule 2 refuses numpy integers"),
    Entry("known_bad.val_read_bytes_bound_exclusive", _V, "rule 5 refuses read_bytes == num_bytes_per_token"),
    Entry("known_bad.val_rules_6_7_swapped", _V, "rule 7 (row stride) is checked before rule 6 (ndim)"),
    Entry("known_bad.val_rows_dense_last_dim_only", _V, "rule 8 checks only the last dim's stride"),
    Entry("known_bad.val_narrow_row_unchecked", _V, "rule 9 (row holds page_size slots) is missing"),
    Entry("known_bad.val_alignment_unchecked", _V, "rule 10 (16-byte aligned data_ptr) is missing"),
    # SPEC §3-§4: where a slot's bytes are
    Entry("known_bad.addr_row_from_shape", _A, "rows addressed by their byte size, not stride(0)"),
    Entry("known_bad.addr_snapshot_at_first_use", _A, "a source is copied at first use; later writes unseen"),
    Entry("known_bad.addr_page_mapping_modulo", _A, "row = s % page_size instead of s // page_size"),
    Entry("known_bad.addr_int32_row_offset", _A, "the row's byte offset wraps to int32"),
    Entry("known_bad.addr_storage_offset_ignored", _A, "base address is the storage's start, not data_ptr()"),
    Entry("known_bad.addr_stride_in_elements", _A, "row stride taken in elements, not bytes"),
    Entry("known_bad.addr_col_from_read_bytes", _A, "slot column = (s % page_size) * read_bytes"),
    # SPEC §2, §4: the hash
    Entry("known_bad.hash_partial_reads_read_bytes", _H, "PARTIAL reads read_bytes instead of 16"),
    Entry("known_bad.hash_partial_reads_8_bytes", _H, "PARTIAL reads 8 bytes instead of 16"),
    Entry("known_bad.hash_big_endian_words", _H, "words are folded big-endian"),
    Entry("known_bad.hash_sources_reversed", _H, "sources are combined in reverse order"),
    Entry("known_bad.hash_combine_without_splitmix", _H, "sources combined by h ^= fold, no splitmix64"),
    Entry("known_bad.hash_signed_state", _H, "splitmix64 shifts as int64, so >> is arithmetic"),
    Entry("known_bad.hash_golden_gamma", _H, "splitmix64 adds the golden-gamma increment"),
    # SPEC §4: launch checks of fingerprint
    Entry("known_bad.launch_cap_skipped_in_fingerprint", _L, "fingerprint skips the 4-source cap, folds 4"),
    Entry("known_bad.launch_none_checks_slots", _L, "mode NONE still checks slot ranges"),
    Entry("known_bad.launch_slot_range_value_error", _L, "an out-of-range slot raises ValueError"),
    Entry("known_bad.launch_cap_after_device_check", _L, "the 4-source cap is checked after the device check"),
    # SPEC §8: launch checks of write and verify
    Entry("known_bad.launch_disabled_plan_index_checked", _L, "a disabled verify plan is index-checked"),
    Entry("known_bad.launch_source_range_unchecked", _L, "write/verify skip the source capacity check"),
    Entry("known_bad.launch_expected_tensors_unchecked", _L, "write takes expected tensors with the assert off"),
    # SPEC §6-§7: the hash chain
    Entry("known_bad.chain_slot0_verified", _C, "verify checks padding slot 0 instead of skipping it"),
    Entry("known_bad.chain_prev0_is_anchor", _C, "prev slot 0 is taken as the anchor, not 'unchecked'"),
    Entry("known_bad.chain_xor_then_mix", _C, "chain step is splitmix64(a ^ b ^ c), not mix3"),
    Entry("known_bad.chain_real_kv_folded", _C, "write folds real_kv_hash into the chain"),
    Entry("known_bad.chain_advances_on_expected", _C, "the chain advances on expected, not actual, values"),
    Entry("known_bad.chain_position_assert_unseeded", _C, "the position assert runs for anchor-started requests"),
    Entry("known_bad.chain_write_skips_slot0", _C, "write skips slot 0 as if it were padding"),
    Entry("known_bad.chain_token_checked_without_flag", _C, "verify checks tokens with the flag off"),
    # SPEC §5: the violation ring
    Entry("known_bad.ring_wraps", _R, "the ring wraps around instead of filling once"),
    Entry("known_bad.ring_index_stops_at_capacity", _R, "the write index stops at the capacity"),
    # SPEC §6-§7: the run counters
    Entry("known_bad.counters_num_valid_unclamped", _K, "verify_num_valid is not clamped to [0, cap]"),
    Entry("known_bad.counters_skipped_entries_counted", _K, "slot_run_counter counts -1 entries"),
    Entry("known_bad.counters_padding_not_counted", _K, "slot_run_counter leaves out padding entries"),
    Entry("known_bad.counters_kernel_run_only_when_enabled", _K, "a disabled verify is not counted"),
    Entry("known_bad.counters_kernel_run_per_request", _K, "kernel_run_counter counts write requests"),
)
# fmt: on
