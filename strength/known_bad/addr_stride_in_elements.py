"""The row stride is taken in elements (``stride(0)``) rather than bytes, so any source whose
dtype is wider than a byte reads the wrong rows: breaks CONTRACT §3 ("rows are addressed by
stride(0)", a count of elements, times the element size).

Kept safe: the element stride is never more than the byte stride, so every row read is
inside the view.
"""

from canary.source import RealKvSource
from strength.known_bad._mutate import export, install

install(
    RealKvSource,
    "row_stride_bytes",
    property(lambda self: self.tensor.stride(0)),
    rebind=False,
)

export(globals())
