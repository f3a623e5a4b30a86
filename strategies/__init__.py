"""Hypothesis strategies for the KV canary, usable like ``hypothesis.extra.numpy``.

Configurations are drawn as plain frozen dataclasses by modules that import no torch
(:mod:`strategies.layouts`, :mod:`strategies.chains`, :mod:`strategies.verify`,
:mod:`strategies.invalid`, :mod:`strategies.sizes`); :mod:`strategies.materialize` is the one
module that imports torch and turns them into tensors on a device and numpy rows for the
reference; it runs no implementation. The modules import one another in one direction only:
``sizes`` <- ``layouts`` <- ``chains`` <- ``verify`` <- ``materialize`` (``sizes`` <- ``batches``), and ``invalid`` uses
``materialize`` only where it draws (``tests/test_imports.py`` checks both). This package
re-exports all of them, so ``import strategies`` itself loads torch.

- :func:`source_layouts`, :func:`source_tuples`: valid RealKvSource layouts (CONTRACT §3).
- :func:`slot_indices`, :func:`modes`: what ``fingerprint`` is asked about (CONTRACT §4).
- :func:`layout`, :func:`world`: one fixed layout or world from a few fields, the rest at
  plain defaults.
- :func:`materialize`, :func:`materialize_shared`: layouts made real, with the byte offsets
  a canary reads (:func:`window_byte_offsets`) and must never read
  (:func:`outside_byte_offsets`).
- :func:`invalid_source_cases`, :func:`multi_invalid_source_cases`: arguments that break
  CONTRACT §3 rules, with the exact error expected.
- :func:`canary_worlds`, :func:`write_batches` (``chains``), :func:`verify_batches`,
  :func:`corruptions` (``verify``): write/verify launches (CONTRACT §5-§7) as plain data; :func:`materialize_world` and
  :func:`apply_corruption` make them real (a launch's arguments, and the reports a corruption
  must cause, are the suite's: ``conformance.write_verify_support``).
- :func:`engine_batches`, :func:`scatter_batches` (``batches``): an engine's batch state for
  the plan kernel (CONTRACT §12: page tables, prefill, chunked prefill, decode and padding rows,
  SWA windows and tables, expected-token pools, capacities) and expected-token scatters (§13),
  as descriptions whose arrays come from a seed; :func:`plan_faults`, :func:`scatter_faults`:
  one broken argument each, for every check of §12 and §13.
- :func:`describe`: any ``tensor=`` object as a torch-free ``reference.SourceDescription``.
- :func:`sizes`: sizes that aim at the edges scale bugs live at (``2^k +- 1``, multiples of a
  block); every scaled dimension of the strategies above is drawn through it.

Typical use::

    import strategies as st_kv

    @given(layout=st_kv.source_layouts(), data=st.data())
    def test_fingerprint(layout, data):
        src = st_kv.materialize(layout, "cpu")
        slots = data.draw(st_kv.slot_indices(layout.capacity), label="slots")
        ...
"""

import sys

from strategies.batches import *  # noqa: F403
from strategies.chains import *  # noqa: F403
from strategies.invalid import *  # noqa: F403
from strategies.layouts import *  # noqa: F403
from strategies.materialize import *  # noqa: F403
from strategies.sizes import *  # noqa: F403
from strategies.verify import *  # noqa: F403

#: The package's public names: each submodule's own ``__all__``, defined there once.
__all__ = [
    name
    for module in ("batches", "chains", "invalid", "layouts", "materialize", "sizes", "verify")
    for name in sys.modules[f"strategies.{module}"].__all__
]
