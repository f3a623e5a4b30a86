"""Not a catalogue mutant: canary whose every hashing launch dies of a ``NameError`` (a patch that
broke the module), for the gate's self-tests. CONTRACT §4 is not what fails here: the suite's tests
of fingerprint crash before any property is checked, so the gate must report an error, never a
kill, although those tests fail.
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash, "source_args", ("args: list[int] = []", "args: list[int] = list(no_such_name)")
)

export(globals())
