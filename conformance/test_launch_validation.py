"""Launch validation shared by write and verify (CONTRACT §6, §8): every bad argument raises
before any work is done, with the error the contract names; and every public entry point
(fingerprint and both launchers) refuses an argument of the wrong kind with a kv-canary error
(CONTRACT §11), never Python's own."""

from __future__ import annotations

import dataclasses
import enum
import re

import numpy as np
import pytest
import torch

import strategies as st_kv
from conformance import write_verify_support

write_verify = pytest.mark.write_verify  # every test here but the fingerprint ones

NUM_SLOTS = 8
CAP = 4
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
CAP_MESSAGE = "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"


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


def source_layout() -> st_kv.SourceLayout:
    """The one source of the test world."""
    rows = dict(dtype="bfloat16", row_shape=(2, 64), page_size=4, num_bytes_per_token=64, seed=3)
    layout = st_kv.layout(**rows, read_bytes=32, gap_bytes=256, offset_bytes=32, tail_bytes=16)
    return st_kv.fit_source_ndim(layout)  # [4, 128] for a 2-D-only implementation


def world(impl, device) -> tuple[st_kv.MaterializedWorld, dict]:
    made = st_kv.materialize_world(
        st_kv.CanaryWorld(
            sources=(source_layout(),),
            mode=2,
            num_slots=NUM_SLOTS,
            slot_stride_bytes=32,
            ring_capacity=4,
            ring_start=0,
            kernel_kind=1,
            chain_assert=1,
            seed=5,
        ),
        device,
    )
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


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values, in a tensor that is not contiguous."""
    doubled = torch.stack([tensor, tensor], dim=-1)
    return doubled[..., 0]


def meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, device="meta")


def set_in(group: str, name: str, make):
    def apply(launch: Launch, device):
        target = getattr(launch, group)
        target[name] = make(target[name], device)

    return apply


def set_item(group: str, name: str, index: int, value: int):
    def apply(launch: Launch, device):
        getattr(launch, group)[name][index] = value

    return apply


def all_of(*breakers):
    """Every one of ``breakers``, in order."""

    def apply(launch: Launch, device):
        for breaker in breakers:
            breaker(launch, device)

    return apply


def misaligned(tensor: torch.Tensor, device) -> torch.Tensor:
    """The same shape of canary buffer, starting 4 bytes past an 8-byte boundary."""
    backing = torch.zeros(tensor.numel() + 16, dtype=torch.uint8, device=device)
    start = (-backing.data_ptr()) % 8 + 4
    return backing[start : start + tensor.numel()].view(tensor.shape)


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


def five_sources(launch: Launch, device):
    launch.context["real_kv_sources"] = tuple(launch.context["real_kv_sources"]) * 5


def five_sources_one_elsewhere(launch: Launch, device):
    first = launch.context["real_kv_sources"][0]
    elsewhere = type(first)(
        tensor=torch.empty_like(first.tensor, device="meta"),
        page_size=first.page_size,
        num_bytes_per_token=first.num_bytes_per_token,
        read_bytes=first.read_bytes,
    )
    launch.context["real_kv_sources"] = (first, first, elsewhere, first, first)


def source_elsewhere(launch: Launch, device):
    first = launch.context["real_kv_sources"][0]
    replace_first_source(launch, tensor=torch.empty_like(first.tensor, device="meta"))


def source_of_two_slots(launch: Launch, device):
    """The source now addresses slots 0 and 1 only: its first row, as a page of two."""
    first = launch.context["real_kv_sources"][0]
    replace_first_source(launch, tensor=first.tensor[:1], page_size=2)


# (id, launch kinds, break, exception, exact message or None, words the message must contain)
CASES = [
    ("a source on another device", "write verify", source_elsewhere, ValueError, None, ("real_kv_sources[0]", "meta")),
    ("slots past a source's capacity", "write verify", source_of_two_slots, IndexError, None, ("real_kv_sources[0]", "2")),
    ("5 sources", "write verify", five_sources, ValueError, CAP_MESSAGE, ()),
    ("5 sources, one on another device", "write verify", five_sources_one_elsewhere, ValueError, CAP_MESSAGE, ()),
    ("canary_buf strided", "write verify", set_in("context", "canary_buf", lambda t, d: strided(t)), ValueError, "kv-canary: context.canary_buf must be contiguous", ()),
    ("slot stride 24 bytes", "write verify", set_in("context", "canary_buf", lambda t, d: torch.zeros(NUM_SLOTS, 24, dtype=torch.uint8, device=d)), ValueError, None, ("canary_buf", "24", "32")),
    ("slot stride 36 bytes", "write verify", set_in("context", "canary_buf", lambda t, d: torch.zeros(NUM_SLOTS, 36, dtype=torch.uint8, device=d)), ValueError, None, ("canary_buf", "36", "32")),
    ("canary_buf int64", "write verify", set_in("context", "canary_buf", lambda t, d: t.view(torch.int64)), ValueError, None, ("canary_buf",)),
    ("ring int32", "write verify", set_in("context", "violation_ring", lambda t, d: t.to(torch.int32)), ValueError, None, ("violation_ring", "int64")),
    ("canary_buf 4 bytes past alignment", "write verify", set_in("context", "canary_buf", misaligned), ValueError, None, ("canary_buf", "4")),
    ("ring 1-D", "write verify", set_in("context", "violation_ring", lambda t, d: t.reshape(-1)), ValueError, None, ("violation_ring",)),
    ("write index [1, 1]", "write verify", set_in("context", "violation_write_index", lambda t, d: t.reshape(1, 1)), ValueError, None, ("violation_write_index",)),
    ("write index 0-D", "write verify", set_in("context", "violation_write_index", lambda t, d: t.reshape(())), ValueError, None, ("violation_write_index",)),
    ("ring [4, 7]", "write verify", set_in("context", "violation_ring", lambda t, d: t[:, :7].contiguous()), ValueError, None, ("violation_ring",)),
    ("write index int64", "write verify", set_in("context", "violation_write_index", lambda t, d: t.to(torch.int64)), ValueError, None, ("violation_write_index",)),
    ("slot counter [2]", "write verify", set_in("context", "slot_run_counter", lambda t, d: torch.zeros(2, dtype=torch.int64, device=d)), ValueError, None, ("slot_run_counter",)),
    ("kernel counter on meta", "write verify", set_in("context", "kernel_run_counter", lambda t, d: meta(t)), ValueError, None, ("kernel_run_counter", "meta")),
    ("chain assert int64", "write verify", set_in("context", "enable_chain_position_assert", lambda t, d: t.to(torch.int64)), ValueError, None, ("enable_chain_position_assert",)),
    # write plan and token arrays
    ("write_offsets strided", "write", set_in("plan", "write_offsets", lambda t, d: strided(t)), ValueError, "kv-canary: plan.write_offsets must be contiguous", ()),
    ("write_offsets [cap]", "write", set_in("plan", "write_offsets", lambda t, d: t[:-1].contiguous()), ValueError, None, ("write_offsets",)),
    ("seeds int32", "write", set_in("plan", "write_seed_slot_indices", lambda t, d: t.to(torch.int32)), ValueError, None, ("write_seed_slot_indices",)),
    ("num_valid_reqs on meta", "write", set_in("plan", "write_num_valid_reqs", lambda t, d: meta(t)), ValueError, None, ("write_num_valid_reqs", "meta")),
    ("input_ids strided", "write", set_in("args", "input_ids", lambda t, d: strided(t)), ValueError, "kv-canary: input_ids must be contiguous", ()),
    ("positions too short", "write", set_in("args", "positions", lambda t, d: t[:-1].contiguous()), ValueError, None, ("positions",)),
    ("out_cache_loc float", "write", set_in("args", "out_cache_loc", lambda t, d: t.to(torch.float32)), ValueError, None, ("out_cache_loc",)),
    ("expected tokens None with assert on", "write", set_in("args", "expected_input_tokens", lambda t, d: None), ValueError, "kv-canary: expected input tensors are required when enable_write_input_assert=True", ()),
    ("expected tensors given with assert off", "write", set_in("args", "enable_write_input_assert", lambda t, d: False), ValueError, "kv-canary: expected input tensors must be None when enable_write_input_assert=False", ()),
    ("offsets decreasing", "write", set_item("plan", "write_offsets", 1, 6), ValueError, None, ("write_offsets",)),
    ("offsets past the token arrays", "write", set_item("plan", "write_offsets", 2, 9), ValueError, None, ("write_offsets",)),
    ("offsets start at -1", "write", set_item("plan", "write_offsets", 0, -1), ValueError, None, ("write_offsets",)),
    ("seed 8 of 8 slots", "write", set_item("plan", "write_seed_slot_indices", 1, NUM_SLOTS), IndexError, None, ("write_seed_slot_indices", str(NUM_SLOTS))),
    ("slot 0 of a canary_buf of no slots", "write", all_of(set_in("context", "canary_buf", lambda t, d: t[:0]), set_in("args", "out_cache_loc", lambda t, d: torch.zeros_like(t))), IndexError, None, ("out_cache_loc", "0")),
    ("seed slot 0 of a canary_buf of no slots", "write", all_of(set_in("context", "canary_buf", lambda t, d: t[:0]), set_item("plan", "write_seed_slot_indices", 0, 0), set_in("args", "out_cache_loc", lambda t, d: torch.full_like(t, -1))), IndexError, None, ("write_seed_slot_indices", "0")),
    ("out_cache_loc 12 of 8 slots", "write", set_item("args", "out_cache_loc", 4, 12), IndexError, None, ("out_cache_loc", "12")),
    # verify plan
    ("verify slots strided", "verify", set_in("plan", "verify_slot_indices", lambda t, d: strided(t)), ValueError, "kv-canary: plan.verify_slot_indices must be contiguous", ()),
    ("expected tokens [3]", "verify", set_in("plan", "verify_expected_tokens", lambda t, d: t[:3].contiguous()), ValueError, None, ("verify_expected_tokens",)),
    ("prev slots int32", "verify", set_in("plan", "verify_prev_slot_indices", lambda t, d: t.to(torch.int32)), ValueError, None, ("verify_prev_slot_indices",)),
    ("enable on meta", "verify", set_in("plan", "enable", lambda t, d: meta(t)), ValueError, None, ("enable", "meta")),
    ("verify_num_valid int64", "verify", set_in("plan", "verify_num_valid", lambda t, d: t.to(torch.int64)), ValueError, None, ("verify_num_valid",)),
    ("verify slot 8 of 8", "verify", set_item("plan", "verify_slot_indices", 3, NUM_SLOTS), IndexError, None, ("verify_slot_indices", str(NUM_SLOTS))),
    ("verify slot -1", "verify", set_item("plan", "verify_slot_indices", 0, -1), IndexError, None, ("verify_slot_indices", "-1")),
    ("verify slot -1, mode NONE", "verify", all_of(set_in("context", "real_kv_hash_mode", lambda m, d: type(m)(0)), set_item("plan", "verify_slot_indices", 0, -1)), IndexError, None, ("verify_slot_indices", "-1")),
    ("verify slot 8 of 8, enable -1", "verify", all_of(set_item("plan", "enable", 0, -1), set_item("plan", "verify_slot_indices", 3, NUM_SLOTS)), IndexError, None, ("verify_slot_indices", str(NUM_SLOTS))),
    ("verify slot 1 past a 1-slot source", "verify", all_of(source_of_one_slot, set_in("plan", "verify_slot_indices", lambda t, d: torch.tensor([0, 1, 0, 0], dtype=t.dtype, device=d))), IndexError, None, ("real_kv_sources[0]", "1")),
    ("prev slot 30 of 8", "verify", set_item("plan", "verify_prev_slot_indices", 1, 30), IndexError, None, ("verify_prev_slot_indices", "30")),
]  # fmt: skip


def names(message: str, word: str) -> bool:
    """``word`` stands in ``message`` as a whole token, not inside a longer one: ``"4"`` is not
    named by ``"capacity 40"``, nor ``"cpu"`` by ``"cpus"``, nor ``"plan"`` by ``"plans"``."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", message) is not None


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


