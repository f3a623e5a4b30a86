"""Sources are combined with ``h ^= fold(src)`` without the splitmix64 step, so equal folds
cancel and one source's hash is its bare fold: breaks CONTRACT §4 (``h = splitmix64(h ^ fold)``).
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(("h = splitmix64(h ^ fold_source(", "h = (h ^ fold_source("))

export(globals())
