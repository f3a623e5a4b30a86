"""Hypothesis strategies for the KV canary, usable like ``hypothesis.extra.numpy``.

Configurations are drawn as plain frozen dataclasses; :mod:`strategies.materialize` is the
one place that turns them into torch tensors on a device and numpy rows for the reference.

- :func:`source_layouts`, :func:`source_tuples`: valid RealKvSource layouts (SPEC §3).
- :func:`slot_indices`, :func:`modes`: what ``fingerprint`` is asked about (SPEC §4).
- :func:`materialize`, :func:`materialize_shared`: layouts made real, with the byte offsets
  a canary reads (:func:`window_byte_offsets`) and must never read
  (:func:`outside_byte_offsets`).
- :func:`invalid_source_cases`, :func:`multi_invalid_source_cases`: arguments that break
  SPEC §3 rules, with the exact error expected.
- :func:`describe`: any ``tensor=`` object as a torch-free ``reference.SourceDescription``.

Typical use::

    import strategies as st_kv

    @given(layout=st_kv.source_layouts(), data=st.data())
    def test_fingerprint(layout, data):
        src = st_kv.materialize(layout, "cpu")
        slots = data.draw(st_kv.slot_indices(layout.capacity), label="slots")
        ...
"""

from strategies.invalid import (
    FIELDS,
    InvalidSourceCase,
    ObjectSpec,
    invalid_source_cases,
    multi_invalid_source_cases,
)
from strategies.layouts import (
    ELEMENT_SIZES,
    FILLS,
    PARTIAL_READ_BYTES,
    SourceLayout,
    modes,
    outside_byte_offsets,
    slot_indices,
    slot_window_starts,
    source_layouts,
    source_tuples,
    window_byte_offsets,
)
from strategies.materialize import (
    MaterializedSource,
    available_dtypes,
    describe,
    layout_bytes,
    materialize,
    materialize_object,
    materialize_shared,
)

__all__ = [
    "ELEMENT_SIZES",
    "FIELDS",
    "FILLS",
    "PARTIAL_READ_BYTES",
    "InvalidSourceCase",
    "MaterializedSource",
    "ObjectSpec",
    "SourceLayout",
    "available_dtypes",
    "describe",
    "invalid_source_cases",
    "layout_bytes",
    "materialize",
    "materialize_object",
    "materialize_shared",
    "modes",
    "multi_invalid_source_cases",
    "outside_byte_offsets",
    "slot_indices",
    "slot_window_starts",
    "source_layouts",
    "source_tuples",
    "window_byte_offsets",
]
