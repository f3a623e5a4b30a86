"""RealKvSource checks only the last dimension's stride, as if every row were 1-D, so an N-D row
with a gap between its inner blocks is accepted: breaks CONTRACT §3 rule 8.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source,
    "_rows_are_dense",
    ("zip(reversed(shape[1:]), reversed(strides[1:]))", "zip(shape[-1:], strides[-1:])"),
)

export(globals())
