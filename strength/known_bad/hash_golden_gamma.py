"""splitmix64 first adds the golden-gamma increment ``0x9E3779B97F4A7C15`` (the full generator
step, not the finalizer): breaks CONTRACT §2 ("the finalizer only, no golden-gamma increment").
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "def splitmix64(x):\n",
        "GOLDEN_GAMMA = tl.constexpr(0x9E3779B97F4A7C15)\n\n\n"
        "def splitmix64(x):\n    x = x + GOLDEN_GAMMA\n",
    ),
)

export(globals())
