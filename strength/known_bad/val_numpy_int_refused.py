"""RealKvSource refuses numpy integers (it checks ``isinstance(value, int)``): breaks CONTRACT §3
rule 2, under which a numpy integer is an int.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source,
    "is_int",
    ("isinstance(value, (int, np.integer))", "isinstance(value, int)"),
    rebind=False,  # the sources' rule 2 only: modes, tags and capacities keep numpy integers
)

export(globals())
