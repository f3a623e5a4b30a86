"""The expected-token scatter writes, into each pool row, only the tokens past those it wrote
there in earlier launches: an incremental scatter. It breaks CONTRACT §13 only when one pool
serves many launches, as in an engine: a row recycled for another request keeps its old owner's
tokens, and verify then reports tokens that are right. Every property that makes its pool
afresh passes. Kept safe: it only leaves pool entries as they were."""

import weakref

import torch

import canary.scatter as scatter_module
from strength.known_bad._mutate import export, install

_real = scatter_module.launch_scatter_req_token_ids_kernel
_seen: dict = {}  # id of a tensor -> (a weak reference to it, what is remembered of it)


def _memory(tensor) -> dict:
    """What is remembered of ``tensor`` (a tensor is not a dictionary key: its == is elementwise)."""
    held = _seen.get(id(tensor))
    if held is None or held[0]() is not tensor:
        held = _seen[id(tensor)] = (weakref.ref(tensor), {})
    return held[1]


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
