"""The row's byte offset ``row * row_stride_bytes`` is computed in int32, so it wraps once a
source passes 2**31 bytes: breaks CONTRACT §3/§4 (addresses are 64-bit; CONTRACT §9 lists this bug).

Safe on the suite's far-address test: its view starts 2**31 + 64 bytes into one buffer, so a
wrapped offset lands inside that buffer, never before it.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "starts = base_addr + rows * row_stride_bytes + cols",
        "starts = base_addr + (rows * row_stride_bytes).to(tl.int32).to(tl.int64) + cols",
    ),
)

export(globals())
