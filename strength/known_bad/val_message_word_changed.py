"""Rule 4's message says "nonzero multiple of 16" instead of "positive multiple of 16": breaks
CONTRACT §3 rule 4, whose message is SGLang's character for character.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source.RealKvSource,
    "__post_init__",
    (
        'num_bytes_per_token must be a positive multiple of 16, "',
        'num_bytes_per_token must be a nonzero multiple of 16, "',
    ),
)

export(globals())
