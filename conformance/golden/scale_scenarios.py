"""The golden scale scenarios (``scale.json``): engine-sized inputs stored as small recipes.

A scale scenario's inputs are too large to list by hand or to store (thousands of slots,
pools past 2^16 slots, verify plans of 33,000 entries), so each is a *recipe*: a plain dict of
a ``kind`` and a few ints (sizes and seeds), and :func:`expand` turns it into the usual
descriptions, deterministically, with numpy's ``default_rng(seed)`` alone (no Hypothesis):

- kind ``"fingerprint"``: a :class:`~strategies.FingerprintCase` (layouts, slots, mode,
  shared), like a ``fingerprint.json`` vector. The sources are dense ``strategies.layout``\\ s
  of one geometry; the slots are the in-page indices ``in_page`` of ``rows_sampled`` rows
  (the first and the last row among them), with ``pow2_edges`` the slots ``2^k - 1, 2^k,
  2^k + 1`` of every ``2^k`` below the capacity too, and always the last slot.
- kind ``"write_verify"``: a :class:`~strategies.CanaryWorld` and its steps ``(op,
  description)``, like a ``write_verify.json`` scenario, by its ``plan``:

  - ``"prefill"``: one request of ``tokens`` tokens from the anchor, then a chunked prefill
    of ``chunk`` tokens continuing it from its last slot, then the verify of every written
    entry with ``wrong_positions`` expected positions flipped (one ring row each);
  - ``"decode"``: ``requests`` prefill requests of ``prefill`` tokens, then a launch of one
    decode token per request, each continuing one request's tail (in a shuffled order), then
    the verify of every entry with ``wrong_tokens`` expected tokens flipped;
  - ``"sweep"``: the records of ``requests`` x ``tokens`` written chains laid down by the
    reference (op ``"preset"``, see :mod:`conformance.golden.write_verify_scenarios`), then one
    verify launch of every entry, one in every ``wrong_every`` with a wrong expected position,
    and so are the entries ``2^k - 1`` and ``2^k`` of the largest ``2^k`` below the plan's
    length and its last entry.

  Written slots are a shuffled set of the world's slots other than 0 (verify skips slot 0);
  tokens are random non-zero int64 values other than -1 (an expected token of -1 is not
  checked); positions count from 0 along each chain.

:mod:`conformance.golden` stores each recipe with what the reference computes for it, as
hashes and digests only (``scale.json``); ``conformance/test_golden_scale.py`` has the
implementation reproduce them.
"""

from __future__ import annotations

import numpy as np

import strategies as st_kv
from conformance.golden.write_verify_scenarios import check_steps
from strategies import CanaryWorld, FingerprintCase, VerifyBatch, WriteBatch, WriteRequest

__all__ = [
    "expand",
    "expand_fingerprint",
    "expand_write_verify",
    "recipe_layouts",
    "scale_scenarios",
]

_KINDS = ("fingerprint", "write_verify")
_PLANS = ("prefill", "decode", "sweep")

# Keys of a recipe beyond "kind" (and "plan"): required ones, then optional ones and defaults.
_LAYOUT_KEYS = ("seed", "rows", "page_size", "bytes_per_token", "read_bytes", "mode")
_OPTIONAL = {"sources": 1, "dtype": "uint8"}
_FINGERPRINT_KEYS = (*_LAYOUT_KEYS, "shared", "in_page", "rows_sampled", "pow2_edges")
_WORLD_KEYS = (*_LAYOUT_KEYS, "ring_capacity", "kernel_kind")
_PLAN_KEYS = {
    "prefill": ("tokens", "chunk", "wrong_positions"),
    "decode": ("requests", "prefill", "wrong_tokens"),
    "sweep": ("requests", "tokens", "wrong_every"),
}


def _checked(recipe: dict) -> dict:
    """``recipe`` with its optional keys filled in; a missing or unknown key raises."""
    kind = recipe.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"recipe kind must be one of {_KINDS}, got {kind!r}")
    if kind == "fingerprint":
        required = {"kind", *_FINGERPRINT_KEYS}
    else:
        plan = recipe.get("plan")
        if plan not in _PLANS:
            raise ValueError(f"write_verify recipe plan must be one of {_PLANS}, got {plan!r}")
        required = {"kind", "plan", *_WORLD_KEYS, *_PLAN_KEYS[plan]}
    missing = sorted(required - set(recipe))
    unknown = sorted(set(recipe) - required - set(_OPTIONAL))
    if missing or unknown:
        raise ValueError(f"recipe {recipe!r}: missing keys {missing}, unknown keys {unknown}")
    return {**_OPTIONAL, **recipe}


