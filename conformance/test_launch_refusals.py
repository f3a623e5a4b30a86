"""Launch checks shared by write and verify (CONTRACT §6, §8): every bad argument raises
before any work is done, with the error the contract names, also for a plan with no valid
entry; entries past the valid ones and a disabled verify are not checked; and launches at the
edges of the contract run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from conformance.launches import (
    BOTH,
    NUM_SLOTS,
    VERIFY,
    WRITE,
    Launch,
    LaunchCase,
    all_of,
    assert_refused,
    assert_unchanged,
    launch_of,
    mode_none,
    per_launch_kind,
    replace_first_source,
    set_in,
    set_item,
    source_of_one_slot,
    state_of,
    verify_launch,
    write_launch,
)

pytestmark = pytest.mark.write_verify

CAP_MESSAGE = "kv-canary: at most 4 RealKvSource entries supported by the CUDA ABI, got 5"


@dataclasses.dataclass(frozen=True)
class BadLaunch(LaunchCase):
    """A valid launch broken in one way, and the refusal the contract requires."""

    error: type[Exception]
    message: str | None = None  # the exact message, where the contract gives one
    words: tuple[str, ...] = ()  # words the message must name


def strided(tensor: torch.Tensor) -> torch.Tensor:
    """The same values, in a tensor that is not contiguous."""
    doubled = torch.stack([tensor, tensor], dim=-1)
    return doubled[..., 0]


def meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor, device="meta")


def misaligned(tensor: torch.Tensor, device) -> torch.Tensor:
    """The same shape of canary buffer, starting 4 bytes past an 8-byte boundary."""
    backing = torch.zeros(tensor.numel() + 16, dtype=torch.uint8, device=device)
    start = (-backing.data_ptr()) % 8 + 4
    return backing[start : start + tensor.numel()].view(tensor.shape)


def slots_of(stride_bytes: int):
    """A canary buffer of NUM_SLOTS slots of ``stride_bytes`` each, in place of the old one."""
    return lambda t, d: torch.zeros(NUM_SLOTS, stride_bytes, dtype=torch.uint8, device=d)


def int32_with(index: int, value: int):
    """The tensor as int32 (a token array may be int32), with entry ``index`` set to ``value``."""

    def make(tensor: torch.Tensor, device) -> torch.Tensor:
        narrow = tensor.to(torch.int32)
        narrow[index] = value
        return narrow

    return make


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


#: A canary buffer of no slots at all.
no_slots = set_in("context", "canary_buf", lambda t, d: t[:0])


CASES = [
    BadLaunch(
        "a source on another device",
        BOTH,
        source_elsewhere,
        ValueError,
        words=("real_kv_sources[0]", "meta"),
    ),
    BadLaunch(
        "slots past a source's capacity",
        BOTH,
        source_of_two_slots,
        IndexError,
        words=("real_kv_sources[0]", "2"),
    ),
    BadLaunch("5 sources", BOTH, five_sources, ValueError, CAP_MESSAGE),
    BadLaunch(
        "5 sources, one on another device",
        BOTH,
        five_sources_one_elsewhere,
        ValueError,
        CAP_MESSAGE,
    ),
    BadLaunch(
        "canary_buf strided",
        BOTH,
        set_in("context", "canary_buf", lambda t, d: strided(t)),
        ValueError,
        "kv-canary: context.canary_buf must be contiguous",
    ),
    BadLaunch(
        "slot stride 24 bytes",
        BOTH,
        set_in("context", "canary_buf", slots_of(24)),
        ValueError,
        words=("canary_buf", "24", "32"),
    ),
    BadLaunch(
        "slot stride 36 bytes",
        BOTH,
        set_in("context", "canary_buf", slots_of(36)),
        ValueError,
        words=("canary_buf", "36", "32"),
    ),
    BadLaunch(
        "canary_buf int64",
        BOTH,
        set_in("context", "canary_buf", lambda t, d: t.view(torch.int64)),
        ValueError,
        words=("canary_buf",),
    ),
    BadLaunch(
        "ring int32",
        BOTH,
        set_in("context", "violation_ring", lambda t, d: t.to(torch.int32)),
        ValueError,
        words=("violation_ring", "int64"),
    ),
    BadLaunch(
        "canary_buf 4 bytes past alignment",
        BOTH,
        set_in("context", "canary_buf", misaligned),
        ValueError,
        words=("canary_buf", "4"),
    ),
    BadLaunch(
        "ring 1-D",
        BOTH,
        set_in("context", "violation_ring", lambda t, d: t.reshape(-1)),
        ValueError,
        words=("violation_ring",),
    ),
    BadLaunch(
        "write index [1, 1]",
        BOTH,
        set_in("context", "violation_write_index", lambda t, d: t.reshape(1, 1)),
        ValueError,
        words=("violation_write_index",),
    ),
    BadLaunch(
        "write index 0-D",
        BOTH,
        set_in("context", "violation_write_index", lambda t, d: t.reshape(())),
        ValueError,
        words=("violation_write_index",),
    ),
    BadLaunch(
        "ring [4, 7]",
        BOTH,
        set_in("context", "violation_ring", lambda t, d: t[:, :7].contiguous()),
        ValueError,
        words=("violation_ring",),
    ),
    BadLaunch(
        "write index int64",
        BOTH,
        set_in("context", "violation_write_index", lambda t, d: t.to(torch.int64)),
        ValueError,
        words=("violation_write_index",),
    ),
    BadLaunch(
        "slot counter [2]",
        BOTH,
        set_in(
            "context",
            "slot_run_counter",
            lambda t, d: torch.zeros(2, dtype=torch.int64, device=d),
        ),
        ValueError,
        words=("slot_run_counter",),
    ),
    BadLaunch(
        "kernel counter on meta",
        BOTH,
        set_in("context", "kernel_run_counter", lambda t, d: meta(t)),
        ValueError,
        words=("kernel_run_counter", "meta"),
    ),
    BadLaunch(
        "chain assert int64",
        BOTH,
        set_in("context", "enable_chain_position_assert", lambda t, d: t.to(torch.int64)),
        ValueError,
        words=("enable_chain_position_assert",),
    ),
    # write plan and token arrays
    BadLaunch(
        "write_offsets strided",
        WRITE,
        set_in("plan", "write_offsets", lambda t, d: strided(t)),
        ValueError,
        "kv-canary: plan.write_offsets must be contiguous",
    ),
    BadLaunch(
        "write_offsets [cap]",
        WRITE,
        set_in("plan", "write_offsets", lambda t, d: t[:-1].contiguous()),
        ValueError,
        words=("write_offsets",),
    ),
    BadLaunch(
        "seeds int32",
        WRITE,
        set_in("plan", "write_seed_slot_indices", lambda t, d: t.to(torch.int32)),
        ValueError,
        words=("write_seed_slot_indices",),
    ),
    BadLaunch(
        "num_valid_reqs on meta",
        WRITE,
        set_in("plan", "write_num_valid_reqs", lambda t, d: meta(t)),
        ValueError,
        words=("write_num_valid_reqs", "meta"),
    ),
    BadLaunch(
        "input_ids strided",
        WRITE,
        set_in("args", "input_ids", lambda t, d: strided(t)),
        ValueError,
        "kv-canary: input_ids must be contiguous",
    ),
    BadLaunch(
        "positions too short",
        WRITE,
        set_in("args", "positions", lambda t, d: t[:-1].contiguous()),
        ValueError,
        words=("positions",),
    ),
    BadLaunch(
        "out_cache_loc float",
        WRITE,
        set_in("args", "out_cache_loc", lambda t, d: t.to(torch.float32)),
        ValueError,
        words=("out_cache_loc",),
    ),
    BadLaunch(
        "expected tokens None with assert on",
        WRITE,
        set_in("args", "expected_input_tokens", lambda t, d: None),
        ValueError,
        "kv-canary: expected input tensors are required when enable_write_input_assert=True",
    ),
    BadLaunch(
        "expected tensors given with assert off",
        WRITE,
        set_in("args", "enable_write_input_assert", lambda t, d: False),
        ValueError,
        "kv-canary: expected input tensors must be None when enable_write_input_assert=False",
    ),
    BadLaunch(
        "offsets decreasing",
        WRITE,
        set_item("plan", "write_offsets", 1, 6),
        ValueError,
        words=("write_offsets",),
    ),
    BadLaunch(
        "offsets past the token arrays",
        WRITE,
        set_item("plan", "write_offsets", 2, 9),
        ValueError,
        words=("write_offsets",),
    ),
    BadLaunch(
        "offsets start at -1",
        WRITE,
        set_item("plan", "write_offsets", 0, -1),
        ValueError,
        words=("write_offsets",),
    ),
    BadLaunch(
        "seed 8 of 8 slots",
        WRITE,
        set_item("plan", "write_seed_slot_indices", 1, NUM_SLOTS),
        IndexError,
        words=("write_seed_slot_indices", str(NUM_SLOTS)),
    ),
    BadLaunch(
        "slot 0 of a canary_buf of no slots",
        WRITE,
        all_of(no_slots, set_in("args", "out_cache_loc", lambda t, d: torch.zeros_like(t))),
        IndexError,
        words=("out_cache_loc", "0"),
    ),
    BadLaunch(
        "seed slot 0 of a canary_buf of no slots",
        WRITE,
        all_of(
            no_slots,
            set_item("plan", "write_seed_slot_indices", 0, 0),
            set_in("args", "out_cache_loc", lambda t, d: torch.full_like(t, -1)),
        ),
        IndexError,
        words=("write_seed_slot_indices", "0"),
    ),
    BadLaunch(
        "out_cache_loc 12 of 8 slots",
        WRITE,
        set_item("args", "out_cache_loc", 4, 12),
        IndexError,
        words=("out_cache_loc", "12"),
    ),
    # values past 32 bits, named as given: a check made on a 32-bit copy would let
    # 2^32 + 1 through as slot 1, or name another number
    BadLaunch(
        "seed 4294967297 of 8 slots",
        WRITE,
        set_item("plan", "write_seed_slot_indices", 1, 2**32 + 1),
        IndexError,
        words=("write_seed_slot_indices", str(2**32 + 1)),
    ),
    BadLaunch(
        "out_cache_loc int32 2147483647 of 8 slots",
        WRITE,
        set_in("args", "out_cache_loc", int32_with(4, 2**31 - 1)),
        IndexError,
        words=("out_cache_loc", str(2**31 - 1)),
    ),
    BadLaunch(
        "offsets past the token arrays at 1099511627776",
        WRITE,
        set_item("plan", "write_offsets", 2, 2**40),
        ValueError,
        words=("write_offsets", str(2**40)),
    ),
    # verify plan
    BadLaunch(
        "verify slots strided",
        VERIFY,
        set_in("plan", "verify_slot_indices", lambda t, d: strided(t)),
        ValueError,
        "kv-canary: plan.verify_slot_indices must be contiguous",
    ),
    BadLaunch(
        "expected tokens [3]",
        VERIFY,
        set_in("plan", "verify_expected_tokens", lambda t, d: t[:3].contiguous()),
        ValueError,
        words=("verify_expected_tokens",),
    ),
    BadLaunch(
        "prev slots int32",
        VERIFY,
        set_in("plan", "verify_prev_slot_indices", lambda t, d: t.to(torch.int32)),
        ValueError,
        words=("verify_prev_slot_indices",),
    ),
    BadLaunch(
        "enable on meta",
        VERIFY,
        set_in("plan", "enable", lambda t, d: meta(t)),
        ValueError,
        words=("enable", "meta"),
    ),
    BadLaunch(
        "verify_num_valid int64",
        VERIFY,
        set_in("plan", "verify_num_valid", lambda t, d: t.to(torch.int64)),
        ValueError,
        words=("verify_num_valid",),
    ),
    BadLaunch(
        "verify slot 8 of 8",
        VERIFY,
        set_item("plan", "verify_slot_indices", 3, NUM_SLOTS),
        IndexError,
        words=("verify_slot_indices", str(NUM_SLOTS)),
    ),
    BadLaunch(
        "verify slot -1",
        VERIFY,
        set_item("plan", "verify_slot_indices", 0, -1),
        IndexError,
        words=("verify_slot_indices", "-1"),
    ),
    BadLaunch(
        "verify slot -1, mode NONE",
        VERIFY,
        all_of(mode_none, set_item("plan", "verify_slot_indices", 0, -1)),
        IndexError,
        words=("verify_slot_indices", "-1"),
    ),
    BadLaunch(
        "verify slot 8 of 8, enable -1",
        VERIFY,
        all_of(
            set_item("plan", "enable", 0, -1),
            set_item("plan", "verify_slot_indices", 3, NUM_SLOTS),
        ),
        IndexError,
        words=("verify_slot_indices", str(NUM_SLOTS)),
    ),
    BadLaunch(
        "verify slot 1 past a 1-slot source",
        VERIFY,
        all_of(
            source_of_one_slot,
            set_in(
                "plan",
                "verify_slot_indices",
                lambda t, d: torch.tensor([0, 1, 0, 0], dtype=t.dtype, device=d),
            ),
        ),
        IndexError,
        words=("real_kv_sources[0]", "1"),
    ),
    BadLaunch(
        "prev slot 30 of 8",
        VERIFY,
        set_item("plan", "verify_prev_slot_indices", 1, 30),
        IndexError,
        words=("verify_prev_slot_indices", "30"),
    ),
    BadLaunch(
        "verify slot 9223372036854775807",
        VERIFY,
        set_item("plan", "verify_slot_indices", 3, 2**63 - 1),
        IndexError,
        words=("verify_slot_indices", str(2**63 - 1)),
    ),
    BadLaunch(
        "prev slot 4294967299 of 8",
        VERIFY,
        set_item("plan", "verify_prev_slot_indices", 1, 2**32 + 3),
        IndexError,
        words=("verify_prev_slot_indices", str(2**32 + 3)),
    ),
]

CASE_FIELDS = ("breaker", "error", "message", "words")


@pytest.mark.parametrize(
    ("kind", "breaker", "error", "message", "words"),
    per_launch_kind(CASES, *CASE_FIELDS),
)
def test_bad_launch_raises_before_any_work(impl, device, kind, breaker, error, message, words):
    """A launch with one bad argument raises the contract's error type (and exact message where the contract gives one) and changes no state."""
    made, launch = launch_of(kind, impl, device)
    launch.run(impl)  # the unbroken launch is valid
    breaker(launch, device)
    before = state_of(made)
    assert_refused(impl, launch, error, message, words)
    assert_unchanged(made, before)


