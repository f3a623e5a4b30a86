"""Verify index-checks the plan even when it is disabled (enable == 0), so a plan left
unwritten after an overflow raises: breaks CONTRACT §8 ("for verify only when enable != 0")."""

from canary import launch
from strength.known_bad._mutate import export, patch_function

patch_function(
    launch,
    "check_verify_launch",
    (
        "    if int(plan.enable.item()) != 0:\n        # A plan disabled",
        "    if True:\n        # A plan disabled",
    ),
)

export(globals())
