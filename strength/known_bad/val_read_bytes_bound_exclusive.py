"""RealKvSource refuses ``read_bytes == num_bytes_per_token`` (an off-by-one in the upper bound):
breaks CONTRACT §3 rule 5, whose range is ``(0, num_bytes_per_token]``.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source.RealKvSource,
    "__post_init__",
    ("read_bytes > num_bytes_per_token", "read_bytes >= num_bytes_per_token"),
)

export(globals())
