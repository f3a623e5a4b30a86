"""Write and verify do not check their slots against the sources' capacity (fingerprint still
does): breaks CONTRACT §8 ("no launch reads or writes outside its buffers"), the gap SGLang's
CUDA path has.

Kept safe: only the suite's launch-validation case has slots past a source's capacity, and
that source is the first row of a larger tensor, so the rows read past it are still memory
of that tensor.
"""

from canary import launch
from strength.known_bad._mutate import export, install


def _unchecked(sources, slots, what="slot") -> None:
    """The capacity check, gone from the launchers."""


install(launch, "check_slots_in_sources", _unchecked, rebind=False)

export(globals())