def per_launch_kind(table, keep=lambda name, error: True) -> list:
    """One pytest param per row of ``table`` and launch kind it names ("write", "verify"),
    with the id ``"<kind>: <row name>"``; ``keep(name, error)`` selects rows."""
    return [
        pytest.param(kind, *rest, id=f"{kind}: {name}")
        for name, kinds, *rest in table
        for kind in kinds.split()
        if keep(name, rest[1] if len(rest) > 1 else None)
    ]


STATE = (
    "canary_buf",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
)


@write_verify
@pytest.mark.parametrize(
    ("kind", "breaker", "error", "message", "words"),
    per_launch_kind(CASES),
)
def test_bad_launch_raises_before_any_work(impl, device, kind, breaker, error, message, words):
    """A launch with one bad argument raises the contract's error type (and exact message where the contract gives one) and changes no state."""
    made, launch = (write_launch if kind == "write" else verify_launch)(impl, device)
    launch.run(impl)  # the unbroken launch is valid
    breaker(launch, device)
    before = {name: getattr(made, name).cpu().clone() for name in STATE}
    assert_refused(impl, launch, error, message, words)
    for name in STATE:
        assert torch.equal(getattr(made, name).cpu(), before[name]), (
            f"the refused launch changed {name}"
        )


@write_verify
@pytest.mark.parametrize(
    ("kind", "breaker", "error", "message", "words"),
    # not the index and offset cases: those need entries to check
    per_launch_kind(
        CASES, keep=lambda name, error: error is not IndexError and "offsets" not in name
    ),
)
def test_empty_plans_are_still_validated(impl, device, kind, breaker, error, message, words):
    """Every argument check runs even when the plan has no valid entry (num_valid 0)."""
    made, launch = (write_launch if kind == "write" else verify_launch)(impl, device)
    breaker(launch, device)
    valid = "write_num_valid_reqs" if kind == "write" else "verify_num_valid"
    if launch.plan[valid].device.type != "meta":
        launch.plan[valid].fill_(0)
    assert_refused(impl, launch, error, message, words)


