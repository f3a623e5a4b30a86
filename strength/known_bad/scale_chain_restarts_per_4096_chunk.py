"""The write kernel walks a request in chunks of 4096 entries and each chunk restarts the
running hash from the request's start (its seed's hash, or the anchor) instead of carrying
it, so entry 4096 of a request (counted from its first entry, skipped ones included), and
every 4096th after it, stores the seed's hash as its ``prev_hash``: breaks CONTRACT §6 (the
running hash advances along the whole request; CONTRACT §6).

Passes on small worlds: today's write batches hold a handful of entries per request, far
from 4097, so no entry ever reaches the first restart.

Safe: only the value of the running hash changes; every load and store is the one canary
makes, at the same addresses and under the same masks.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "        running = tl.where(\n"
        "            seeded,\n"
        "            splitmix64_mix3(as_u64(s_prev_hash), as_u64(s_token), as_u64(s_position)),\n"
        "            as_u64(seed * 0) + ANCHOR_HASH,\n"
        "        )\n",
        "        initial = tl.where(\n"
        "            seeded,\n"
        "            splitmix64_mix3(as_u64(s_prev_hash), as_u64(s_token), as_u64(s_position)),\n"
        "            as_u64(seed * 0) + ANCHOR_HASH,\n"
        "        )\n"
        "        running = initial\n",
    ),
    (
        "        for i in range(start, end):\n            slot = next_slot\n",
        "        for i in range(start, end):\n"
        "            running = tl.where((i > start) & ((i - start) % 4096 == 0), initial, running)\n"
        "            slot = next_slot\n",
    ),
)

export(globals())
