"""Golden vectors: fixed scenarios, their results from the reference, stored as JSON in this
folder. This module is their codec: descriptions as plain JSON data and back, the files'
text (:func:`render`), and how stored files differ from it (:func:`changes`); the command
line is ``__main__``.

    python -m conformance.golden            # say what regenerating would change; write nothing
    python -m conformance.golden --write    # regenerate conformance/golden/*.json
    python -m conformance.golden --check    # exit 1 if regenerating would change any file

Every scenario is listed by hand (:mod:`conformance.golden.fingerprint_scenarios`,
:mod:`conformance.golden.write_verify_scenarios`) as plain ``strategies`` descriptions
(:class:`~strategies.SourceLayout`, :class:`~strategies.CanaryWorld`,
:class:`~strategies.WriteBatch`, :class:`~strategies.VerifyBatch`,
:class:`~strategies.Corruption`), or (:mod:`conformance.golden.scale_scenarios`) as a recipe
that expands into them; nothing is drawn by Hypothesis. Each is stored with a stable ``id``,
a one-line ``what``, its description (or recipe) as plain dicts and what ``reference``
computes for it, so the JSON alone plus ``strategies``' materialization rebuilds every input;
``conformance/test_golden.py`` and ``conformance/test_golden_scale.py`` then have the
implementation under test reproduce every stored result exactly. Any change to a stored hash
is therefore a deliberate format change.

- ``fingerprint.json``: sources (a layout, or a layout whose backing bytes are given
  explicitly as ``backing_hex``, as for the CONTRACT §2 vectors), whether they share one
  per-layer pool, slots, mode, and the hash of every slot as u64 hex.
- ``write_verify.json``: a world, a list of steps (``write``, ``corrupt``, ``verify``, and
  ``preset``: records the reference writes, given to the world without a launch), and the
  final state: the four fields of every canary slot as u64 hex, the whole ring as u64 hex
  with the rows each launch stored sorted (their order inside a launch is unspecified), the
  write index after every step, and both run counters.
- ``plan.json``: plan and scatter scenarios (CONTRACT §12, §13) as
  :class:`~strategies.batches.EngineBatch` and :class:`~strategies.batches.ScatterBatch`
  descriptions (:mod:`conformance.golden.plan_scenarios`), whose arrays come from their seed,
  and what the reference makes of them: every field of both plans (filled in over the suite's
  first contents, :func:`conformance.plan_support.prefilled`), or the pool after a scatter, as
  int lists, or as the sha256 of the little-endian int array where one is longer than 64
  (the 4096-row, 70,000-entry batch). ``conformance/test_golden_plan.py`` replays them.
- ``scale.json``: engine-sized scenarios (pages of 96 and 128 slots, pools past 2^16 slots,
  a 4096-token prefill, 300 decode requests, a verify of 33,000 entries), too large to store
  as descriptions or results: each is a *recipe*, a small dict of a ``kind`` and a few ints
  (sizes and seeds) that :func:`conformance.golden.scale_scenarios.expand` turns into the
  usual descriptions with numpy's ``default_rng(seed)`` alone, and ``expected``, what the
  reference computes, as hashes and digests: for a fingerprint the hash of every slot as u64
  hex (its slot list is short); for a write/verify scenario ``records_sha256`` (the sha256 of
  the final records as little-endian int64 ``[num_slots, 4]``), the stored ring rows (u64
  hex, sorted within each launch), the write index after every step (and the last one as
  ``write_index``) and both run counters. ``conformance/test_golden_scale.py`` has the
  implementation reproduce them.

The vectors pin the byte fills too. Layout bytes come from
``strategies.materialize.layout_bytes`` and a world's initial buffer, ring and counters from
``strategies.materialize_world``, both drawn from numpy's ``default_rng`` for a seed. numpy
keeps that stream stable across releases; should it ever change, the stored inputs change
with it, and regenerating is a deliberate step: check first that the explicit-byte vectors
(which use no random fill) did not move. A layout's dtype only changes how torch views the
bytes, so the files do not depend on the torch version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from conformance.assertions import hexu
from conformance.golden.fingerprint_scenarios import fingerprint_scenarios
from conformance.golden.plan_scenarios import engine_scale, plan_scenarios, scatter_scenarios
from conformance.golden.scale_scenarios import expand, scale_scenarios
from conformance.golden.write_verify_scenarios import write_verify_scenarios
from conformance.support import materialize_all, reference_fingerprint, reference_sources
from conformance.write_verify_support import reference_outcome, reference_write_verify
from strategies import CanaryWorld, Corruption, SourceLayout, VerifyBatch, WriteBatch, WriteRequest
from strategies.batches import EngineBatch, RowSpec, ScatterBatch

__all__ = [
    "COMMAND",
    "FILES",
    "FINGERPRINT_FILE",
    "FORMAT_VERSION",
    "GOLDEN_DIR",
    "PLAN_FILE",
    "SCALE_FILE",
    "batch_of",
    "scatter_of",
    "stored_array",
    "WRITE_VERIFY_FILE",
    "changes",
    "fingerprint_hashes",
    "layouts_of",
    "load",
    "plain",
    "render",
    "scale_expected",
    "sources_of",
    "steps_of",
    "world_of",
]

GOLDEN_DIR = Path(__file__).resolve().parent
FINGERPRINT_FILE = "fingerprint.json"
WRITE_VERIFY_FILE = "write_verify.json"
SCALE_FILE = "scale.json"
PLAN_FILE = "plan.json"
FILES = (FINGERPRINT_FILE, WRITE_VERIFY_FILE, SCALE_FILE, PLAN_FILE)
FORMAT_VERSION = 1
COMMAND = "python -m conformance.golden"


# ---------------------------------------------------------------------------------------------
# Descriptions as plain JSON data, and back.


def plain(value):
    """Descriptions (dataclasses) inside ``value`` as JSON data: dicts, lists and numbers."""
    if dataclasses.is_dataclass(value):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def _layout_from(data: dict) -> SourceLayout:
    return SourceLayout(**{**data, "row_shape": tuple(data["row_shape"])})


def _world_from(data: dict) -> CanaryWorld:
    return CanaryWorld(**{**data, "sources": tuple(_layout_from(s) for s in data["sources"])})


def _write_batch_from(data: dict) -> WriteBatch:
    return WriteBatch(
        requests=tuple(
            WriteRequest(
                seed=r["seed"],
                slots=tuple(r["slots"]),
                tokens=tuple(r["tokens"]),
                positions=tuple(r["positions"]),
            )
            for r in data["requests"]
        ),
        num_valid=data["num_valid"],
        padding=tuple(tuple(p) for p in data["padding"]),
        input_assert=data["input_assert"],
        expected_tokens=tuple(data["expected_tokens"]),
        expected_positions=tuple(data["expected_positions"]),
        leading=tuple(tuple(p) for p in data.get("leading", ())),
    )


def _verify_batch_from(data: dict) -> VerifyBatch:
    return VerifyBatch(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _steps_from(steps: Sequence[dict]) -> list[tuple[str, object]]:
    """``[{op: description}, ...]`` back to ``(op, WriteBatch | VerifyBatch | Corruption)``."""
    parsers = {
        "write": _write_batch_from,
        "preset": _write_batch_from,
        "verify": _verify_batch_from,
        "corrupt": lambda data: Corruption(**data),
    }
    parsed = []
    for step in steps:
        ((op, data),) = step.items()
        parsed.append((op, parsers[op](data)))
    return parsed


def sources_of(vector: dict) -> tuple[list[SourceLayout], list[bytes | None]]:
    """A fingerprint vector's layouts, and each one's explicit backing bytes (or None)."""
    layouts = [_layout_from(s["layout"]) for s in vector["sources"]]
    backings = [
        bytes.fromhex(s["backing_hex"]) if "backing_hex" in s else None for s in vector["sources"]
    ]
    return layouts, backings


def world_of(scenario: dict) -> CanaryWorld:
    """A write/verify scenario's world."""
    return _world_from(scenario["world"])


