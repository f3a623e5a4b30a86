"""Verify checks expected tokens even when ``check_verify_expected_token`` is false: breaks
CONTRACT §7 (the expected tensor is not read when the flag is false)."""

from canary import launch
from strength.known_bad._mutate import export, patch_function

patch_function(
    launch,
    "launch_canary_verify_kernel",
    ("CHECK_TOKEN=bool(check_verify_expected_token)", "CHECK_TOKEN=True"),
)

export(globals())