@write_verify
def test_entries_past_num_valid_are_not_validated(impl, device):
    """Requests and entries past the valid ones are never read, so garbage there is not an error."""
    made, launch = write_launch(impl, device)
    launch.plan["write_num_valid_reqs"].fill_(1)
    launch.plan["write_seed_slot_indices"][1] = 10**9
    launch.args["out_cache_loc"][3:] = 10**9
    launch.run(impl)
    made, launch = write_launch(impl, device)  # a third request, not valid, of garbage
    plan = launch.plan
    plan["write_offsets"] = torch.cat([plan["write_offsets"], plan["write_offsets"][:1] + 10**9])
    plan["write_seed_slot_indices"] = torch.cat(
        [plan["write_seed_slot_indices"][:2], plan["write_seed_slot_indices"][:1] + 10**9]
    )
    launch.run(impl)
    for num_valid in (0, -3):  # not even the first request is read
        made, launch = write_launch(impl, device)
        launch.plan["write_num_valid_reqs"].fill_(num_valid)
        launch.plan["write_seed_slot_indices"][0] = 10**9
        launch.plan["write_offsets"][0] = -(10**9)
        launch.args["out_cache_loc"].fill_(10**9)
        launch.run(impl)
    made, launch = verify_launch(impl, device)
    launch.plan["verify_num_valid"].fill_(2)
    launch.plan["verify_slot_indices"][2:] = 10**9
    launch.plan["verify_prev_slot_indices"][2:] = 10**9
    launch.run(impl)
    for num_valid in (0, -3):
        made, launch = verify_launch(impl, device)
        launch.plan["verify_num_valid"].fill_(num_valid)
        launch.plan["verify_slot_indices"].fill_(10**9)
        launch.run(impl)


