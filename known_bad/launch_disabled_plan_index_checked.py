"""Verify index-checks the plan even when it is disabled (enable == 0), so a plan left
unwritten after an overflow raises: breaks SPEC §8 ("for verify only when enable != 0")."""

from canary import launch
from known_bad._mutate import export, patch_function

patch_function(
    launch, "launch_canary_verify_kernel", ("if int(plan.enable.item()) != 0:", "if True:")
)

export(globals())
