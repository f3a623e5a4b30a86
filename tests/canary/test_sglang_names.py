"""canary is SGLang's kv_canary in name too: every public constant and enum of the installed
SGLang release exists in canary under the same name with the same value (enums: the same
members), and every launcher takes SGLang's keywords, so engine code written against SGLang
runs on canary unchanged. Names that are out of scope are listed below with the reason.

SGLang's modules come from the adapter (``conformance.adapters.sglang``), which loads the
installed release's kv_canary without its serving stack.
"""

from __future__ import annotations

import enum
import fnmatch
import importlib
import inspect

import pytest

import canary
import canary.constants

#: SGLang names canary leaves out on purpose, as fnmatch patterns, with the reason.
OUT_OF_SCOPE = {
    "REAL_KV_SOURCE_*": "the layout of the parameter table SGLang's CUDA launcher hands its "
    "kernel; canary passes each source to Triton as arguments",
}


@pytest.fixture(scope="module")
def sglang():
    try:
        from conformance.adapters import sglang
    except ImportError as error:  # the project's environment installs it (scripts/_env.sh)
        pytest.skip(f"SGLang's kv_canary is not installed: {error}")
    return sglang


def public_names(modules) -> dict[str, object]:
    """The public constants (upper-case ints) and the enums the modules define."""
    found: dict[str, object] = {}
    for module in modules:
        for name, value in vars(module).items():
            is_constant = name.isupper() and isinstance(value, int) and not isinstance(value, bool)
            is_enum = (
                isinstance(value, type)
                and issubclass(value, enum.Enum)
                and value.__module__ == module.__name__
            )
            if (is_constant or is_enum) and not name.startswith("_"):
                found[name] = value
    return found


def out_of_scope(name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in OUT_OF_SCOPE)


def sglang_names(sglang) -> dict[str, object]:
    return public_names([sglang.consts, sglang.verify, sglang.write])


def test_every_sglang_constant_and_enum_is_in_canary(sglang):
    """Each of SGLang's public constants and enums is canary's, in ``canary`` and in
    ``canary.constants``, with an equal value (for an enum: the same member names and values)."""
    names = sglang_names(sglang)
    assert "CANARY_FIELD_TOKEN" in names and "CanaryLaunchTag" in names, sorted(names)
    problems = []
    for name, theirs in sorted(names.items()):
        if out_of_scope(name):
            continue
        for where in (canary, canary.constants):
            ours = getattr(where, name, None)
            if ours is None:
                problems.append(f"{where.__name__}.{name} is missing")
            elif isinstance(theirs, type):
                want = {member.name: member.value for member in theirs}
                got = {member.name: member.value for member in ours}
                if got != want:
                    problems.append(f"{where.__name__}.{name}: {got}, SGLang's {want}")
            elif ours != theirs:
                problems.append(f"{where.__name__}.{name} = {ours!r}, SGLang's {theirs!r}")
    assert not problems, f"canary vs SGLang {sglang.INSTALLED}:\n" + "\n".join(problems)


def test_every_out_of_scope_name_is_sglang_s(sglang):
    """Each pattern of OUT_OF_SCOPE still names something of SGLang's (no stale excuses)."""
    names = sglang_names(sglang)
    stale = [p for p in OUT_OF_SCOPE if not fnmatch.filter(names, p)]
    assert not stale, f"OUT_OF_SCOPE names nothing of SGLang {sglang.INSTALLED}: {stale}"


#: SGLang's launchers, by the module of its kv_canary that defines each.
LAUNCHERS = {
    "write": "launch_canary_write_kernel",
    "verify": "launch_canary_verify_kernel",
    "plan.api": "launch_canary_plan_kernels",
    "scatter_req_token_ids": "launch_scatter_req_token_ids_kernel",
}


def parameters(fn) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("module, name", LAUNCHERS.items())
def test_every_launcher_takes_sglang_s_keywords(sglang, module, name):
    """Each SGLang launcher is canary's, exported from ``canary``, with the same parameters in
    the same order, keyword-only in both."""
    theirs = getattr(importlib.import_module(f"{sglang.LAYOUT}.{module}"), name)
    ours = getattr(canary, name)
    assert name in canary.__all__
    assert parameters(ours) == parameters(theirs)
    assert {kind for _, kind in parameters(ours)} == {inspect.Parameter.KEYWORD_ONLY}
