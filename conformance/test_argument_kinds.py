"""Arguments of the wrong kind (CONTRACT §11): fingerprint and both launchers refuse None,
Python lists, numpy arrays, a source where a sequence of them belongs, strings and enums of
the wrong type, each with the exact exception type and a message that starts with
"kv-canary: " and names the argument, never with an error Python raises on the way."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

import numpy as np
import pytest
import torch

import strategies as st_kv
from conformance.launches import (
    BOTH,
    STATE,
    VERIFY,
    WRITE,
    Launch,
    LaunchCase,
    assert_kv_canary_refusal,
    assert_unchanged,
    launch_of,
    per_launch_kind,
    replace,
    set_to,
    source_layout,
    state_of,
)

CAP = 4


@dataclasses.dataclass(frozen=True)
class WrongKind(LaunchCase):
    """A valid launch given one argument of the wrong kind, and the error it must raise."""

    error: type[Exception]
    words: tuple[str, ...]  # words the message must name besides "kv-canary: "


def other_plan(launch: Launch, device):
    """The plan of the other launch (a VerifyPlan for write, a WritePlan for verify)."""
    if launch.kind == "write":
        launch.plan = lambda impl: impl.VerifyPlan.allocate(verify_capacity=CAP, device=device)
    else:
        launch.plan = lambda impl: impl.WritePlan.allocate(write_req_capacity=CAP, device=device)


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


def wrong(launches, group: str, name: str, shown: str, value, error=TypeError, *more, word=None):
    """A WRONG_KINDS case: ``group``'s ``name`` set to ``value`` (``shown`` in the test id); the
    message must name ``word`` (default: the field's name) and ``more``."""
    prefix = "" if group == "args" else f"{group}."
    words = (word or name, *more)
    return WrongKind(f"{prefix}{name}={shown}", launches, set_to(group, name, value), error, words)


WRONG_KINDS = [
    WrongKind("context=None", BOTH, replace("context", lambda d: None), TypeError, ("context",)),
    WrongKind("plan=None", BOTH, replace("plan", lambda d: None), TypeError, ("plan",)),
    WrongKind("plan of the other launch", BOTH, other_plan, TypeError, ("plan",)),
    wrong(BOTH, "context", "real_kv_sources", "None", None),
    WrongKind(
        "context.real_kv_sources=a RealKvSource, not a tuple",
        BOTH,
        one_source,
        TypeError,
        ("real_kv_sources",),
    ),
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
    wrong(WRITE, "plan", "write_offsets", "numpy", as_numpy),
    wrong(WRITE, "plan", "write_num_valid_reqs", "2", 2),
    wrong(WRITE, "args", "input_ids", "list", as_list),
    wrong(WRITE, "args", "positions", "numpy", as_numpy),
    wrong(WRITE, "args", "out_cache_loc", "None", None),
    wrong(WRITE, "args", "expected_input_tokens", "list", as_list),
    wrong(WRITE, "args", "enable_write_input_assert", "None", None),
    wrong(WRITE, "args", "enable_write_input_assert", "'yes'", "yes"),
    wrong(WRITE, "args", "enable_write_input_assert", "a tensor", lambda old: torch.tensor(True)),
    wrong(VERIFY, "plan", "verify_slot_indices", "list", as_list),
    wrong(VERIFY, "plan", "enable", "1", 1),
    wrong(VERIFY, "args", "check_verify_expected_token", "None", None),
    wrong(VERIFY, "args", "check_verify_expected_token", "'no'", "no"),
    wrong(VERIFY, "args", "check_verify_expected_token", "a tensor", lambda old: torch.tensor(1)),
]


def resolve_enums(impl, launch: Launch) -> None:
    """Put the implementation's own enum members where a case left a :class:`Mode` marker."""
    if not isinstance(launch.context, dict):
        return
    for name, value in launch.context.items():
        if value is Mode.LAUNCH_TAG:
            launch.context[name] = impl.CanaryLaunchTag.TAIL_K_FULL  # 2, a mode's value
        elif value is Mode.HASH_MODE:
            launch.context[name] = impl.RealKvHashMode.ALL
        elif value is Mode.ENGINE_KIND:
            launch.context[name] = AttentionKind.PREFILL


@pytest.mark.write_verify
@pytest.mark.parametrize(
    ("kind", "breaker", "error", "words"),
    per_launch_kind(WRONG_KINDS, "breaker", "error", "words"),
)
def test_wrong_kinds_of_arguments_are_refused(impl, device, kind, breaker, error, words):
    """A launch given None, a list, a numpy array, a string or an enum of the wrong type raises the contract's kv-canary error and changes no state."""
    made, launch = launch_of(kind, impl, device)
    breaker(launch, device)
    resolve_enums(impl, launch)
    before = state_of(made)
    assert_kv_canary_refusal(lambda: launch.run(impl), error, words)
    assert_unchanged(made, before)


# fingerprint's arguments of the wrong kind


@dataclasses.dataclass(frozen=True)
class FingerprintWrongKind:
    """A call of fingerprint with one argument of the wrong kind, and the error it must raise."""

    name: str  # the case id (after "fingerprint: ")
    call: Callable  # call(impl, source, slots): calls fingerprint
    error: type[Exception]
    words: tuple[str, ...]  # words the message must name besides "kv-canary: "


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


def mode_as(mode):
    """A call of fingerprint with ``mode=mode(impl)``."""
    return lambda i, src, slots: i.fingerprint([src], slots, mode=mode(i))


FINGERPRINT_WRONG_KINDS = [
    FingerprintWrongKind(
        "sources=None",
        lambda i, src, slots: i.fingerprint(None, slots),
        TypeError,
        ("sources",),
    ),
    FingerprintWrongKind(
        "sources=a RealKvSource, not a list",
        lambda i, src, slots: i.fingerprint(src, slots),
        TypeError,
        ("sources",),
    ),
    FingerprintWrongKind(
        "sources=[None]",
        lambda i, src, slots: i.fingerprint([None], slots),
        TypeError,
        ("RealKvSource", "NoneType"),
    ),
    FingerprintWrongKind(
        "sources=[a tensor]",
        lambda i, src, slots: i.fingerprint([src.tensor], slots),
        TypeError,
        ("RealKvSource", "Tensor"),
    ),
    FingerprintWrongKind(
        "slot_indices=None",
        lambda i, src, slots: i.fingerprint([src], None),
        TypeError,
        ("slot_indices",),
    ),
    FingerprintWrongKind(
        "slot_indices=list",
        slots_as(lambda slots: slots.tolist()),
        TypeError,
        ("slot_indices",),
    ),
    FingerprintWrongKind(
        "slot_indices=numpy",
        slots_as(lambda slots: np.asarray(slots.cpu())),
        TypeError,
        ("slot_indices",),
    ),
    # a tensor, but not a 1-D integer one (CONTRACT §4)
    *(
        FingerprintWrongKind(
            f"slot_indices {what}", slots_as(change), ValueError, ("slot_indices",)
        )
        for what, change in (
            ("0-D", lambda slots: slots[0]),
            ("2-D", lambda slots: slots.view(1, -1)),
            ("float", lambda slots: slots.double()),
            ("complex", lambda slots: slots.to(torch.complex64)),
            ("bool", lambda slots: slots.bool()),
        )
    ),
    FingerprintWrongKind("mode=None", mode_as(lambda i: None), TypeError, ("mode",)),
    FingerprintWrongKind("mode='ALL'", mode_as(lambda i: "ALL"), TypeError, ("mode",)),
    FingerprintWrongKind("mode=2.0", mode_as(lambda i: 2.0), TypeError, ("mode",)),
    FingerprintWrongKind(
        "mode=a CanaryLaunchTag",
        mode_as(lambda i: i.CanaryLaunchTag.TAIL_K_FULL),  # 2, a mode's value
        TypeError,
        ("mode",),
    ),
    FingerprintWrongKind(
        "mode=a member of an engine's own enum",
        mode_as(lambda i: WriteMode.ALL),
        TypeError,
        ("mode",),
    ),
    FingerprintWrongKind("mode=7", mode_as(lambda i: 7), ValueError, ("mode", "7")),
    FingerprintWrongKind(
        "mode=np.int64(7)", mode_as(lambda i: np.int64(7)), ValueError, ("mode", "7")
    ),
]


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [
        pytest.param(case.call, case.error, case.words, id=f"fingerprint: {case.name}")
        for case in FINGERPRINT_WRONG_KINDS
    ],
)
def test_fingerprint_refuses_wrong_kinds_of_arguments(impl, device, call, error, words):
    """fingerprint given None, a list, a numpy array, a string or an enum of the wrong type raises the contract's kv-canary error."""
    source, slots = fingerprint_args(impl, device)
    assert_kv_canary_refusal(lambda: call(impl, source, slots), error, words)


