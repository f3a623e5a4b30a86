"""The expected-token scatter writes, into each pool row, only the tokens past those it wrote
there in earlier launches: an incremental scatter. It breaks CONTRACT §13 only when one pool
serves many launches, as in an engine: a row recycled for another request keeps its old owner's
tokens, and verify then reports tokens that are right. Every property that makes its pool
afresh passes. Kept safe: it only leaves pool entries as they were."""

import torch

import canary.scatter as scatter_module
from strength.known_bad._mutate import TensorMemory, export, install

_real = scatter_module.launch_scatter_req_token_ids_kernel
_memory = TensorMemory().of


def launch_scatter_req_token_ids_kernel(**kwargs):
    pool, offsets, rows = (kwargs.get(k) for k in ("pool_out", "offsets", "req_pool_indices"))
    tensors = all(isinstance(t, torch.Tensor) for t in (pool, offsets, rows))
    if not tensors or pool.dim() != 2 or rows.dim() != 1 or offsets.shape != (rows.shape[0] + 1,):
        return _real(**kwargs)
    done = _memory(pool)
    try:  # what to keep is read first; arguments it cannot read go to the real checks as given
        lengths = (offsets[1:] - offsets[:-1]).tolist()
        keep = [
            (r, pool[r, : min(done[r], n)].clone())
            for r, n in zip(rows.tolist(), lengths)
            if r in done
        ]
    except Exception:
        return _real(**kwargs)
    _real(**kwargs)
    for r, old in keep:
        pool[r, : old.shape[0]] = old
    for r, n in zip(rows.tolist(), lengths):
        if 0 <= r < pool.shape[0]:
            done[r] = max(done.get(r, 0), n)


install(scatter_module, "launch_scatter_req_token_ids_kernel", launch_scatter_req_token_ids_kernel)

export(globals())
