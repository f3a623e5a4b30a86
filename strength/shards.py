"""A correct implementation's whole-suite run in shards: the suite's modules dealt out to
``shards`` runs of their own, so that the gate's jobs end together (``strength.gate
--shards``).

The whole suite on canary is the longest run of the gate; run as one, it keeps one core busy
long after the mutants, which are short, have left the other idle. Its modules are dealt
heaviest first, each to the shard with the fewest seconds so far, by :data:`MODULE_SECONDS`; the
gate merges the shards' results into one row (:func:`strength.gate.merge_shards`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MODULE_SECONDS", "split"]

#: Seconds of each suite module's run on canary under the Triton interpreter, in a CPU run of
#: the ``mutation`` profile (pytest's durations summed per module, rounded); a module not
#: listed counts 1. Only how evenly the shards end depends on them.
MODULE_SECONDS = {
    "test_engine.py": 145,
    "test_write_verify.py": 38,
    "test_plan.py": 33,
    "test_scale.py": 33,
    "test_golden_scale.py": 17,
    "test_fingerprint.py": 15,
    "test_golden.py": 3,
    "test_launch_refusals.py": 2,
    "test_source_validation.py": 2,
}


def split(paths: Sequence[str], shards: int) -> list[list[str]]:
    """``paths`` (suite modules, ``conformance/test_x.py``) in ``shards`` lists, each in the
    order of ``paths``: the modules dealt heaviest first, each to the lightest shard so far
    (ties to the first). Every module is in exactly one list; a list may be empty when there are
    fewer modules than shards."""
    if shards < 1:
        raise ValueError(f"shards must be at least 1, not {shards}")

    def seconds(path: str) -> int:
        return MODULE_SECONDS.get(path.rsplit("/", 1)[-1], 1)

    loads = [0] * shards
    home: dict[str, int] = {}
    for path in sorted(paths, key=seconds, reverse=True):
        shard = loads.index(min(loads))
        home[path] = shard
        loads[shard] += seconds(path)
    return [[path for path in paths if home[path] == shard] for shard in range(shards)]
