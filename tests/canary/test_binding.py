"""canary._runtime binds each kernel body with its Triton parameter kinds intact.

The interpreter does not care whether a parameter is ``tl.constexpr``; the compiler does
(``tl.arange`` needs constexpr bounds, a constexpr flag selects code at compile time). A
binding that loses the annotations runs fine on the CPU and fails to compile for every GPU,
so this is checked here, without a GPU, on the bound ``JITFunction`` objects themselves.
"""

import inspect
import warnings

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

import canary.kernels
import canary.plan_kernels
from canary import _runtime

KERNELS = (
    "fingerprint_kernel",
    "verify_kernel",
    "write_kernel",
    "hash_kernel",
    "plan_offsets_kernel",
    "plan_entries_kernel",
    "scatter_req_token_ids_kernel",
)


def body(name: str):
    """The undecorated body of kernel ``name``, from the module that defines it."""
    for module in (canary.kernels, canary.plan_kernels):
        if hasattr(module, name):
            return getattr(module, name)
    raise LookupError(name)


def annotated_constexprs(body) -> list[str]:
    return [
        name
        for name, param in inspect.signature(body).parameters.items()
        if "constexpr" in str(param.annotation)
    ]


@pytest.mark.parametrize("name", KERNELS)
def test_compiled_binding_keeps_constexpr_parameters(name):
    """Every parameter annotated ``tl.constexpr`` in a kernel body is constexpr once bound."""
    compiled = getattr(_runtime._kernels("compiled"), name)
    want = annotated_constexprs(body(name))
    assert want, f"{name} declares no constexpr parameter; this test would prove nothing"
    got = [param.name for param in compiled.params if param.is_constexpr]
    assert got == want, f"compiled {name} has constexpr parameters {got}, the body declares {want}"


@pytest.mark.parametrize("name", KERNELS)
def test_integer_parameters_are_not_specialised_on_value(name):
    """Runtime integers (sizes, strides, addresses) never become constexpr by value."""
    compiled = getattr(_runtime._kernels("compiled"), name)
    for param in compiled.params:
        if not param.is_constexpr and not param.name.endswith("_ptr"):
            assert param.do_not_specialize, f"{name}.{param.name} would specialise on 1 / %16"


@pytest.mark.parametrize("name", KERNELS)
def test_pointers_and_constexprs_keep_their_specialisation(name):
    """Only runtime integers opt out of specialisation: pointers keep Triton's 16-byte
    alignment specialisation (the fold's 16-byte loads depend on it), constexprs their own."""
    compiled = getattr(_runtime._kernels("compiled"), name)
    kept = [p.name for p in compiled.params if p.is_constexpr or p.name.endswith("_ptr")]
    assert kept, f"{name} has no pointer or constexpr parameter; this test would prove nothing"
    for param in compiled.params:
        if param.name in kept:
            assert not param.do_not_specialize, f"{name}.{param.name} lost its specialisation"


def test_each_device_type_gets_its_triton_mode():
    """CUDA/ROCm tensors get compiled kernels, CPU tensors interpreted ones, others an error."""
    compiled = _runtime.kernels_for(torch.device("cuda"))
    interpreted = _runtime.kernels_for(torch.device("cpu"))
    for name in KERNELS:
        assert isinstance(getattr(compiled, name), JITFunction), name
        assert isinstance(getattr(interpreted, name), InterpretedFunction), name
    assert _runtime.kernels_for(torch.device("cpu")) is interpreted, "bound once per mode"
    with pytest.raises(ValueError, match=r"^kv-canary: no Triton backend for tensors on meta"):
        _runtime.kernels_for(torch.device("meta"))
    assert _runtime.is_interpreted(torch.device("cpu"))
    for other in ("cuda", "meta"):
        assert not _runtime.is_interpreted(torch.device(other)), other


