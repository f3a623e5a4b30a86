"""RealKvSource does not check that ``data_ptr()`` is 16-byte aligned: breaks CONTRACT §3 rule 10."""

from canary import source
from strength.known_bad._mutate import export, patch_function

patch_function(
    source.RealKvSource,
    "__post_init__",
    (
        """\
    if misalignment != 0:
        raise ValueError(
            f"{_PREFIX}.tensor data pointer must be 16-byte aligned, got data_ptr % 16 == "
            f"{misalignment}"
        )
""",
        "",
    ),
)

export(globals())
