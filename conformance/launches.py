"""What the launch tests share (``test_launch_checks``, ``test_argument_kinds``, ``test_buffers``):
the test world, a valid write and a valid verify launch in it as plain dicts that a case can
break, the breakers the case tables build on, and how a refusal is checked (CONTRACT §8, §11).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import pytest
import torch

import reference
import strategies as st_kv
from conformance import profiles, write_verify_support

NUM_SLOTS = 8

#: Which launches a case applies to.
BOTH = ("write", "verify")
WRITE = ("write",)
VERIFY = ("verify",)

CONTEXT_FIELDS = (
    "canary_buf",
    "kernel_kind",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
    "real_kv_sources",
    "real_kv_hash_mode",
    "enable_chain_position_assert",
)
#: What a launch may change: a refused launch leaves each of them as it was.
STATE = (
    "canary_buf",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
)

#: The test world but its source: NUM_SLOTS slots of 32 bytes, an empty ring of 4 rows, hash
#: mode ALL, the launch tag HEAD_V_FULL and the chain-position assert on.
WORLD_SETTINGS = {
    "mode": int(reference.RealKvHashMode.ALL),
    "num_slots": NUM_SLOTS,
    "slot_stride_bytes": 32,
    "ring_capacity": 4,
    "ring_start": 0,
    "kernel_kind": int(reference.CanaryLaunchTag.HEAD_V_FULL),
    "chain_assert": 1,
    "seed": 5,
}


@dataclasses.dataclass
class Launch:
    """Keyword arguments of one valid launch, as plain dicts that a case can break."""

    kind: str  # "write" or "verify"
    context: dict
    plan: dict
    args: dict

    def run(self, impl):
        # ``context`` and ``plan`` are dicts of fields; a case may replace either with any
        # object, or with a function of ``impl`` that makes one.
        context = self.context
        if isinstance(context, dict):
            context = impl.VerifyOrWriteContext(**context)
        plan_type = impl.WritePlan if self.kind == "write" else impl.VerifyPlan
        plan = self.plan
        if isinstance(plan, dict):
            plan = plan_type(**plan)
        elif callable(plan):
            plan = plan(impl)
        if self.kind == "write":
            impl.launch_canary_write_kernel(context=context, plan=plan, **self.args)
        else:
            impl.launch_canary_verify_kernel(context=context, plan=plan, **self.args)


#: Breaks (or changes) a valid launch in place: ``breaker(launch, device)``.
Breaker = Callable[[Launch, object], None]


@dataclasses.dataclass(frozen=True)
class LaunchCase:
    """A row of a launch table: one change of a valid launch, made to each launch it names."""

    name: str  # the case id: the test id is "<launch kind>: <name>"
    launches: tuple[str, ...]  # the launches it applies to: "write", "verify"
    breaker: Breaker  # the change (for a refused launch: the breakage)


def source_layout() -> st_kv.SourceLayout:
    """The one source of the test world."""
    rows = dict(dtype="bfloat16", row_shape=(2, 64), page_size=4, num_bytes_per_token=64, seed=3)
    layout = st_kv.layout(**rows, read_bytes=32, gap_bytes=256, offset_bytes=32, tail_bytes=16)
    # [4, 128] for a 2-D-only implementation
    return st_kv.fit_source_ndim(layout, profiles.SOURCE_NDIM_MAX)


def world(impl, device) -> tuple[st_kv.MaterializedWorld, dict]:
    """The test world on ``device``, and the fields of its context for ``impl``."""
    described = st_kv.CanaryWorld(sources=(source_layout(),), **WORLD_SETTINGS)
    made = st_kv.materialize_world(described, device)
    context = made.context(impl)
    return made, {name: getattr(context, name) for name in CONTEXT_FIELDS}


def write_launch(impl, device) -> tuple[st_kv.MaterializedWorld, Launch]:
    made, context = world(impl, device)
    batch = st_kv.WriteBatch(
        requests=(
            st_kv.WriteRequest(-1, (1, 2, 3), (11, 12, 13), (0, 1, 2)),
            st_kv.WriteRequest(-1, (4, 5), (21, 22), (0, 1)),
        ),
        num_valid=2,
        padding=((6, 99, 0),),
        input_assert=True,
        expected_tokens=(11, 12, 13, 21, 22, 99),
        expected_positions=(0, 1, 2, 0, 1, 0),
    )
    kwargs = write_verify_support.write_launch(impl, batch, device)
    plan = kwargs.pop("plan")
    fields = ("write_offsets", "write_seed_slot_indices", "write_num_valid_reqs")
    return made, Launch("write", context, {f: getattr(plan, f) for f in fields}, kwargs)


def verify_launch(impl, device) -> tuple[st_kv.MaterializedWorld, Launch]:
    made, context = world(impl, device)
    batch = st_kv.VerifyBatch(
        slots=(1, 2, 0, 3),
        expected_tokens=(11, -1, -1, 13),
        expected_positions=(0, 1, 0, 2),
        prev_slots=(-1, 1, 0, 2),
        num_valid=4,
        enable=1,
        check_token=True,
    )
    kwargs = write_verify_support.verify_launch(impl, batch, device)
    plan = kwargs.pop("plan")
    fields = (
        "verify_slot_indices",
        "verify_expected_tokens",
        "verify_expected_positions",
        "verify_prev_slot_indices",
        "verify_num_valid",
        "enable",
    )
    return made, Launch("verify", context, {f: getattr(plan, f) for f in fields}, kwargs)


def launch_of(kind: str, impl, device) -> tuple[st_kv.MaterializedWorld, Launch]:
    """The valid ``kind`` launch ("write" or "verify") in a fresh test world."""
    return (write_launch if kind == "write" else verify_launch)(impl, device)


def per_launch_kind(table: Sequence, *fields: str, keep=lambda case: True) -> list:
    """One pytest param per case of ``table`` (records with ``name`` and ``launches``) and
    launch it applies to: the launch kind, then the case's ``fields``, with the id
    ``"<kind>: <case name>"``; ``keep(case)`` selects cases."""
    return [
        pytest.param(kind, *(getattr(case, field) for field in fields), id=f"{kind}: {case.name}")
        for case in table
        if keep(case)
        for kind in case.launches
    ]


# --- breakers ---------------------------------------------------------------------------------


def set_in(group: str, name: str, make) -> Breaker:
    """``group``'s ``name`` (a field of the context or the plan, or an argument) becomes
    ``make(old, device)``."""

    def apply(launch: Launch, device):
        target = getattr(launch, group)
        target[name] = make(target[name], device)

    return apply


def set_item(group: str, name: str, index: int, value: int) -> Breaker:
    """Entry ``index`` of ``group``'s tensor ``name`` becomes ``value``."""

    def apply(launch: Launch, device):
        getattr(launch, group)[name][index] = value

    return apply


