"""The engine model: the oracle of a serving engine's bookkeeping around its KV cache.

As :mod:`reference` is the oracle of the canary's kernels, this package is the oracle of the
state an engine's canary runtime reads: the page table, the slot pools, the prefix cache, the
forward modes and the KV that moves without a forward, step by step, as plain numpy data
(torch-free and deterministic). :mod:`engine_model.engine` holds the :class:`Engine`, composed
of one part per concern (:mod:`~engine_model.state`, :mod:`~engine_model.allocators`,
:mod:`~engine_model.prefix_cache`, :mod:`~engine_model.eviction`,
:mod:`~engine_model.forwards`, :mod:`~engine_model.moves`),
with its configuration in :mod:`engine_model.config`, the hooks its fault classes arm in
:mod:`engine_model.hooks`, and the steps the suite's driver reads in :mod:`engine_model.steps`;
:mod:`engine_model.faults` the fault classes, each one object that makes its fault in an engine
and says which reports it predicts in each hash mode; :mod:`engine_model.vocabulary` the words
(forward modes, buffer groups, launch stages, step labels). The Hypothesis strategy that draws
an engine's configuration is :func:`strategies.engines.engine_configs`.
"""

from engine_model.config import KV_BYTES, EngineConfig, pick_from
from engine_model.engine import Engine
from engine_model.hooks import EngineHooks
from engine_model.steps import Forward, GroupLaunch, Move, MoveGroup, Sweep, SweepGroup
from engine_model.vocabulary import FULL, GROUPS, ORACLE_MODES, PREFILL_ENGINE, STAGES, SWA

__all__ = [
    "FULL",
    "GROUPS",
    "KV_BYTES",
    "ORACLE_MODES",
    "PREFILL_ENGINE",
    "STAGES",
    "SWA",
    "Engine",
    "EngineConfig",
    "EngineHooks",
    "Forward",
    "GroupLaunch",
    "Move",
    "MoveGroup",
    "Sweep",
    "SweepGroup",
    "pick_from",
]
