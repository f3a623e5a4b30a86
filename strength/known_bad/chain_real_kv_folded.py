"""Write folds the slot's real-KV hash into the running chain: breaks CONTRACT §6 (the chain is
``mix3(running, token, position)``; real_kv_hash is stored beside it, not chained)."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "writing, splitmix64_mix3(running, as_u64(token), as_u64(position)), running",
        "writing, splitmix64_mix3(running ^ as_u64(real_kv), as_u64(token), as_u64(position)),"
        " running",
    )
)

export(globals())
