"""Sources are combined in reverse tuple order: breaks CONTRACT §4 ("combine the sources in tuple
order")."""

from canary import real_kv_hash
from strength.known_bad._mutate import export, patch_function

patch_function(
    real_kv_hash, "source_args", ("for source in sources:", "for source in reversed(sources):")
)

export(globals())
