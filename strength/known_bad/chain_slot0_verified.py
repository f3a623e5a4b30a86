"""Verify checks padding entries (slot 0) like any other instead of skipping them: breaks
CONTRACT §7 ("slot == 0 -> skip").

Kept safe: every canary buffer the suite builds has a slot 0, so the extra reads of records
stay inside it; slot 0's real-KV bytes are not read (a source may have no rows), so its
fingerprint is the fold of nothing, and a padding entry is still compared with it.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    ("& enabled_lanes & (slots != 0)", "& enabled_lanes"),
    ("            slots, live,\n", "            slots, live & (slots != 0),\n"),
)

export(globals())