def test_fingerprint_takes_its_arguments_as_the_contract_spells_them(impl, device):
    """fingerprint(sources, slot_indices, *, mode): sources and slots by name too, mode by name only."""
    source, slots = fingerprint_args(impl, device)
    mode = impl.RealKvHashMode.PARTIAL
    by_position = impl.fingerprint([source], slots, mode=mode)
    by_name = impl.fingerprint(sources=[source], slot_indices=slots, mode=mode)
    assert torch.equal(by_name, by_position), "naming the arguments changed the result"
    with pytest.raises(TypeError):
        impl.fingerprint([source], slots, mode)  # CONTRACT §4: mode is keyword-only


# A numpy integer is an int wherever the contract takes one (CONTRACT §11).

#: numpy integer types, signed and unsigned, narrow and wide
NUMPY_INTS = (np.int8, np.int32, np.int64, np.uint8, np.uint64)


@pytest.mark.write_verify
@pytest.mark.parametrize("numpy_int", NUMPY_INTS, ids=lambda t: t.__name__)
@pytest.mark.parametrize("field", ["kernel_kind", "real_kv_hash_mode"])
@pytest.mark.parametrize("kind", BOTH)
def test_numpy_integers_are_ints_in_the_context(impl, device, kind, field, numpy_int):
    """A context whose kernel_kind or real_kv_hash_mode is a numpy integer launches exactly as one holding the implementation's enum member."""
    with_enum, launch = launch_of(kind, impl, device)
    launch.run(impl)
    made, launch = launch_of(kind, impl, device)
    launch.context[field] = numpy_int(int(launch.context[field]))
    launch.run(impl)
    for name in STATE:
        got, want = getattr(made, name), getattr(with_enum, name)
        assert torch.equal(got, want), f"{name} with {field}={launch.context[field]!r} differs"


@pytest.mark.parametrize("numpy_int", NUMPY_INTS, ids=lambda t: t.__name__)
def test_fingerprint_takes_a_numpy_integer_mode(impl, device, numpy_int):
    """fingerprint's mode as a numpy integer gives what the enum member gives, in every mode."""
    source, slots = fingerprint_args(impl, device)
    for mode in (impl.RealKvHashMode.NONE, impl.RealKvHashMode.PARTIAL, impl.RealKvHashMode.ALL):
        want = impl.fingerprint([source], slots, mode=mode)
        got = impl.fingerprint([source], slots, mode=numpy_int(int(mode)))
        assert torch.equal(got, want), (
            f"mode={numpy_int.__name__}({int(mode)}): {got.tolist()}, want {want.tolist()}"
        )
