"""fingerprint checks the 4-source cap only after every source's type and device, so five
sources with one on another device raise the device error: breaks CONTRACT §4's order of launch
checks (the cap comes first).
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, install

_cap = real_kv_hash.check_source_count
_per_source = real_kv_hash.check_sources


def _no_cap(sources) -> None:
    """The cap check at its usual places, gone."""


def _check_sources_cap_last(sources, device, what: str) -> None:
    _per_source(sources, device, what)  # finds the no-op cap in its module's globals
    _cap(sources)


# Only the fingerprint module's names are replaced: launch.py imported the real checks under
# its own names, so write and verify keep the cap first.
install(real_kv_hash, "check_source_count", _no_cap, rebind=False)
install(real_kv_hash, "check_sources", _check_sources_cap_last, rebind=False)

export(globals())
