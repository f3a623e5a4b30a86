"""Sizes that aim at the boundaries where scale bugs live (torch-free, like every description).

A kernel that is right on ten slots and wrong on 65,537 has its bug at an edge: the end of a
program's block, a loop's chunk, a grid capped at some count, an index kept in 16 bits, a
persistent grid's second lap. Uniform draws from a wide range almost never land on one, so
:func:`sizes` draws them on purpose, beside uniform values, and every dimension the suite
scales (slots per call, page size, source capacity, world size, tokens per request, requests
per launch, verify entries, ring rows) is drawn through it.
"""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis.errors import InvalidArgument

__all__ = ["power_of_two_edges", "size_edges", "sizes"]

#: The largest size :func:`sizes` draws from: well past any pool an engine keeps per layer.
MAX_SIZE = 2**40


def check_int(name: str, value: object, lo: int | None = None, hi: int | None = None) -> None:
    """Refuse a strategy argument ``name`` with :class:`InvalidArgument` unless ``value`` is an
    int (not a bool) within ``[lo, hi]``; either bound may be None (none). The one check of
    every int argument of the strategies."""
    if isinstance(value, bool) or not isinstance(value, int):
        ok = False
    else:
        ok = (lo is None or value >= lo) and (hi is None or value <= hi)
    if ok:
        return
    if lo is not None and hi is not None:
        raise InvalidArgument(f"{name}={value!r} must be an int in [{lo}, {hi}]")
    if lo is not None:
        raise InvalidArgument(f"{name}={value!r} must be an int >= {lo}")
    if hi is not None:
        raise InvalidArgument(f"{name}={value!r} must be an int <= {hi}")
    raise InvalidArgument(f"{name}={value!r} must be an int")


def power_of_two_edges(limit: int) -> tuple[int, ...]:
    """``2^k - 1, 2^k, 2^k + 1`` for every ``2^k <= limit`` (and 0), ascending and below
    ``limit + 1``; ``power_of_two_edges(9)`` is ``(0, 1, 2, 3, 4, 5, 7, 8, 9)``."""
    check_int("limit", limit, 0, MAX_SIZE)
    edges = {0}
    power = 1
    while power <= limit:
        edges.update((power - 1, power, power + 1))
        power *= 2
    return tuple(sorted(e for e in edges if e <= limit))


def size_edges(max_size: int, *, min_size: int = 0, block: int | None = None) -> tuple[int, ...]:
    """The edges :func:`sizes` aims at, ascending: ``min_size`` and ``max_size``, 0, 1 and 2,
    every ``2^k - 1, 2^k, 2^k + 1``, and with ``block`` its first multiple and the ones either
    side, all within ``[min_size, max_size]``.

    Example: ``size_edges(300, min_size=100, block=96)`` is
    ``(100, 127, 128, 129, 191, 192, 193, 255, 256, 257, 300)``.
    """
    check_int("max_size", max_size, 0, MAX_SIZE)
    check_int("min_size", min_size, 0, max_size)
    edges = {min_size, max_size, *power_of_two_edges(max_size)}
    if block is not None:
        check_int("block", block, 1, MAX_SIZE)
        edges.update(block * k + d for k in (1, 2) for d in (-1, 0, 1))
    return tuple(sorted(e for e in edges if min_size <= e <= max_size))


def sizes(max_size: int, *, min_size: int = 0, block: int | None = None) -> st.SearchStrategy[int]:
    """Integers in ``[min_size, max_size]``, a third of them at an edge of
    :func:`size_edges` (0, 1, 2, ``2^k - 1``, ``2^k``, ``2^k + 1``, the bounds), a third (with
    ``block``) a multiple of ``block`` or one off it, the rest uniform. They shrink towards
    ``min_size``.

    ``block`` is the unit some code works in: a page size, a program's block of entries, a
    chunk. Without it the block draws are uniform ones.

    Example draws from ``sizes(40_000, min_size=32_000, block=512)``::

        32000, 32767, 32768, 32769, 33280, 35841, 39999, 40000
    """
    edges = size_edges(max_size, min_size=min_size, block=block)
    choices = [st.sampled_from(edges)]
    if block is not None and max_size // block >= 1:
        top = max_size // block

        def near_multiple(pair: tuple[int, int]) -> int:
            multiple, off = pair
            return min(max(multiple * block + off, min_size), max_size)

        low = max(1, min_size // block)
        choices.append(
            st.tuples(st.integers(low, max(low, top)), st.sampled_from((0, 1, -1))).map(
                near_multiple
            )
        )
    choices.append(st.integers(min_size, max_size))
    return st.one_of(choices)