@write_verify
def test_disabled_verify_is_not_index_checked(impl, device):
    """A verify plan with enable == 0 is not index-checked (its entries may be unwritten)."""
    made, launch = verify_launch(impl, device)
    launch.plan["enable"].fill_(0)
    launch.plan["verify_slot_indices"].fill_(10**9)
    before = int(made.kernel_run_counter.item())
    launch.run(impl)
    assert int(made.kernel_run_counter.item()) == before + 1


# Arguments of the wrong kind (CONTRACT §11): None, Python lists, numpy arrays, a source where
# a sequence of them belongs, strings and enums of the wrong type. Each is refused with the
# exact exception type and a message that starts with "kv-canary: " and names the argument.


def replace(group: str, make):
    """A breaker that replaces the whole context or plan with ``make(device)``."""

    def apply(launch: Launch, device):
        setattr(launch, group, make(device))

    return apply


def other_plan(launch: Launch, device):
    """The plan of the other launch (a VerifyPlan for write, a WritePlan for verify)."""
    if launch.kind == "write":
        launch.plan = lambda impl: impl.VerifyPlan.allocate(verify_capacity=CAP, device=device)
    else:
        launch.plan = lambda impl: impl.WritePlan.allocate(write_req_capacity=CAP, device=device)


def set_to(group: str, name: str, value):
    """A breaker that sets one field or argument to ``value`` (or ``value(old)`` if callable)."""

    def apply(launch: Launch, device):
        target = getattr(launch, group)
        target[name] = value(target[name]) if callable(value) else value

    return apply


