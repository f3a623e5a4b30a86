"""The suite's properties spend their examples where something can fail."""

from __future__ import annotations

from draws import collect

import strategies as st_kv
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