def set_to(group: str, name: str, value) -> Breaker:
    """A breaker that sets one field or argument to ``value`` (or ``value(old)`` if callable)."""

    def apply(launch: Launch, device):
        target = getattr(launch, group)
        target[name] = value(target[name]) if callable(value) else value

    return apply


def replace(group: str, make) -> Breaker:
    """A breaker that replaces the whole context or plan with ``make(device)``."""

    def apply(launch: Launch, device):
        setattr(launch, group, make(device))

    return apply


def all_of(*breakers: Breaker) -> Breaker:
    """Every one of ``breakers``, in order."""

    def apply(launch: Launch, device):
        for breaker in breakers:
            breaker(launch, device)

    return apply


def replace_first_source(launch: Launch, **changes) -> None:
    """The context's sources become its first one with ``changes`` (``tensor``, ``page_size``)."""
    first = launch.context["real_kv_sources"][0]
    fields = {
        "tensor": first.tensor,
        "page_size": first.page_size,
        "num_bytes_per_token": first.num_bytes_per_token,
        "read_bytes": first.read_bytes,
    }
    launch.context["real_kv_sources"] = (type(first)(**{**fields, **changes}),)


def source_of_one_slot(launch: Launch, device):
    """The source now addresses slot 0 only: the first token of its first row."""
    first = launch.context["real_kv_sources"][0]
    replace_first_source(launch, tensor=first.tensor[:1], page_size=1)


def mode_none(launch: Launch, device):
    """The hash mode becomes NONE, of the implementation's own enum."""
    launch.context["real_kv_hash_mode"] = type(launch.context["real_kv_hash_mode"]).NONE


# --- refusals ---------------------------------------------------------------------------------


def names(message: str, word: str) -> bool:
    """``word`` stands in ``message`` as a whole token, not inside a longer one: ``"4"`` is not
    named by ``"capacity 40"``, nor ``"cpu"`` by ``"cpus"``, nor ``"plan"`` by ``"plans"``."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", message) is not None


def state_of(made: st_kv.MaterializedWorld) -> dict[str, torch.Tensor]:
    """Host copies of what a launch may change (:data:`STATE`), taken now."""
    return {name: getattr(made, name).cpu().clone() for name in STATE}


def assert_unchanged(made: st_kv.MaterializedWorld, before: dict[str, torch.Tensor]) -> None:
    """Nothing of :data:`STATE` moved since ``before`` (:func:`state_of`) was taken."""
    __tracebackhide__ = True
    for name in STATE:
        assert torch.equal(getattr(made, name).cpu(), before[name]), (
            f"the refused launch changed {name}"
        )


def assert_refused(impl, launch: Launch, error, message, words) -> None:
    """The launch raises ``error``, with exactly ``message`` if given, naming every word."""
    __tracebackhide__ = True
    with pytest.raises(Exception) as caught:
        launch.run(impl)
    assert type(caught.value) is error, f"raised {type(caught.value).__name__}: {caught.value}"
    if message is not None:
        assert str(caught.value) == message
    for word in words:
        assert names(str(caught.value), word), f"{caught.value!r} does not name {word!r}"


def assert_kv_canary_refusal(call, error, words) -> None:
    """``call()`` raises exactly ``error`` with a kv-canary message naming every word."""
    __tracebackhide__ = True
    with pytest.raises(Exception) as caught:
        call()
    got = caught.value
    assert type(got) is error, (
        f"raised {type(got).__name__}: {got}; CONTRACT §11 requires {error.__name__} "
        "with a kv-canary message"
    )
    assert str(got).startswith("kv-canary: "), (
        f"{type(got).__name__}: {got} is not a kv-canary error (CONTRACT §11)"
    )
    for word in words:
        assert names(str(got), word), f"{got!r} does not name {word!r}"
