"""With the input assert on, the chain advances on the expected token and position instead of
the actual ones, so one failed assert cascades: breaks CONTRACT §6 ("with the actual values")."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "            if INPUT_ASSERT:\n",
        "            chain_token = token\n"
        "            chain_position = position\n"
        "            if INPUT_ASSERT:\n",
    ),
    (
        "                input_bits = tl.where(token != want_token, FAIL_WRITE_TOKEN, 0)\n",
        "                chain_token = want_token\n"
        "                chain_position = want_position\n"
        "                input_bits = tl.where(token != want_token, FAIL_WRITE_TOKEN, 0)\n",
    ),
    (
        "writing, splitmix64_mix3(running, as_u64(token), as_u64(position)), running",
        "writing, splitmix64_mix3(running, as_u64(chain_token), as_u64(chain_position)), running",
    ),
)

export(globals())
