"""RealKvSource does not check that a row holds ``page_size * num_bytes_per_token`` bytes (as
SGLang's CUDA path): breaks CONTRACT §3 rule 9.
"""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source.RealKvSource,
    "__post_init__",
    (
        """\
    if row_bytes < needed:
        raise ValueError(
            f"{_PREFIX}.tensor row is {row_bytes} bytes wide but page_size={page_size} x "
            f"num_bytes_per_token={num_bytes_per_token} needs {needed} "
            f"(shape={shape}, dtype={tensor.dtype})"
        )
""",
        "",
    ),
)

export(globals())
