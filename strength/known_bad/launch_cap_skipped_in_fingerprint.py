"""fingerprint skips the 4-source cap and silently folds only the first four sources (the
write and verify launchers keep the cap): breaks CONTRACT §4's first launch check.
"""

from canary import real_kv_hash
from strength.known_bad._mutate import export, install, patch_function


def _no_cap(sources) -> None:
    """The cap check, gone."""


# Only the fingerprint module's own name is replaced: launch.py imported the real check
# under its own name, so write and verify still refuse a fifth source.
install(real_kv_hash, "check_source_count", _no_cap, rebind=False)
patch_function(
    real_kv_hash,
    "source_args",
    ("for source in sources:", "for source in sources[:MAX_REAL_KV_SOURCES]:"),
    ("return args, len(sources)", "return args, min(len(sources), MAX_REAL_KV_SOURCES)"),
)

export(globals())
