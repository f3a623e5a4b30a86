"""Modes, launch tags and plan capacities refuse numpy integers (each checks
``isinstance(value, int)``), while the sources' rule 2 takes them: breaks CONTRACT §11, under
which a numpy integer is an int wherever an int is accepted.
"""

from canary import buffers, launch, real_kv_hash
from strength.known_bad._mutate import export, install


def python_int_only(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


for module in (real_kv_hash, launch, buffers):
    install(module, "is_int", python_int_only, rebind=False)

export(globals())
