"""The suite's properties spend their examples where something can fail."""

from __future__ import annotations

from draws import collect
from hypothesis import settings

import strategies as st_kv
from canary.real_kv_hash import FINGERPRINT_BLOCK
from conformance import profiles
from conformance.test_fingerprint import reading_cases

DRAWS = 100
NON_TRIVIAL_SHARE = 0.8


def nothing_to_get_wrong(case: st_kv.FingerprintCase) -> bool:
    """A fingerprint call that reads no byte: mode NONE, no source or no slot."""
    return case.mode == 0 or not case.layouts or not case.slots


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
