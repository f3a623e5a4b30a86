"""canary._runtime binds each kernel body with its Triton parameter kinds intact.

The interpreter does not care whether a parameter is ``tl.constexpr``; the compiler does
(``tl.arange`` needs constexpr bounds, a constexpr flag selects code at compile time). A
binding that loses the annotations runs fine on the CPU and fails to compile for every GPU,
so this is checked here, without a GPU, on the bound ``JITFunction`` objects themselves.
"""

import inspect

import pytest

import canary.kernels
from canary import _runtime

KERNELS = ("fingerprint_kernel", "verify_kernel", "write_kernel", "hash_kernel")


def annotated_constexprs(body) -> list[str]:
    return [
        name
        for name, param in inspect.signature(body).parameters.items()
        if "constexpr" in str(param.annotation)
    ]


@pytest.mark.parametrize("name", KERNELS)
def test_compiled_binding_keeps_constexpr_parameters(name):
    """Every parameter annotated ``tl.constexpr`` in canary/kernels.py is constexpr once bound."""
    body = getattr(canary.kernels, name)
    compiled = getattr(_runtime._kernels("compiled"), name)
    want = annotated_constexprs(body)
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