def steps_of(scenario: dict) -> list[tuple[str, object]]:
    """A write/verify scenario's steps as ``(op, WriteBatch | VerifyBatch | Corruption)``."""
    return _steps_from(scenario["steps"])


def layouts_of(vector: dict) -> list[SourceLayout]:
    """The source layouts of any vector: a fingerprint vector's, or a scenario world's."""
    return list(world_of(vector).sources) if "world" in vector else sources_of(vector)[0]


# ---------------------------------------------------------------------------------------------
# Files.

_ABOUT = (
    "Golden vectors of the KV canary, computed by the reference. Do not edit: regenerate with "
    f"`{COMMAND} --write` (see conformance/README.md)."
)


def _document(kind: str, vectors: list[dict]) -> str:
    ids = [v["id"] for v in vectors]
    if len(set(ids)) != len(ids):
        raise ValueError(f"duplicate {kind} vector ids")
    doc = {"about": _ABOUT, "format": FORMAT_VERSION, "kind": kind, "vectors": vectors}
    return _dumps(doc) + "\n"


def _dumps(value, depth: int = 0) -> str:
    """Deterministic JSON: sorted keys, one line per dict item or list of containers, lists
    of plain values (a record, a ring row, a slot list) kept on one line so diffs stay short."""
    outer, inner = " " * depth, " " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [
            f"{inner}{json.dumps(key, ensure_ascii=False)}: {_dumps(value[key], depth + 1)}"
            for key in sorted(value)
        ]
        return "{\n" + ",\n".join(items) + "\n" + outer + "}"
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        items = [inner + _dumps(v, depth + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + outer + "]"
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def fingerprint_hashes(layouts, slots, mode, *, shared=False, backings=None) -> list[str]:
    """The reference's hash of every slot of one fingerprint call, as u64 hex."""
    made = materialize_all(layouts, "cpu", shared=shared, backings=backings)
    return [hexu(h) for h in reference_fingerprint(reference_sources(made), slots, mode)]


def _hashes(vector: dict) -> list[str]:
    """The reference's hash of every slot of a fingerprint vector, as u64 hex."""
    layouts, backings = sources_of(vector)
    return fingerprint_hashes(
        layouts, vector["slots"], vector["mode"], shared=vector["shared"], backings=backings
    )


def scale_expected(recipe: dict) -> dict:
    """What the reference computes for a scale recipe, as ``scale.json`` stores it: the
    ``hashes`` of a fingerprint's slots, or a write/verify scenario's final state with its
    records as their sha256 (:meth:`~conformance.write_verify_support.Outcome.digested`)."""
    if recipe["kind"] == "fingerprint":
        case = expand(recipe)
        return {
            "hashes": fingerprint_hashes(case.layouts, case.slots, case.mode, shared=case.shared)
        }
    world, steps = expand(recipe)
    return reference_outcome(world, steps).digested()


def batch_of(vector: dict) -> EngineBatch:
    """A plan vector's batch: its description, or what its recipe makes
    (:func:`conformance.golden.plan_scenarios.engine_scale`)."""
    if "recipe" in vector:
        return engine_scale(**vector["recipe"])
    data = vector["batch"]
    return EngineBatch(**{**data, "rows": tuple(RowSpec(*row) for row in data["rows"])})


def _plain_batch(batch: EngineBatch) -> dict:
    """A batch as JSON data, each row one list ``[kind, pool_row, prefix, extend, valid_len]``."""
    data = plain(batch)
    return {
        **data,
        "rows": [[r[f.name] for f in dataclasses.fields(RowSpec)] for r in data["rows"]],
    }


def scatter_of(vector: dict) -> ScatterBatch:
    """A scatter vector's scatter."""
    data = vector["scatter"]
    return ScatterBatch(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def stored_array(values: np.ndarray):
    """An int array as ``plan.json`` stores it: a (nested) list, or its sha256 when it holds
    more than 64 values."""
    values = np.ascontiguousarray(values)
    if values.size <= 64:
        return values.tolist()
    data = values.astype(values.dtype.newbyteorder("<")).tobytes()
    return {"dtype": values.dtype.name, "shape": list(values.shape),
            "sha256": hashlib.sha256(data).hexdigest()}  # fmt: skip


def _plan_vectors() -> list[dict]:
    from conformance.plan_support import plan_args, reference_plan, reference_scatter

    vectors = []
    for scenario in plan_scenarios():
        batch = scenario["batch"] if "batch" in scenario else engine_scale(**scenario["recipe"])
        got = reference_plan(plan_args(batch))
        expected = {name: stored_array(got[plan, name]) for plan, name in got}
        if "batch" in scenario:
            scenario = {**scenario, "batch": _plain_batch(scenario["batch"])}
        vectors.append({**scenario, "expected": expected})
    for scenario in scatter_scenarios():
        pool = reference_scatter(scenario["scatter"])
        vectors.append({**plain(scenario), "expected": {"pool_out": stored_array(pool)}})
    return vectors


def render() -> dict[str, str]:
    """The text of every golden file, as regenerating from the reference gives it now."""
    fingerprints = [
        {**vector, "hashes": _hashes(vector)} for vector in map(plain, fingerprint_scenarios())
    ]
    write_verify = [
        {**scenario, "expected": reference_write_verify(world_of(scenario), steps_of(scenario))}
        for scenario in map(plain, write_verify_scenarios())
    ]
    scale = [
        {**scenario, "expected": scale_expected(scenario["recipe"])}
        for scenario in scale_scenarios()
    ]
    return {
        FINGERPRINT_FILE: _document("fingerprint", fingerprints),
        WRITE_VERIFY_FILE: _document("write_verify", write_verify),
        SCALE_FILE: _document("scale", scale),
        PLAN_FILE: _document("plan", _plan_vectors()),
    }


def load(name: str, directory: Path = GOLDEN_DIR) -> list[dict]:
    """The vectors of one stored golden file."""
    return json.loads((directory / name).read_text(encoding="utf-8"))["vectors"]


def _vector_changes(name: str, old_text: str, new_text: str) -> list[str]:
    try:
        old = {v["id"]: v for v in json.loads(old_text)["vectors"]}
    except (ValueError, KeyError, TypeError):
        return [f"{name}: not a golden file now; would be rewritten"]
    new = {v["id"]: v for v in json.loads(new_text)["vectors"]}
    lines = []
    for vid in new:
        if vid not in old:
            lines.append(f"{name}: + {vid} (new)")
        elif old[vid] != new[vid]:
            keys = sorted(
                k for k in new[vid].keys() | old[vid].keys() if old[vid].get(k) != new[vid].get(k)
            )
            lines.append(f"{name}: ~ {vid} ({', '.join(keys)} would change)")
    lines += [f"{name}: - {vid} (removed)" for vid in old if vid not in new]
    return lines or [f"{name}: header or formatting would change"]


def changes(rendered: dict[str, str], directory: Path = GOLDEN_DIR) -> list[str]:
    """One line per difference between ``rendered`` and the files in ``directory``."""
    lines = []
    for name, text in rendered.items():
        path = directory / name
        if not path.exists():
            lines.append(f"{name}: missing; would be created")
            continue
        old = path.read_text(encoding="utf-8")
        if old != text:
            lines += _vector_changes(name, old, text)
    return lines