def test_captured_launches_are_recorded_not_run():
    """Inside capture_launches a launch is handed back with its arguments and nothing runs."""
    out = torch.full((3,), 7, dtype=torch.int64)
    values = torch.tensor([1, 2, 3], dtype=torch.int64)
    with _runtime.capture_launches() as launches:
        _runtime.launch_kernel(
            torch.device("cpu"),
            "hash_kernel",
            (1,),
            out,
            values,
            values,
            values,
            3,
            MIX3=False,
            BLOCK=128,
        )
    assert [(launch.name, launch.grid, launch.kwargs) for launch in launches] == [
        ("hash_kernel", (1,), {"MIX3": False, "BLOCK": 128})
    ]
    assert launches[0].args[0] is out
    assert out.tolist() == [7, 7, 7], "a captured launch ran"


def test_an_interpreted_launch_patches_the_language_once(monkeypatch):
    """A CPU launch patches triton.language once for its whole grid, although its kernel calls
    jit helpers (the fold, splitmix64) many times; the interpreter's own patch function is
    back in place afterwards, and the hashes are the oracle's."""
    from triton.runtime import interpreter

    import reference

    real = interpreter._patch_lang
    calls = []

    def counting(fn):
        calls.append(fn.__name__)
        return real(fn)

    monkeypatch.setattr(interpreter, "_patch_lang", counting)
    rows = (torch.arange(4 * 96, dtype=torch.int64) % 251 + 1).to(torch.uint8).view(4, 96)
    source = canary.RealKvSource(tensor=rows, page_size=1, num_bytes_per_token=96, read_bytes=96)
    slots = torch.tensor([3, 0, 2], dtype=torch.int64)
    got = canary.fingerprint((source, source), slots, mode=canary.RealKvHashMode.ALL)
    assert calls == ["fingerprint_kernel"]
    assert interpreter._patch_lang is counting
    oracle = reference.Source(rows.numpy(), page_size=1, num_bytes_per_token=96, read_bytes=96)
    want = reference.fingerprint([oracle, oracle], slots.numpy(), reference.RealKvHashMode.ALL)
    assert got.tolist() == want.tolist()


def test_a_patch_is_skipped_only_for_functions_of_the_launch_s_globals(monkeypatch):
    """Inside patch_language_once the first request patches, later ones from the same globals
    (the launch's helpers) are skipped, a request from other globals still patches; the
    interpreter's function is put back, also when the launch raises."""
    from triton.runtime import interpreter

    served = []

    def real(fn):
        served.append(fn)
        return f"scope of {fn.__name__}"

    monkeypatch.setattr(interpreter, "_patch_lang", real)
    monkeypatch.setattr(_runtime, "INDEX_NEEDS_MENDING", False)  # the scopes are strings here
    ours, theirs = {}, {}
    exec("def kernel(): pass\ndef helper(): pass", ours)
    exec("def other(): pass", theirs)
    with _runtime.patch_language_once():
        assert interpreter._patch_lang(ours["kernel"]) == "scope of kernel"
        assert interpreter._patch_lang(ours["helper"]) is None
        assert interpreter._patch_lang(ours["kernel"]) is None
        assert interpreter._patch_lang(theirs["other"]) == "scope of other"
    assert served == [ours["kernel"], theirs["other"]]
    assert interpreter._patch_lang is real
    with pytest.raises(RuntimeError), _runtime.patch_language_once():
        raise RuntimeError("a launch failed")
    assert interpreter._patch_lang is real


def _as_triton_3_6(monkeypatch):
    """Make the interpreter patch as Triton 3.6's does: a tensor's index is ``int()`` of its
    one-element array, which numpy 2.4 and later refuse (numpy before 2.4 warns, made an error
    here)."""
    from triton.runtime import interpreter

    real = interpreter._patch_lang

    def patch_as_3_6(fn):
        scope = real(fn)
        scope.set_attr(tl.core.tensor, "__index__", lambda self: int(self.handle.data))
        return scope

    monkeypatch.setattr(interpreter, "_patch_lang", patch_as_3_6)


