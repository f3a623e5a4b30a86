"""The chain step XORs its three inputs and mixes once, ``splitmix64(a ^ b ^ c)``, instead of
``splitmix64_mix3``: breaks CONTRACT §2 (order matters; equal inputs must not cancel)."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    return splitmix64(splitmix64(splitmix64(a) ^ b) ^ c)",
        "    return splitmix64(a ^ b ^ c)",
    )
)

export(globals())
