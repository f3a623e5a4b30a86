"""splitmix64 shifts its state as int64 (bitcast before each ``>>``), so every shift is
arithmetic and drags the sign bit in: breaks CONTRACT §2 ("logical shifts").
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    ("x = x ^ (x >> 30)", "x = x ^ as_u64(as_i64(x) >> 30)"),
    ("x = x ^ (x >> 27)", "x = x ^ as_u64(as_i64(x) >> 27)"),
    ("return x ^ (x >> 31)", "return x ^ as_u64(as_i64(x) >> 31)"),
)

export(globals())
