"""The suite's properties spend their examples where something can fail."""

from __future__ import annotations

import pytest
from hypothesis import settings

import strategies as st_kv
from canary.real_kv_hash import FINGERPRINT_BLOCK
from conformance import profiles
from conformance import test_write_verify as wv
from conformance.test_fingerprint import reading_cases
from reference import RealKvHashMode
from tests.strategies.draws import collect

DRAWS = 100
NON_TRIVIAL_SHARE = 0.8


def nothing_to_get_wrong(case: st_kv.FingerprintCase) -> bool:
    """A fingerprint call that reads no byte: mode NONE, no source or no slot."""
    return case.mode == RealKvHashMode.NONE or not case.layouts or not case.slots


def test_main_fingerprint_property_draws_calls_that_read():
    """At least 80% of the main fingerprint property's draws read KV bytes (it was 31%)."""
    strategy = reading_cases(fills=st_kv.FILLS, **profiles.layout_sizes())
    trivial = collect(strategy, DRAWS, nothing_to_get_wrong)
    share = 1 - sum(trivial) / len(trivial)
    assert share >= NON_TRIVIAL_SHARE, f"only {share:.0%} of {len(trivial)} draws read KV bytes"


def ci_examples_on_cpu() -> int:
    """Examples the main fingerprint property runs under the ci profile on the CPU."""
    return max(2, int(settings.get_profile("ci").max_examples * profiles.CPU_SCALE))


def test_main_fingerprint_property_spans_more_than_one_program_on_the_cpu(monkeypatch):
    """Among the main fingerprint property's draws with the CPU's sizes and the ci profile's
    example count, at least one call has more slots than one kernel program handles, so
    the masking at a block boundary runs on the CPU too (at most 24 slots never needed it)."""
    monkeypatch.setattr(profiles, "ON_CPU", True)  # the CPU's sizes, whatever loaded them
    strategy = reading_cases(fills=st_kv.FILLS, **profiles.layout_sizes())
    lengths = collect(strategy, ci_examples_on_cpu(), lambda case: len(case.slots))
    longest = max(lengths)
    assert longest > FINGERPRINT_BLOCK, (
        f"the longest of {len(lengths)} draws has {longest} slots; one program takes "
        f"{FINGERPRINT_BLOCK}"
    )


# Write and verify (CONTRACT §5-§7): each property's draws, as descriptions, and what makes one
# of them able to fail. A predicate's docstring says what "non-trivial" means for its property.


def writes_into_what_it_reads(case: wv.Written) -> bool:
    """At least one entry a correct launch writes, and a source when the mode reads KV."""
    return bool(case.chains) and (
        case.world.mode == RealKvHashMode.NONE or bool(case.world.sources)
    )


def checks_an_entry(case: wv.VerifyCase) -> bool:
    """At least one entry the verify launch checks (enabled, below num_valid, slot not 0)."""
    return any(slot != 0 for slot in case.plan.slots[: case.plan.active])


def corruption_can_show(case: wv.VerifyCase) -> bool:
    """The corruption hits a written slot's canary field or record, or a KV byte a written
    slot reads (a page swap of two different rows), so it can change what verify reports."""
    corruption = case.corruption
    if corruption is None:
        return False
    if corruption.kind == "page_swap":
        return corruption.slot != corruption.other
    return corruption.kind in ("field", "kv_inside", "stale") and checks_an_entry(case)


def bytes_outside_to_change(case: wv.VerifyCase) -> bool:
    """Sources with bytes outside every read window, and an entry verify checks."""
    sources = case.written.world.sources
    outside = any(st_kv.outside_byte_offsets(layout).size for layout in sources)
    return outside and checks_an_entry(case)


def disabled_plan_has_work(case: wv.VerifyCase) -> bool:
    """num_valid reaches an entry, so an enabled launch would have work (and refuse it)."""
    return min(max(case.plan.num_valid, 0), case.plan.capacity) >= 1


def machine_world_reads_kv(world: st_kv.CanaryWorld) -> bool:
    """The state machine's world reads KV bytes, so its KV corruptions can be drawn."""
    return world.reads_kv


#: (property, its draws, non-trivial)
WRITE_VERIFY_DRAWS = (
    ("test_write_equals_reference", lambda: wv.written_worlds(), writes_into_what_it_reads),
    ("test_verify_equals_reference", wv.verify_cases, checks_an_entry),
    ("test_write_then_verify_is_clean", wv.clean_cases, checks_an_entry),
    ("test_each_corruption_is_reported_exactly", wv.corruption_cases, corruption_can_show),
    ("test_bytes_outside_read_windows_never_report", wv.outside_cases, bytes_outside_to_change),
    ("test_ring_is_fill_once_and_counts_past_capacity", wv.ring_cases, checks_an_entry),
    ("test_disabled_verify_only_counts_the_launch", wv.disabled_cases, disabled_plan_has_work),
    (
        "test_state_machine_of_writes_corruptions_and_verifies",
        wv.machine_worlds,
        machine_world_reads_kv,
    ),
)


def non_trivial_share(strategy, non_trivial) -> float:
    """The share of :data:`DRAWS` derandomized draws of ``strategy`` that are ``non_trivial``."""
    seen = collect(strategy, DRAWS, non_trivial)
    return sum(seen) / len(seen)


@pytest.mark.parametrize(
    "strategy, non_trivial",
    [pytest.param(strategy, check, id=name) for name, strategy, check in WRITE_VERIFY_DRAWS],
)
def test_write_verify_draws_can_fail(monkeypatch, strategy, non_trivial):
    """At least 80% of each write/verify property's draws, with the CPU's sizes, are
    non-trivial as its predicate defines (before the draws held what the properties need,
    assume() threw examples away after their launches ran)."""
    monkeypatch.setattr(profiles, "ON_CPU", True)
    share = non_trivial_share(strategy(), non_trivial)
    assert share >= NON_TRIVIAL_SHARE, (
        f"only {share:.0%} of {DRAWS} draws are non-trivial: {non_trivial.__doc__}"
    )


def test_kv_corruptions_are_the_bulk_of_the_corruption_property(monkeypatch):
    """Most draws of test_each_corruption_is_reported_exactly corrupt KV bytes (a changed
    byte or a page swap) in a world that reads them (it was 28%)."""
    monkeypatch.setattr(profiles, "ON_CPU", True)
    kinds = collect(wv.corruption_cases(), DRAWS, lambda case: case.corruption.kind)
    kv = sum(kind in wv.KV_CORRUPTIONS for kind in kinds) / len(kinds)
    assert kv > 0.5, f"only {kv:.0%} of {DRAWS} corruptions are KV ones: {sorted(set(kinds))}"
