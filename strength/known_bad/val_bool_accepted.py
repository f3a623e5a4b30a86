"""RealKvSource takes ``True`` for an int (bool is an int subclass): breaks CONTRACT §3 rule 2."""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(source, "is_int", (" and not isinstance(value, (bool, np.bool_))", ""), rebind=False)

export(globals())
