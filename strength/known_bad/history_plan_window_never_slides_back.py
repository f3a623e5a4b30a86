"""The plan keeps, per page table and pool row, the SWA window start of earlier launches and never
lets it move back ("windows only slide forward"). It breaks CONTRACT §12 item 2 only when one
table serves many launches: a row recycled for a request with a shorter prefix keeps the old
owner's window start, so the new request's first positions go unverified. Every property that
makes its table afresh passes. Kept safe: it only plans fewer positions of the same row."""

import torch

import canary.plan as plan_module
from strength.known_bad._mutate import TensorMemory, export, install

_real = plan_module.launch_canary_plan_kernels
_memory = TensorMemory().of


def launch_canary_plan_kernels(**kwargs):
    table, rows, prefixes = (
        kwargs.get(k) for k in ("req_to_token", "req_pool_indices", "prefix_lens")
    )
    window = kwargs.get("swa_window_size")
    tensors = all(isinstance(t, torch.Tensor) for t in (table, rows, prefixes))
    if not tensors or not isinstance(window, int) or window <= 0 or rows.shape != prefixes.shape:
        return _real(**kwargs)
    known = _memory(table)
    # a window that may not start before the remembered one: the positions before it are
    # planned as if they held the padding slot, which verify skips
    planned, lut = table, kwargs.get("full_to_swa_index_mapping")
    try:  # arguments it cannot read go to the real checks as given
        held = [(r, known[r]) for r in rows.tolist() if r in known]
    except Exception:
        return _real(**kwargs)
    if held and isinstance(lut, torch.Tensor) and lut.dim() == 1 and lut.shape[0] > 0:
        lut = lut.clone()
        planned = table.clone()
        for r, start in held:
            start = min(start, table.shape[1])
            planned[r, :start] = 0
        lut[0] = 0
    _real(**{**kwargs, "req_to_token": planned, "full_to_swa_index_mapping": lut})
    for r, p in zip(rows.tolist(), prefixes.tolist()):
        if r > 0:
            known[r] = max(known.get(r, 0), p - window)


install(plan_module, "launch_canary_plan_kernels", launch_canary_plan_kernels)

export(globals())
