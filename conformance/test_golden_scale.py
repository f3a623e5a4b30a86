"""Golden vectors at engine scale (conformance/golden/scale.json): the implementation reproduces
every stored hash and digest exactly.

Each vector is a recipe that ``conformance.golden.scale_scenarios.expand`` turns into the
usual descriptions, and what the reference computed for it (``python -m conformance.golden``):
the hash of every slot of a fingerprint call, or a write/verify scenario's final state with
its records as their sha256. On a mismatch the reference's full state is computed again, so
the failure names every differing slot and field, not only the digest. This module is slow
under Triton's CPU interpreter (a 4096-token write is one serial chain), so the gate does not
run it whole on every mutant (it is not one of ``strength.gate.QUICK_MODULES``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance import golden
from conformance.assertions import fail, hexu, to_numpy
from conformance.golden.scale_scenarios import expand, recipe_layouts
from conformance.report import rerun_command
from conformance.support import materialize_all, missing_dtypes, mode_name
from conformance.write_verify_support import (
    differences,
    implementation_outcome,
    reference_outcome,
)

SCALE = golden.load(golden.SCALE_FILE)

#: Differing slots (or fields) named in one failure message.
SHOWN = 12


def _param(vector: dict):
    marks = [pytest.mark.write_verify] if vector["recipe"]["kind"] == "write_verify" else []
    return pytest.param(vector, id=vector["id"], marks=marks)


def _repro(vector: dict, rerun_options: str) -> str:
    """The lines that rerun the vector's test, pasted as printed from the run's folder."""
    command = rerun_command(f"conformance/test_golden_scale.py::test_scale_vector[{vector['id']}]")
    return "\n".join(
        [
            f"    {command} \\",
            f"        {rerun_options}",
            f"    # vector {vector['id']!r} of conformance/golden/{golden.SCALE_FILE}, made by "
            f"{golden.COMMAND}",
        ]
    )


def _fingerprint_problems(impl, device, recipe: dict, want: list[str]) -> list[str]:
    case = expand(recipe)
    made = materialize_all(case.layouts, device, shared=case.shared)
    sources = [m.build(impl) for m in made]
    slots = torch.tensor(case.slots, dtype=torch.int64, device=device)
    got = to_numpy(impl.fingerprint(sources, slots, mode=impl.RealKvHashMode(case.mode)))
    call = f"fingerprint(mode={mode_name(case.mode)}, {len(sources)} sources)"
    if got.dtype != np.int64 or got.shape != (len(case.slots),):
        return [f"{call} returned dtype {got.dtype} shape {got.shape}, want int64 [{len(want)}]"]
    got_hex = [hexu(h) for h in got]
    wrong = [i for i, (g, w) in enumerate(zip(got_hex, want, strict=True)) if g != w]
    if not wrong:
        return []
    problems = [
        f"entry {i} (slot {case.slots[i]}): hash got {got_hex[i]}, want {want[i]}"
        for i in wrong[:SHOWN]
    ]
    if len(wrong) > SHOWN:
        problems.append(f"... and {len(wrong) - SHOWN} more")
    problems.append(f"{len(wrong)} of {len(want)} slots of {call} differ")
    fresh = golden.fingerprint_hashes(case.layouts, case.slots, case.mode, shared=case.shared)
    if fresh == got_hex:
        problems.append(_stale())
    elif fresh != want:
        problems.append("the reference, recomputed now, agrees with neither")
    return problems


def _stale() -> str:
    return (
        "the implementation equals the reference recomputed now: the stored vector is stale "
        f"(regenerate with `{golden.COMMAND} --write` if the change is deliberate)"
    )


def _write_verify_problems(impl, device, recipe: dict, want: dict) -> list[str]:
    world, steps = expand(recipe)
    ops = [op for op, _ in steps]
    outcome = implementation_outcome(impl, world, steps, device)
    got = outcome.digested()
    problems = differences(got, want, ops)
    if not problems and not outcome.stray:
        return []
    # A digest says only that the records differ: run the reference again, and name every
    # slot and field where the implementation's full state differs from the reference's.
    fresh = reference_outcome(world, steps)
    detail = differences(outcome.stored(), fresh.stored(), ops)
    if not detail:
        return [*problems, *outcome.stray, _stale()]
    lines = [*detail, *outcome.stray]
    if got["records_sha256"] != want["records_sha256"]:
        lines.append(
            f"(records_sha256 got {got['records_sha256'][:16]}..., "
            f"stored {want['records_sha256'][:16]}...)"
        )
    if fresh.digested() != want:
        lines.append("the reference, recomputed now, differs from the stored vector too")
    return lines


def scale_problems(impl, device, vector: dict) -> list[str]:
    """How ``impl``'s results on ``device`` differ from ``vector``'s stored ones, one line per
    difference (none: reproduced exactly)."""
    recipe, want = vector["recipe"], vector["expected"]
    if recipe["kind"] == "fingerprint":
        return _fingerprint_problems(impl, device, recipe, want["hashes"])
    return _write_verify_problems(impl, device, recipe, want)


@pytest.mark.parametrize("vector", [_param(v) for v in SCALE])
def test_scale_vector(impl, rerun_options, device, vector):
    """Every scale vector's stored hashes, or final records digest, ring rows, write indices and counters, are reproduced exactly."""
    missing = missing_dtypes(recipe_layouts(vector["recipe"]))
    if missing:
        pytest.skip(f"torch {torch.__version__} has no {', '.join(missing)}")
    problems = scale_problems(impl, device, vector)
    if problems:
        fail(
            f"golden vector {vector['id']} differs from the reference's result in "
            f"conformance/golden/{golden.SCALE_FILE}\n  ({vector['what']}):\n  "
            + "\n  ".join(problems),
            repro=_repro(vector, rerun_options),
        )
