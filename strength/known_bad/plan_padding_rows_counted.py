"""A padding row's stale ``extend_seq_lens`` is counted into the write offsets, as if its
CUDA-graph padding tokens were written: breaks CONTRACT §12 item 1 (a padding row contributes
nothing, wherever it stands)."""

from strength.known_bad._mutate import export, patch_plan_kernels

patch_plan_kernels(
    (
        "extend_len = tl.load(extend_seq_lens_ptr + rows, mask=real, other=0)",
        "extend_len = tl.load(extend_seq_lens_ptr + rows, mask=in_batch, other=0)",
    )
)

export(globals())
