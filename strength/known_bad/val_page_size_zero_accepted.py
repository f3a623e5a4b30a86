"""RealKvSource accepts page_size=0 (it checks ``page_size >= 0``): breaks CONTRACT §3 rule 3.

The classic config bug: 0 meant "unset", and the slot mapping then divides by zero.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(source.RealKvSource, "__post_init__", ("if page_size < 1:", "if page_size < 0:"))

export(globals())
