"""Compile-only: the fold reads one u64 word per lane per step from integer-built
addresses that carry no alignment, as canary's first fold did. Same hashes everywhere, so
the conformance suite passes; on a GPU each word is a separate 8-byte load instead of one
16-byte load per chunk. Killed by the code-generation checks (tests/canary/test_codegen.py), not in
the gate's catalogue.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "    words = tl.max_contiguous(tl.multiple_of(words, [16, 2]), [1, 2])\n",
        "",
    ),
    (
        """        low, high = tl.split(tl.load(words + 2 * chunk, mask=live_pair, other=0))
        acc = splitmix64(acc ^ low)
        acc = splitmix64(acc ^ high)""",
        """        word = starts.to(tl.pointer_type(tl.uint64)) + 2 * chunk
        acc = splitmix64(acc ^ tl.load(word, mask=live, other=0))
        acc = splitmix64(acc ^ tl.load(word + 1, mask=live, other=0))""",
    ),
)

export(globals())
