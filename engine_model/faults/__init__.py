"""The fault classes of the engine model, one object each (CONTRACT §15).

A fault class says, in one place, everything the suite knows of it: its one-line
:attr:`~FaultClass.description` (the detection table's first column), how it is made in an
:class:`engine_model.engine.Engine` (:meth:`~FaultClass.make`: at the place ``pick`` chooses
among those the next step can see, changing the engine's state, and returning a :class:`Fault`),
and which reports it predicts in each hash mode: :meth:`~FaultClass.due`, judged when it is
made, from the records the reference's buffers hold then, and
:meth:`~FaultClass.due_after_settle`, what only the steps after it can tell (the slots a swapped
token is written to), or that nothing is promised (the fault left the sliding window unseen).
Each :class:`Due` names the launches that must report it, by launch tag: a forward verifies and
writes each buffer group's ``HEAD`` buffer (no real-KV source) and ``TAIL`` buffer (the group's
KV pool), and a sweep verifies the tail buffer under ``SWEEP`` (:mod:`engine_model.engine`).

:data:`FAULTS` is the registry: SGLang's five self-test perturbations
(``sglang/srt/kv_canary/perturb/``), then two allocator bugs, three of the prefix cache (a
locked page evicted, a rebind one page off, a duplicate freed while named), two of the forward's KV store, one
of the forward's positions and one of speculative decoding's accept. The engine histories of the suite
(``conformance/test_engine.py``), the settle (``conformance.engine_support.inject_and_settle``)
and the detection table (``tools/detection_table.py``) read it; a new class is one more object
here (CONTRIBUTING.md says what else to touch).

The classes are in modules by what they break: KV bytes (:mod:`~engine_model.faults.kv_bytes`),
the page table and what hands pages out (:mod:`~engine_model.faults.page_table`), the forward
and speculative decoding (:mod:`~engine_model.faults.forward`), and KV that moves without a
forward (:mod:`~engine_model.faults.moved_kv`); what they share is
:mod:`~engine_model.faults.base`, the registry :mod:`~engine_model.faults.registry`. A class
changes an engine through its public methods and, for a fault of its next steps, through its
hooks (:class:`engine_model.hooks.EngineHooks`).
"""

from engine_model.faults.base import READ_BYTES, Due, Fault, FaultClass, tags
from engine_model.faults.registry import (
    FAULT_KINDS,
    FAULTS,
    KV_BYTE_FAULTS,
    KV_FAULTS,
    MOVE_FAULTS,
    REQ_TO_TOKEN,
    UNSEEABLE,
    make,
)

__all__ = [
    "FAULTS",
    "FAULT_KINDS",
    "KV_BYTE_FAULTS",
    "KV_FAULTS",
    "MOVE_FAULTS",
    "READ_BYTES",
    "REQ_TO_TOKEN",
    "UNSEEABLE",
    "tags",
    "Due",
    "Fault",
    "FaultClass",
    "make",
]
