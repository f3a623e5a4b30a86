"""Golden vectors (conformance/golden/*.json): the implementation reproduces every stored result.

The vectors were computed by the reference (``python -m conformance.golden``); a mismatch
here is either a bug in the implementation or an unannounced change of the format.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance import golden
from conformance.assertions import assert_int64_equal, fail, from_hexu
from conformance.report import rerun_command
from conformance.support import materialize_all, missing_dtypes, mode_name
from conformance.write_verify_support import differences, implementation_write_verify

FINGERPRINT = golden.load(golden.FINGERPRINT_FILE)
WRITE_VERIFY = golden.load(golden.WRITE_VERIFY_FILE)


def _repro(test: str, vector: dict, rerun_options: str) -> str:
    """The lines that rerun the vector's test, pasted as printed from the run's folder."""
    command = rerun_command(f"conformance/test_golden.py::{test}[{vector['id']}]")
    return "\n".join(
        [
            f"    {command} \\",
            f"        {rerun_options}",
            f"    # vector {vector['id']!r} of conformance/golden/, made by {golden.COMMAND}",
        ]
    )


def _skip_missing_dtypes(vector: dict) -> None:
    missing = missing_dtypes(golden.layouts_of(vector))
    if missing:
        pytest.skip(f"torch {torch.__version__} has no {', '.join(missing)}")


@pytest.mark.parametrize("vector", FINGERPRINT, ids=[v["id"] for v in FINGERPRINT])
def test_fingerprint_vector(impl, rerun_options, device, vector):
    """fingerprint returns the stored hash of every slot of every golden vector, bit for bit."""
    _skip_missing_dtypes(vector)
    layouts, backings = golden.sources_of(vector)
    made = materialize_all(layouts, device, shared=vector["shared"], backings=backings)
    sources = [m.build(impl) for m in made]
    slots = torch.tensor(vector["slots"], dtype=torch.int64, device=device)
    got = impl.fingerprint(sources, slots, mode=impl.RealKvHashMode(vector["mode"]))
    want = np.array([from_hexu(h) for h in vector["hashes"]], dtype=np.int64)
    assert_int64_equal(
        got,
        want,
        call=f"golden vector {vector['id']} ({vector['what']}): "
        f"fingerprint(mode={mode_name(vector['mode'])}, {len(sources)} sources)",
        config=f"stored in conformance/golden/{golden.FINGERPRINT_FILE}",
        repro=_repro("test_fingerprint_vector", vector, rerun_options),
        labels=[f"slot {s}" for s in vector["slots"]],
    )


@pytest.mark.write_verify
@pytest.mark.parametrize("vector", WRITE_VERIFY, ids=[v["id"] for v in WRITE_VERIFY])
def test_write_verify_vector(impl, rerun_options, device, vector):
    """After a golden scenario, the canary records, the stored ring rows, the write index after each step and both counters are the stored ones, and nothing else changed."""
    _skip_missing_dtypes(vector)
    steps = golden.steps_of(vector)
    got, stray = implementation_write_verify(impl, golden.world_of(vector), steps, device)
    problems = differences(got, vector["expected"], [op for op, _ in steps]) + stray
    if problems:
        fail(
            f"golden vector {vector['id']} differs from the reference's result in "
            f"conformance/golden/{golden.WRITE_VERIFY_FILE}\n  ({vector['what']}):\n  "
            + "\n  ".join(problems),
            repro=_repro("test_write_verify_vector", vector, rerun_options),
        )