def _layouts(recipe: dict) -> tuple[st_kv.SourceLayout, ...]:
    """``sources`` dense layouts of the recipe's geometry, source ``i`` with seed ``seed + i``."""
    return tuple(
        st_kv.layout(
            dtype=recipe["dtype"],
            rows=recipe["rows"],
            page_size=recipe["page_size"],
            num_bytes_per_token=recipe["bytes_per_token"],
            read_bytes=recipe["read_bytes"],
            fill="dense",
            seed=recipe["seed"] + i,
        )
        for i in range(recipe["sources"])
    )


def _pow2_edges(capacity: int) -> list[int]:
    """``2^k - 1, 2^k, 2^k + 1`` for every ``2^k < capacity``, ascending, below ``capacity``."""
    edges: set[int] = set()
    power = 1
    while power < capacity:
        edges.update((power - 1, power, power + 1))
        power *= 2
    return sorted(e for e in edges if e < capacity)


def expand_fingerprint(recipe: dict) -> FingerprintCase:
    """The fingerprint call a ``"fingerprint"`` recipe describes."""
    recipe = _checked(recipe)
    if recipe["kind"] != "fingerprint":
        raise ValueError(f"not a fingerprint recipe: {recipe!r}")
    rng = np.random.default_rng(recipe["seed"])
    layouts = _layouts(recipe)
    page, rows = recipe["page_size"], recipe["rows"]
    capacity = page * rows
    if any(not 0 <= i < page for i in recipe["in_page"]):
        raise ValueError(f"in_page {recipe['in_page']} must lie in [0, {page})")
    sampled = min(recipe["rows_sampled"], rows)
    chosen: list[int] = []
    if sampled:
        middle = rng.permutation(np.arange(1, rows - 1))[: max(sampled - 2, 0)]
        chosen = sorted({0, rows - 1, *(int(r) for r in middle)})
    slots = [row * page + i for row in chosen for i in recipe["in_page"]]
    if recipe["pow2_edges"]:
        slots += _pow2_edges(capacity)
    slots.append(capacity - 1)
    return FingerprintCase(layouts, tuple(slots), recipe["mode"], bool(recipe["shared"]))


def _world(recipe: dict, num_slots: int) -> CanaryWorld:
    layouts = _layouts(recipe)
    if any(layout.capacity < num_slots for layout in layouts):
        raise ValueError(f"recipe {recipe!r}: every source must address {num_slots} slots")
    return CanaryWorld(
        sources=layouts,
        mode=recipe["mode"],
        num_slots=num_slots,
        slot_stride_bytes=32,
        ring_capacity=recipe["ring_capacity"],
        ring_start=0,
        kernel_kind=recipe["kernel_kind"],
        chain_assert=1,
        seed=recipe["seed"],
    )


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    """``n`` random int64 tokens, none 0 or -1, of either sign."""
    magnitudes = rng.integers(2, 2**63 - 1, size=n, dtype=np.int64)
    negative = rng.integers(0, 2, size=n).astype(bool)
    return [int(t) for t in np.where(negative, -magnitudes, magnitudes)]


def _request(seed: int, slots, tokens, first_position: int) -> WriteRequest:
    n = len(slots)
    positions = tuple(range(first_position, first_position + n))
    return WriteRequest(int(seed), tuple(int(s) for s in slots), tuple(tokens), positions)


def _from_anchor(slots, tokens, count: int, length: int) -> list[WriteRequest]:
    """``count`` requests of ``length`` entries from the anchor, positions from 0, taking
    ``slots`` and ``tokens`` in order."""
    return [
        _request(-1, slots[r * length : (r + 1) * length], tokens[r * length : (r + 1) * length], 0)
        for r in range(count)
    ]


def _batch(*requests: WriteRequest) -> WriteBatch:
    return WriteBatch(tuple(requests), len(requests), (), False, (), ())


