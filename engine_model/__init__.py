"""The engine model: the oracle of a serving engine's bookkeeping around its KV cache.

As :mod:`reference` is the oracle of the canary's kernels, this package is the oracle of the
state an engine's canary runtime reads: the page table, the slot pools, the prefix cache, the
forward modes and the KV that moves without a forward, step by step, as plain numpy data
(torch-free and deterministic). :mod:`engine_model.engine` holds the :class:`Engine` and the
steps the suite's driver reads; :mod:`engine_model.faults` the fault classes, each one object
that makes its fault in an engine and says which reports it predicts in each hash mode.
The Hypothesis strategy that draws an engine's configuration is
:func:`strategies.engines.engine_configs`.
"""

from engine_model.engine import *  # noqa: F403
from engine_model.engine import __all__ as _engine_all

__all__ = list(_engine_all)
