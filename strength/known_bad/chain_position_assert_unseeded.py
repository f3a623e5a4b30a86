"""The write position assert also runs for requests that start at the anchor (seed < 0):
breaks CONTRACT §6 ("position assert is on iff seed >= 0 and enable_chain_position_assert != 0")."""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "check_position = seeded & (tl.load(chain_assert_ptr) != 0)",
        "check_position = tl.load(chain_assert_ptr) != 0",
    )
)

export(globals())