def one_source(launch: Launch, device):
    launch.context["real_kv_sources"] = launch.context["real_kv_sources"][0]


def as_numpy(tensor):
    return tensor.cpu().numpy()


def as_list(tensor):
    return tensor.tolist()


class Mode:
    """Stands for the implementation's enums, which the cases cannot name before ``impl``."""

    LAUNCH_TAG = object()  # a CanaryLaunchTag member where a RealKvHashMode belongs
    HASH_MODE = object()  # a RealKvHashMode member where a CanaryLaunchTag belongs
    ENGINE_KIND = object()  # an engine's own IntEnum member (AttentionKind) as the kernel kind


class AttentionKind(enum.IntEnum):
    """An engine's own enum with a tag's values; its name sorts before ``CanaryLaunchTag``."""

    PREFILL = 1
    DECODE = 2


def wrong(kinds: str, group: str, name: str, shown: str, value, error=TypeError, *more, word=None):
    """A WRONG_KINDS row: ``group``'s ``name`` set to ``value`` (``shown`` in the test id); the
    message must name ``word`` (default: the field's name) and ``more``."""
    prefix = "" if group == "args" else f"{group}."
    words = (word or name, *more)
    return (f"{prefix}{name}={shown}", kinds, set_to(group, name, value), error, words)


BOTH = "write verify"
# (id, launch kinds, break, exception, words the message must contain besides "kv-canary: ")
WRONG_KINDS = [
    ("context=None", BOTH, replace("context", lambda d: None), TypeError, ("context",)),
    ("plan=None", BOTH, replace("plan", lambda d: None), TypeError, ("plan",)),
    ("plan of the other launch", BOTH, other_plan, TypeError, ("plan",)),
    wrong(BOTH, "context", "real_kv_sources", "None", None),
    ("context.real_kv_sources=a RealKvSource, not a tuple", BOTH, one_source, TypeError,
     ("real_kv_sources",)),
    wrong(BOTH, "context", "real_kv_sources", "(None,)", (None,), word="real_kv_sources[0]"),
    wrong(BOTH, "context", "real_kv_hash_mode", "None", None),
    wrong(BOTH, "context", "real_kv_hash_mode", "'ALL'", "ALL"),
    wrong(BOTH, "context", "real_kv_hash_mode", "a CanaryLaunchTag", Mode.LAUNCH_TAG),
    wrong(BOTH, "context", "real_kv_hash_mode", "7", 7, ValueError, "7"),
    wrong(BOTH, "context", "kernel_kind", "None", None),
    wrong(BOTH, "context", "kernel_kind", "'HEAD_K_FULL'", "HEAD_K_FULL"),
    wrong(BOTH, "context", "kernel_kind", "a RealKvHashMode", Mode.HASH_MODE),
    wrong(BOTH, "context", "kernel_kind", "a member of an engine's own enum", Mode.ENGINE_KIND),
    wrong(BOTH, "context", "kernel_kind", "99", 99, ValueError, "99"),
    wrong(BOTH, "context", "canary_buf", "numpy", as_numpy),
    wrong(BOTH, "context", "violation_ring", "list", as_list),
    wrong(BOTH, "context", "enable_chain_position_assert", "1", 1),
    wrong("write", "plan", "write_offsets", "numpy", as_numpy),
    wrong("write", "plan", "write_num_valid_reqs", "2", 2),
    wrong("write", "args", "input_ids", "list", as_list),
    wrong("write", "args", "positions", "numpy", as_numpy),
    wrong("write", "args", "out_cache_loc", "None", None),
    wrong("write", "args", "expected_input_tokens", "list", as_list),
    wrong("write", "args", "enable_write_input_assert", "None", None),
    wrong("write", "args", "enable_write_input_assert", "'yes'", "yes"),
    wrong("write", "args", "enable_write_input_assert", "a tensor", lambda old: torch.tensor(True)),
    wrong("verify", "plan", "verify_slot_indices", "list", as_list),
    wrong("verify", "plan", "enable", "1", 1),
    wrong("verify", "args", "check_verify_expected_token", "None", None),
    wrong("verify", "args", "check_verify_expected_token", "'no'", "no"),
    wrong("verify", "args", "check_verify_expected_token", "a tensor", lambda old: torch.tensor(1)),
]  # fmt: skip


