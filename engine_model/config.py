"""An engine's configuration: its fixed sizes and options (:class:`EngineConfig`), the KV bytes
of a slot (:data:`KV_BYTES`) and how a step's ``pick`` chooses among places (:func:`pick_from`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine_model.vocabulary import FULL, SWA
from reference import RealKvHashMode

__all__ = ["KV_BYTES", "EngineConfig", "pick_from"]

#: Bytes of KV per slot (one flat uint8 source row per slot).
KV_BYTES = 32


def _check_int(name: str, value: object, lo: int) -> None:
    """Refuse a configuration field that is not an int (a bool is not one) of at least ``lo``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < lo:
        raise ValueError(f"{name}={value!r} must be an int >= {lo}")


def pick_from(items: list, pick: int) -> Any:
    """The item ``pick`` chooses (modulo their number), or None when there is none."""
    return items[pick % len(items)] if items else None


@dataclass(frozen=True)
class EngineConfig:
    """The fixed sizes and options of an engine.

    ``num_pages`` pages of ``page_size`` slots (page 0 is padding), ``pool_rows`` rows of
    ``req_to_token`` (row 0 is padding) of ``context_len`` positions each, a sliding window of
    ``swa_window`` positions (0: full attention), the EAGLE ``offset`` (0 or 1), the hash
    ``mode`` (the canary's real_kv_hash_mode: 0 NONE, 1 PARTIAL, 2 ALL), the ``seed`` of every
    token, KV byte and stale value, under a window the ``swa_slots`` of the SWA pool (slot 0 the
    padding slot; 0: as many as the full pool), and whether the write's input assert is on
    (``write_input_assert``), and the free lists that choose pages and rows (``allocators``)::

        EngineConfig(page_size=2, num_pages=16, pool_rows=5, context_len=16, swa_window=6,
                     offset=1, mode=1, seed=7, swa_slots=20)
    """

    page_size: int = 1  # slots of a page
    num_pages: int = 24  # pages of the full pool, page 0 the padding page
    pool_rows: int = 5  # rows of req_to_token and of the pool, row 0 the padding row
    context_len: int = 16  # positions of a row
    swa_window: int = 0  # 0: full attention
    offset: int = 0  # the EAGLE offset, 0 or 1
    #: the hash mode, the canary's ``real_kv_hash_mode`` (0 NONE, 1 PARTIAL, 2 ALL; not a
    #: forward mode: those are :attr:`engine_model.steps.Forward.mode`)
    mode: int = int(RealKvHashMode.ALL)
    seed: int = 1  # of every token, KV byte and stale value
    swa_slots: int = 0  # slots of the SWA pool under a window (0: those of the full pool)
    #: the canary's write input assert (``enable_write_input_assert``): False, off in every
    #: forward (True: on, but where the engine's forwards turn it off)
    write_input_assert: bool = True
    #: whether the canary sweeps the prefix cache (False: never, as SGLang's scheduler gives
    #: the draft model's canary no radix cache to sweep)
    cache_swept: bool = True
    #: the free lists that choose the next page and pool row, by name
    #: (:data:`engine_model.free_lists.BACKENDS`): ``"model"``, the engine's own lists in
    #: SGLang's orders, or ``"sglang"``, SGLang's allocators run from source (registered by
    #: ``conformance.sglang.memory``)
    allocators: str = "model"

    def __post_init__(self) -> None:
        _check_int("page_size", self.page_size, 1)
        _check_int("num_pages", self.num_pages, 2)
        _check_int("pool_rows", self.pool_rows, 2)
        _check_int("context_len", self.context_len, 2)
        _check_int("swa_window", self.swa_window, 0)
        _check_int("swa_slots", self.swa_slots, 0)
        if self.swa_slots and not 2 <= self.swa_slots <= self.num_slots:
            raise ValueError(f"swa_slots must be 0 or 2 to num_slots: {self!r}")
        if not isinstance(self.allocators, str):
            raise ValueError(f"allocators must be a name: {self!r}")
        if not isinstance(self.write_input_assert, bool) or not isinstance(self.cache_swept, bool):
            raise ValueError(f"write_input_assert and cache_swept must be bools: {self!r}")
        if self.offset not in (0, 1) or self.mode not in tuple(RealKvHashMode):
            raise ValueError(f"offset must be 0 or 1 and mode 0, 1 or 2: {self!r}")

    @property
    def num_slots(self) -> int:
        """Slots of the full pool and of the ``FULL`` group's canary buffers."""
        return self.num_pages * self.page_size

    @property
    def groups(self) -> tuple[str, ...]:
        """The buffer groups a forward launches on: ``FULL``, and ``SWA`` under a window."""
        return (FULL, SWA) if self.swa_window else (FULL,)

    def group_slots(self, group: str) -> int:
        """Slots of a group's pool and canary buffers."""
        if group == SWA:
            return self.swa_slots or self.num_slots
        return self.num_slots