def _plan(*batches: WriteBatch) -> list[tuple[int, int, int, int]]:
    chains = ()
    for batch in batches:
        chains += st_kv.chains_written(batch)
    return st_kv.plan_for_chains(chains)


def _verify(entries, *, wrong: dict[int, str]) -> VerifyBatch:
    """The verify launch of ``entries``, entry ``i`` of ``wrong`` with its expected
    ``"token"`` or ``"position"`` off by bit 0."""
    varied = []
    for i, (slot, token, position, prev) in enumerate(entries):
        if wrong.get(i) == "token":
            token ^= 1
        elif wrong.get(i) == "position":
            position ^= 1
        varied.append((slot, token, position, prev))
    columns = [tuple(column) for column in zip(*varied, strict=True)]
    return VerifyBatch(*columns, num_valid=len(varied), enable=1, check_token=True)


def _shuffled_slots(rng: np.random.Generator, num_slots: int, n: int) -> list[int]:
    """``n`` distinct slots of ``[1, num_slots)`` in a random order."""
    if n > num_slots - 1:
        raise ValueError(f"{n} slots to write, but the world has {num_slots - 1} besides slot 0")
    return [int(s) for s in rng.permutation(np.arange(1, num_slots))[:n]]


def expand_write_verify(recipe: dict) -> tuple[CanaryWorld, list[tuple[str, object]]]:
    """The world and the steps a ``"write_verify"`` recipe describes."""
    recipe = _checked(recipe)
    if recipe["kind"] != "write_verify":
        raise ValueError(f"not a write_verify recipe: {recipe!r}")
    rng = np.random.default_rng(recipe["seed"])
    num_slots = recipe["rows"] * recipe["page_size"]
    world = _world(recipe, num_slots)
    plan = recipe["plan"]
    if plan == "prefill":
        n, chunk = recipe["tokens"], recipe["chunk"]
        slots = _shuffled_slots(rng, num_slots, n + chunk)
        tokens = _tokens(rng, n + chunk)
        first = _batch(_request(-1, slots[:n], tokens[:n], 0))
        second = _batch(_request(slots[n - 1], slots[n:], tokens[n:], n))
        entries = _plan(first, second)
        picked = rng.choice(len(entries), size=recipe["wrong_positions"], replace=False)
        verify = _verify(entries, wrong={int(i): "position" for i in picked})
        steps = [("write", first), ("write", second), ("verify", verify)]
    elif plan == "decode":
        count, length = recipe["requests"], recipe["prefill"]
        slots = _shuffled_slots(rng, num_slots, count * (length + 1))
        tokens = _tokens(rng, count * (length + 1))
        prefill = _from_anchor(slots, tokens, count, length)
        base = count * length
        decode = [
            _request(prefill[r].slots[-1], [slots[base + j]], [tokens[base + j]], length)
            for j, r in enumerate(int(r) for r in rng.permutation(count))
        ]
        first, second = _batch(*prefill), _batch(*decode)
        entries = _plan(first, second)
        picked = rng.choice(len(entries), size=recipe["wrong_tokens"], replace=False)
        verify = _verify(entries, wrong={int(i): "token" for i in picked})
        steps = [("write", first), ("write", second), ("verify", verify)]
    else:
        count, length, every = recipe["requests"], recipe["tokens"], recipe["wrong_every"]
        slots = _shuffled_slots(rng, num_slots, count * length)
        tokens = _tokens(rng, count * length)
        preset = _batch(*_from_anchor(slots, tokens, count, length))
        entries = _plan(preset)
        n = len(entries)
        # one entry in every stretch of `every`; the two either side of the largest power of
        # two below the plan's length (the edge of a grid of 2^k entries) and the last one
        picked = [k * every + int(rng.integers(0, every)) for k in range(n // every)]
        edge = 1 << ((n - 1).bit_length() - 1)
        picked += [edge - 1, edge, n - 1]
        verify = _verify(entries, wrong=dict.fromkeys(sorted(set(picked)), "position"))
        steps = [("preset", preset), ("verify", verify)]
    check_steps(world, steps)
    return world, steps


def expand(recipe: dict) -> FingerprintCase | tuple[CanaryWorld, list[tuple[str, object]]]:
    """What ``recipe`` describes: :func:`expand_fingerprint` or :func:`expand_write_verify`."""
    if recipe.get("kind") == "fingerprint":
        return expand_fingerprint(recipe)
    return expand_write_verify(recipe)


def _scenario(vid: str, what: str, recipe: dict) -> dict:
    _checked(recipe)
    return {"id": vid, "what": what, "recipe": dict(recipe)}


def scale_scenarios() -> list[dict]:
    """The scale scenarios as ``{id, what, recipe}``, in file order."""
    fp = {"kind": "fingerprint", "shared": False, "rows_sampled": 0, "pow2_edges": False}
    wv = {"kind": "write_verify"}
    return [
        _scenario(
            "fp-scale-page-128",
            "page 128 (4096 slots), read 16 of 32 B/token: in-page 0, 1, 63, 64, 65, 127 of "
            "6 rows, and the last slot",
            {
                **fp,
                "dtype": "bfloat16",
                "seed": 1280,
                "rows": 32,
                "page_size": 128,
                "bytes_per_token": 32,
                "read_bytes": 16,
                "mode": 2,
                "in_page": [0, 1, 63, 64, 65, 127],
                "rows_sampled": 6,
            },
        ),
        _scenario(
            "fp-scale-page-96",
            "K and V of one shared pool, page 96 (not a power of two), PARTIAL: in-page 0, 63, "
            "64, 95 of 6 rows",
            {
                **fp,
                "dtype": "float16",
                "seed": 960,
                "sources": 2,
                "shared": True,
                "rows": 40,
                "page_size": 96,
                "bytes_per_token": 32,
                "read_bytes": 32,
                "mode": 1,
                "in_page": [0, 63, 64, 95],
                "rows_sampled": 6,
            },
        ),
        _scenario(
            "fp-scale-pool-past-2-16",
            "a pool of 2^16 + 4096 slots (page 16, 16 B/token): 2^k - 1, 2^k, 2^k + 1 for every "
            "k, and the last slot",
            {
                **fp,
                "seed": 65536,
                "rows": 4352,
                "page_size": 16,
                "bytes_per_token": 16,
                "read_bytes": 16,
                "mode": 2,
                "in_page": [],
                "pow2_edges": True,
            },
        ),
        _scenario(
            "wv-scale-prefill-4096",
            "a 4096-token prefill from the anchor on shuffled slots, a 64-token chunk continuing "
            "it, then the verify of all 4160 with 5 positions wrong",
            {
                **wv,
                "plan": "prefill",
                "seed": 4096,
                "rows": 72,
                "page_size": 64,
                "bytes_per_token": 16,
                "read_bytes": 16,
                "mode": 2,
                "ring_capacity": 64,
                "kernel_kind": 2,
                "tokens": 4096,
                "chunk": 64,
                "wrong_positions": 5,
            },
        ),
        _scenario(
            "wv-scale-decode-300",
            "300 prefills of 2 tokens, 300 decode requests each continuing one's tail, then the "
            "verify of all 900 with 4 tokens wrong; K and V sources",
            {
                **wv,
                "plan": "decode",
                "seed": 300,
                "dtype": "bfloat16",
                "sources": 2,
                "rows": 64,
                "page_size": 16,
                "bytes_per_token": 64,
                "read_bytes": 32,
                "mode": 2,
                "ring_capacity": 16,
                "kernel_kind": 3,
                "requests": 300,
                "prefill": 2,
                "wrong_tokens": 4,
            },
        ),
        _scenario(
            "wv-scale-sweep-33000",
            "2^16 + 64 slots, 33 x 1000 chains preset by the reference, one verify of all "
            "33,000, PARTIAL: 1 in 1000 positions wrong, and entries 32767, 32768, 32999",
            {
                **wv,
                "plan": "sweep",
                "seed": 33000,
                "rows": 1025,
                "page_size": 64,
                "bytes_per_token": 16,
                "read_bytes": 16,
                "mode": 1,
                "ring_capacity": 1024,
                "kernel_kind": 4,
                "requests": 33,
                "tokens": 1000,
                "wrong_every": 1000,
            },
        ),
    ]


def recipe_layouts(recipe: dict) -> tuple[st_kv.SourceLayout, ...]:
    """The source layouts of any recipe, without expanding its slots or steps."""
    return _layouts(_checked(recipe))