def _fingerprint_and_oracle():
    import reference

    rows = (torch.arange(4 * 96, dtype=torch.int64) % 251 + 1).to(torch.uint8).view(4, 96)
    source = canary.RealKvSource(tensor=rows, page_size=1, num_bytes_per_token=96, read_bytes=96)
    slots = torch.tensor([3, 0, 2], dtype=torch.int64)
    oracle = reference.Source(rows.numpy(), page_size=1, num_bytes_per_token=96, read_bytes=96)
    want = reference.fingerprint([oracle, oracle], slots.numpy(), reference.RealKvHashMode.ALL)
    return (
        lambda: canary.fingerprint((source, source), slots, mode=canary.RealKvHashMode.ALL)
    ), want


def test_an_interpreter_that_indexes_with_int_of_an_array_is_mended(monkeypatch):
    """Triton 3.6's interpreter fails every loop bounded by a kernel argument under numpy 2.4
    and later (triton-lang/triton#9171); before Triton 3.7 a launch's patch indexes with the
    array's element, the hashes are the oracle's, and the tensor's index is put back."""
    _as_triton_3_6(monkeypatch)
    run, want = _fingerprint_and_oracle()
    monkeypatch.setattr(_runtime, "INDEX_NEEDS_MENDING", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(Exception, match="0-dimensional|scalar"):
            run()
    monkeypatch.setattr(_runtime, "INDEX_NEEDS_MENDING", True)
    before = tl.core.tensor.__dict__.get("__index__")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert run().tolist() == want.tolist()
    assert tl.core.tensor.__dict__.get("__index__") is before


@pytest.mark.parametrize(
    "version, mended",
    [
        ("3.5.1", True),
        ("3.6.0", True),
        ("3.7.0", False),
        ("3.7.0+git1a2b3c", False),
        ("3.10.0", False),
        ("4.0.0", False),
        ("dev", True),
    ],
)
def test_the_index_is_mended_before_triton_3_7_only(version, mended):
    assert _runtime.index_needs_mending(version) is mended
    assert _runtime.INDEX_NEEDS_MENDING is _runtime.index_needs_mending(triton.__version__)


@pytest.mark.parametrize("mode", ["compiled", "interpreted"])
def test_each_kernel_module_is_bound_in_a_namespace_of_its_own(mode):
    """The plan kernels' helpers resolve in their own module's namespace of the same mode,
    never in the write/verify kernels' one (and the other way round)."""
    bound = _runtime._kernels(mode)
    plan_globals = bound.plan_entries_kernel.fn.__globals__
    verify_globals = bound.verify_kernel.fn.__globals__
    assert plan_globals is not verify_globals
    assert plan_globals["__name__"] == f"canary.plan_kernels.{mode}"
    assert plan_globals["find_row"] is bound.find_row
    assert plan_globals["find_row"] is bound.scatter_req_token_ids_kernel.fn.__globals__["find_row"]
    assert "find_row" not in verify_globals and "splitmix64" not in plan_globals


def test_a_replaced_kernel_module_keeps_the_other(monkeypatch):
    """use_kernel_module replaces the bodies of the module it is told (canary.kernels by
    default) and keeps the other's; a module that is none of canary's is refused."""
    import importlib.util
    import sys

    name = "stand_in_plan_kernels"
    spec = importlib.util.spec_from_file_location(name, canary.plan_kernels.__file__)
    stand_in = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, stand_in)  # inspect finds its source there
    spec.loader.exec_module(stand_in)
    monkeypatch.setattr(_runtime, "_source_modules", dict(_runtime._source_modules))
    _runtime._kernels.cache_clear()
    try:
        _runtime.use_kernel_module(stand_in, replacing=canary.plan_kernels)
        bound = _runtime._kernels("compiled")
        assert bound.scatter_req_token_ids_kernel.fn.__module__ == f"{name}.compiled"
        assert bound.verify_kernel.fn.__module__ == "canary.kernels.compiled"
        with pytest.raises(ValueError, match="is not a kernel module of canary"):
            _runtime.use_kernel_module(stand_in, replacing=stand_in)
    finally:
        monkeypatch.undo()
        _runtime._kernels.cache_clear()
