"""Compile-only: the fold derives each chunk's row and column from the slot's flat byte
index, dividing by the page's byte size once per 16-byte chunk instead of once per slot.
The same addresses (a chunk never leaves its slot), so the same hashes, and the conformance
suite passes; on a GPU each chunk pays a 64-bit division. Killed by the code-generation
checks (tests/canary/test_codegen.py), not in the gate's catalogue.
"""

from strength.known_bad._mutate import export, patch_kernels

patch_kernels(
    (
        "        low, high = tl.split(tl.load(words + 2 * chunk, mask=live_pair, other=0))",
        """        flat = slots * bytes_per_token + 16 * chunk
        page_bytes = page_size * bytes_per_token
        at = base_addr + (flat // page_bytes) * row_stride_bytes + flat % page_bytes
        tile = at.to(tl.pointer_type(tl.uint64))[:, None] + pair[None, :]
        low, high = tl.split(tl.load(tile, mask=live_pair, other=0))""",
    ),
)

export(globals())
