"""RealKvSource checks the row stride (rule 7) before the dimension count (rule 6), so a 1-D
tensor gets the row-stride message: breaks CONTRACT §3's "first broken rule raises" order.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

_NDIM_CHECK = """\
    if tensor.ndim < 2:
        raise ValueError(f"{_PREFIX}.tensor must be at least 2-D, got shape {shape}")
"""

patch_function(
    source.RealKvSource,
    "__post_init__",
    (_NDIM_CHECK, ""),
    # a 0-D tensor has no stride(0); it reads as 0 bytes, which passes rule 7
    (
        "row_stride_bytes = strides[0] * element_size",
        "row_stride_bytes = (strides[:1] or (0,))[0] * element_size",
    ),
    (
        "    if not _rows_are_dense(shape, strides):\n",
        _NDIM_CHECK + "    if not _rows_are_dense(shape, strides):\n",
    ),
)

export(globals())