@pytest.mark.parametrize(
    ("kind", "breaker", "error", "message", "words"),
    # not the index and offset cases: those need entries to check
    per_launch_kind(
        CASES,
        *CASE_FIELDS,
        keep=lambda case: case.error is not IndexError and "offsets" not in case.name,
    ),
)
def test_empty_plans_are_still_validated(impl, device, kind, breaker, error, message, words):
    """Every argument check runs even when the plan has no valid entry (num_valid 0)."""
    made, launch = launch_of(kind, impl, device)
    breaker(launch, device)
    valid = "write_num_valid_reqs" if kind == "write" else "verify_num_valid"
    if launch.plan[valid].device.type != "meta":
        launch.plan[valid].fill_(0)
    assert_refused(impl, launch, error, message, words)


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


def test_disabled_verify_is_not_index_checked(impl, device):
    """A verify plan with enable == 0 is not index-checked (its entries may be unwritten)."""
    made, launch = verify_launch(impl, device)
    launch.plan["enable"].fill_(0)
    launch.plan["verify_slot_indices"].fill_(10**9)
    before = int(made.kernel_run_counter.item())
    launch.run(impl)
    assert int(made.kernel_run_counter.item()) == before + 1


# Launches at the edges of CONTRACT §6-§8 that must run.


@dataclasses.dataclass(frozen=True)
class Edge(LaunchCase):
    """A valid launch changed to one at an edge of the contract, which must still run."""