def resolve_enums(impl, launch: Launch) -> None:
    """Put the implementation's own enum members where a case left a :class:`Mode` marker."""
    if not isinstance(launch.context, dict):
        return
    for name, value in launch.context.items():
        if value is Mode.LAUNCH_TAG:
            launch.context[name] = impl.CanaryLaunchTag(2)
        elif value is Mode.HASH_MODE:
            launch.context[name] = impl.RealKvHashMode(2)
        elif value is Mode.ENGINE_KIND:
            launch.context[name] = AttentionKind.PREFILL


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


@write_verify
@pytest.mark.parametrize(
    ("kind", "breaker", "error", "words"),
    per_launch_kind(WRONG_KINDS),
)
def test_wrong_kinds_of_arguments_are_refused(impl, device, kind, breaker, error, words):
    """A launch given None, a list, a numpy array, a string or an enum of the wrong type raises the contract's kv-canary error and changes no state."""
    made, launch = (write_launch if kind == "write" else verify_launch)(impl, device)
    breaker(launch, device)
    resolve_enums(impl, launch)
    before = {name: getattr(made, name).cpu().clone() for name in STATE}
    assert_kv_canary_refusal(lambda: launch.run(impl), error, words)
    for name in STATE:
        assert torch.equal(getattr(made, name).cpu(), before[name]), (
            f"the refused launch changed {name}"
        )


def fingerprint_args(impl, device):
    """Valid fingerprint arguments: the test world's source and two of its slots."""
    source = st_kv.materialize(source_layout(), device).build(impl)
    return source, torch.tensor([1, 2], dtype=torch.int64, device=device)


class WriteMode(enum.IntEnum):
    """An engine's own enum whose values happen to be modes' (its name sorts after the
    contract's enums, so a refusal by name order would miss it)."""

    NONE = 0
    PARTIAL = 1
    ALL = 2


def slots_as(change):
    """A call of fingerprint whose slot tensor is ``change(slots)``."""
    return lambda i, src, slots: i.fingerprint([src], change(slots))


