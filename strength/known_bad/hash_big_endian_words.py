"""Each u64 word of a slot is folded big-endian (its bytes reversed) instead of little-endian:
breaks CONTRACT §4 ("fold its bytes as little-endian u64 words").
"""

from strength.known_bad._mutate import export, patch_kernels

_BYTESWAP = """\
def byteswap64(w):
    # w's eight bytes in the opposite order
    r = w & 0
    r |= (w & 0xFF) << 56
    r |= ((w >> 8) & 0xFF) << 48
    r |= ((w >> 16) & 0xFF) << 40
    r |= ((w >> 24) & 0xFF) << 32
    r |= ((w >> 32) & 0xFF) << 24
    r |= ((w >> 40) & 0xFF) << 16
    r |= ((w >> 48) & 0xFF) << 8
    r |= (w >> 56) & 0xFF
    return r


def fold_source("""

patch_kernels(
    ("def fold_source(", _BYTESWAP),
    (
        "acc = splitmix64(acc ^ low)\n        acc = splitmix64(acc ^ high)",
        "acc = splitmix64(acc ^ byteswap64(low))\n        acc = splitmix64(acc ^ byteswap64(high))",
    ),
)

export(globals())
