"""Verify checks padding entries (slot 0) like any other instead of skipping them: breaks
SPEC §7 ("slot == 0 -> skip").

Kept safe: every canary buffer the suite builds has a slot 0, so the extra reads stay inside it.
"""

from known_bad._mutate import export, patch_kernels

patch_kernels(("& enabled_lanes & (slots != 0)", "& enabled_lanes"))

export(globals())
