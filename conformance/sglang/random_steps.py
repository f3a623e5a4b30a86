"""The random engine histories the SGLang legs' memory and radix tree self-tests draw
(``conformance/sglang/memory.py``, ``conformance/sglang/radix_tree.py``): one step at a time,
each an admission, a prefill chunk, a decode, a target verify or an event picking a request,
chosen by a seeded generator.
"""

from __future__ import annotations

import numpy as np

from engine_model import Engine

__all__ = ["STEPS", "random_step"]

#: The steps of the random histories the departures checks make.
STEPS = ("admit", "prefill", "decode", "finish", "retract", "readmit")


def random_step(engine: Engine, rng: np.random.Generator, ops: tuple = STEPS) -> str:
    """One step of ``ops`` drawn by ``rng``: an admission (sharing a cached prefix or not), a
    prefill chunk, a decode, a target verify, a twin of a cached prefix, or an event picking a
    request; its name."""
    what, a, b = int(rng.integers(0, len(ops))), int(rng.integers(0, 10)), int(rng.integers(0, 4))
    op = ops[what]
    if op == "admit":
        engine.admit(a + 2, b)
    elif op == "prefill":
        engine.prefill(a + 1)
    elif op == "decode":
        engine.decode()
    elif op == "verify":  # EAGLE's target verify: spec v2 allocates past what it writes
        engine.target_verify(2 + b % 2, a)
    elif op == "twin":  # a cached prefix computed again, as by two requests arriving together
        engine.admit_twin(a, 1 + b % 3)
    else:
        getattr(engine, op)(a)
    return str(op)