# (id, call of fingerprint(impl, source, slots), exception, words besides "kv-canary: ")
FINGERPRINT_WRONG_KINDS = [
    ("sources=None", lambda i, src, slots: i.fingerprint(None, slots), TypeError, ("sources",)),
    (
        "sources=a RealKvSource, not a list",
        lambda i, src, slots: i.fingerprint(src, slots),
        TypeError,
        ("sources",),
    ),
    (
        "sources=[None]",
        lambda i, src, slots: i.fingerprint([None], slots),
        TypeError,
        ("RealKvSource", "NoneType"),
    ),
    (
        "sources=[a tensor]",
        lambda i, src, slots: i.fingerprint([src.tensor], slots),
        TypeError,
        ("RealKvSource", "Tensor"),
    ),
    (
        "slot_indices=None",
        lambda i, src, slots: i.fingerprint([src], None),
        TypeError,
        ("slot_indices",),
    ),
    (
        "slot_indices=list",
        lambda i, src, slots: i.fingerprint([src], slots.tolist()),
        TypeError,
        ("slot_indices",),
    ),
    (
        "slot_indices=numpy",
        lambda i, src, slots: i.fingerprint([src], np.asarray(slots.cpu())),
        TypeError,
        ("slot_indices",),
    ),
    # a tensor, but not a 1-D integer one (CONTRACT §4)
    *(
        (f"slot_indices {what}", slots_as(change), ValueError, ("slot_indices",))
        for what, change in (
            ("0-D", lambda slots: slots[0]),
            ("2-D", lambda slots: slots.view(1, -1)),
            ("float", lambda slots: slots.double()),
            ("complex", lambda slots: slots.to(torch.complex64)),
            ("bool", lambda slots: slots.bool()),
        )
    ),
    (
        "mode=None",
        lambda i, src, slots: i.fingerprint([src], slots, mode=None),
        TypeError,
        ("mode",),
    ),
    (
        "mode='ALL'",
        lambda i, src, slots: i.fingerprint([src], slots, mode="ALL"),
        TypeError,
        ("mode",),
    ),
    (
        "mode=2.0",
        lambda i, src, slots: i.fingerprint([src], slots, mode=2.0),
        TypeError,
        ("mode",),
    ),
    (
        "mode=a CanaryLaunchTag",
        lambda i, src, slots: i.fingerprint([src], slots, mode=i.CanaryLaunchTag(2)),
        TypeError,
        ("mode",),
    ),
    (
        "mode=a member of an engine's own enum",
        lambda i, src, slots: i.fingerprint([src], slots, mode=WriteMode.ALL),
        TypeError,
        ("mode",),
    ),
    (
        "mode=7",
        lambda i, src, slots: i.fingerprint([src], slots, mode=7),
        ValueError,
        ("mode", "7"),
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [pytest.param(*rest, id=f"fingerprint: {name}") for name, *rest in FINGERPRINT_WRONG_KINDS],
)
def test_fingerprint_refuses_wrong_kinds_of_arguments(impl, device, call, error, words):
    """fingerprint given None, a list, a numpy array, a string or an enum of the wrong type raises the contract's kv-canary error."""
    source, slots = fingerprint_args(impl, device)
    assert_kv_canary_refusal(lambda: call(impl, source, slots), error, words)


def test_fingerprint_takes_its_arguments_as_the_contract_spells_them(impl, device):
    """fingerprint(sources, slot_indices, *, mode): sources and slots by name too, mode by name only."""
    source, slots = fingerprint_args(impl, device)
    mode = impl.RealKvHashMode(1)
    by_position = impl.fingerprint([source], slots, mode=mode)
    by_name = impl.fingerprint(sources=[source], slot_indices=slots, mode=mode)
    assert torch.equal(by_name, by_position), "naming the arguments changed the result"
    with pytest.raises(TypeError):
        impl.fingerprint([source], slots, mode)  # CONTRACT §4: mode is keyword-only


# The plans' allocate (CONTRACT §5): the capacity keyword of each plan type.
PLAN_CAPACITIES = {"VerifyPlan": "verify_capacity", "WritePlan": "write_req_capacity"}


def allocate(impl, device, plan_type: str, capacity):
    return getattr(impl, plan_type).allocate(
        **{PLAN_CAPACITIES[plan_type]: capacity, "device": device}
    )


@write_verify
@pytest.mark.parametrize("capacity", [0, -1])
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_refuses_a_capacity_below_one(impl, device, plan_type, capacity):
    """allocate with a capacity <= 0 is a ValueError naming the capacity and its value."""
    assert_kv_canary_refusal(
        lambda: allocate(impl, device, plan_type, capacity),
        ValueError,
        (PLAN_CAPACITIES[plan_type], str(capacity)),
    )


@write_verify
@pytest.mark.parametrize("capacity", [True, 2.0, None, "4"], ids=["True", "2.0", "None", "'4'"])
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_refuses_a_capacity_that_is_no_int(impl, device, plan_type, capacity):
    """A capacity that is not an int (a bool is no capacity either) is a TypeError naming it."""
    assert_kv_canary_refusal(
        lambda: allocate(impl, device, plan_type, capacity),
        TypeError,
        (PLAN_CAPACITIES[plan_type],),
    )


@write_verify
@pytest.mark.parametrize("plan_type", PLAN_CAPACITIES)
def test_allocate_takes_keywords_only(impl, device, plan_type):
    """allocate(capacity=, device=) by name only, as the contract spells it."""
    with pytest.raises(TypeError):
        getattr(impl, plan_type).allocate(3, device)
    with pytest.raises(TypeError):
        getattr(impl, plan_type).allocate(3, device=device)


@write_verify
@pytest.mark.parametrize("capacity", [1, 5])
def test_allocated_plans_have_the_contract_shapes(impl, device, capacity):
    """A fresh plan's tensors have CONTRACT §5's shapes, dtypes and device, and a verify plan is
    enabled; the values of the other entries are left to the caller to fill in."""
    verify = allocate(impl, device, "VerifyPlan", capacity)
    write = allocate(impl, device, "WritePlan", capacity)
    expected = {
        (verify, "verify_slot_indices"): ((capacity,), torch.int64),
        (verify, "verify_expected_tokens"): ((capacity,), torch.int64),
        (verify, "verify_expected_positions"): ((capacity,), torch.int64),
        (verify, "verify_prev_slot_indices"): ((capacity,), torch.int64),
        (verify, "verify_num_valid"): ((1,), torch.int32),
        (verify, "enable"): ((1,), torch.int32),
        (write, "write_offsets"): ((capacity + 1,), torch.int64),
        (write, "write_seed_slot_indices"): ((capacity,), torch.int64),
        (write, "write_num_valid_reqs"): ((1,), torch.int32),
    }
    for (plan, field), (shape, dtype) in expected.items():
        tensor = getattr(plan, field)
        assert (tuple(tensor.shape), tensor.dtype) == (shape, dtype), (
            f"{field}: {tensor.shape} {tensor.dtype}"
        )
        assert tensor.device.type == torch.device(device).type, f"{field} on {tensor.device}"
    assert int(verify.enable[0]) == 1, "a fresh VerifyPlan must be enabled"


@write_verify
@pytest.mark.parametrize("type_name", ["VerifyOrWriteContext", "VerifyPlan", "WritePlan"])
def test_context_and_plans_are_frozen_and_keyword_only(impl, device, type_name):
    """The context and both plans are frozen dataclasses whose fields are given by name."""
    cls = getattr(impl, type_name)
    fields = [field.name for field in dataclasses.fields(cls)]
    with pytest.raises(TypeError):
        cls(*range(len(fields)))
    if type_name == "VerifyOrWriteContext":
        instance = world(impl, device)[0].context(impl)
    else:
        instance = allocate(impl, device, type_name, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(instance, fields[0], getattr(instance, fields[0]))


STATE_FIELDS = (
    "canary_buf",
    "violation_ring",
    "violation_write_index",
    "slot_run_counter",
    "kernel_run_counter",
)


@write_verify
@pytest.mark.parametrize("kind", ["write", "verify"])
def test_plans_past_256_entries_are_accepted(impl, device, kind):
    """The same launch with its plan grown to 300 entries (the extra ones not valid) runs and
    does exactly what the small plan does: sizes past 256 are compared by value."""
    make_launch = write_launch if kind == "write" else verify_launch
    small_world, small = make_launch(impl, device)
    small.run(impl)
    made, launch = make_launch(impl, device)
    if kind == "write":
        plan = impl.WritePlan.allocate(write_req_capacity=300, device=device)
        plan.write_seed_slot_indices.fill_(-1)
    else:
        plan = impl.VerifyPlan.allocate(verify_capacity=300, device=device)
        plan.verify_slot_indices.zero_()
    for name, values in launch.plan.items():
        grown = getattr(plan, name)
        if grown.shape != values.shape:
            grown[values.shape[0] :] = values[-1] if name == "write_offsets" else 0
        grown[: values.shape[0]] = values
        launch.plan[name] = grown
    launch.run(impl)
    for name in STATE_FIELDS:
        assert torch.equal(getattr(made, name), getattr(small_world, name)), name


def no_rows_source(launch: Launch, device):
    """The source keeps its layout but has no rows: its capacity is 0."""
    replace_first_source(launch, tensor=launch.context["real_kv_sources"][0].tensor[:0])


def mode_none(launch: Launch, device):
    launch.context["real_kv_hash_mode"] = type(launch.context["real_kv_hash_mode"])(0)


def empty_plan(launch: Launch, device):
    """No entry at all: 0 requests of a write (offsets [1]) or 0 entries of a verify."""
    for name, tensor in launch.plan.items():
        if name == "write_offsets":
            launch.plan[name] = tensor[:1].clone().zero_()
        elif name not in ("write_num_valid_reqs", "verify_num_valid", "enable"):
            launch.plan[name] = tensor[:0].clone()


def slot_0_padding_only(launch: Launch, device):
    launch.plan["verify_slot_indices"].zero_()


# (id, launch kinds, change): launches at the edges of CONTRACT §6-§8 that must run
EDGES = [
    ("mode NONE reads no source: slots past its capacity", BOTH, all_of(mode_none, source_of_one_slot)),
    ("padding slot 0 with a source of no rows", "verify", all_of(no_rows_source, slot_0_padding_only)),
    ("a plan of no entries", BOTH, empty_plan),
    ("seed slot 0", "write", set_item("plan", "write_seed_slot_indices", 0, 0)),
    ("offsets starting at 1", "write", set_item("plan", "write_offsets", 0, 1)),
]  # fmt: skip


@write_verify
@pytest.mark.parametrize(("kind", "change"), per_launch_kind(EDGES))
def test_launches_at_the_edges_run(impl, device, kind, change):
    """Each launch is valid: it runs, and its kernel counter grows by exactly one."""
    made, launch = (write_launch if kind == "write" else verify_launch)(impl, device)
    change(launch, device)
    before = int(made.kernel_run_counter.item())
    launch.run(impl)
    assert int(made.kernel_run_counter.item()) == before + 1