def no_rows_source(launch: Launch, device):
    """The source keeps its layout but has no rows: its capacity is 0."""
    replace_first_source(launch, tensor=launch.context["real_kv_sources"][0].tensor[:0])


def empty_plan(launch: Launch, device):
    """No entry at all: 0 requests of a write (offsets [1]) or 0 entries of a verify."""
    for name, tensor in launch.plan.items():
        if name == "write_offsets":
            launch.plan[name] = tensor[:1].clone().zero_()
        elif name not in ("write_num_valid_reqs", "verify_num_valid", "enable"):
            launch.plan[name] = tensor[:0].clone()


def slot_0_padding_only(launch: Launch, device):
    launch.plan["verify_slot_indices"].zero_()


EDGES = [
    Edge(
        "mode NONE reads no source: slots past its capacity",
        BOTH,
        all_of(mode_none, source_of_one_slot),
    ),
    Edge(
        "padding slot 0 with a source of no rows",
        VERIFY,
        all_of(no_rows_source, slot_0_padding_only),
    ),
    Edge("a plan of no entries", BOTH, empty_plan),
    Edge("seed slot 0", WRITE, set_item("plan", "write_seed_slot_indices", 0, 0)),
    Edge("offsets starting at 1", WRITE, set_item("plan", "write_offsets", 0, 1)),
]


@pytest.mark.parametrize(("kind", "change"), per_launch_kind(EDGES, "breaker"))
def test_launches_at_the_edges_run(impl, device, kind, change):
    """Each launch is valid: it runs, and its kernel counter grows by exactly one."""
    made, launch = launch_of(kind, impl, device)
    change(launch, device)
    before = int(made.kernel_run_counter.item())
    launch.run(impl)
    assert int(made.kernel_run_counter.item()) == before + 1
