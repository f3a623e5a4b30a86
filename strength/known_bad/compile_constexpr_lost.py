"""Compile-only: the kernel binding drops the bodies' annotations, so no parameter is
``tl.constexpr`` once compiled. The interpreter does not care, so the conformance suite on CPU
passes; Triton's compiler rejects ``tl.arange(0, BLOCK)`` with a runtime ``BLOCK``. Only
``tools.compile_check`` can kill this one: it is not in the gate's catalogue
(tests/tools/test_compile_check.py runs it).
"""

from canary import _runtime
from strength.known_bad._mutate import export, patch_function

patch_function(
    _runtime,
    "_bind",
    ("        copy.__annotations__ = dict(body.__annotations__)\n", ""),
)

export(globals())
