"""EAGLE drafting a tree (``topk`` > 1), for the target model's histories of the support
matrix's tree row: each target verify as SGLang's tree verify launches it, then the accepted
path's KV moved to the front of the request's block as SGLang moves it.

SGLang builds the verify's tree (``speculative/eagle_utils.py``: ``build_tree_kernel_efficient``,
whose Triton build :func:`sglang_tree` runs on this module's tree): ``speculative_num_draft_tokens``
nodes a request, in the order of their slots
(``out_cache_loc`` runs over ``[seq_len, seq_len + draft_token_num)`` of the request's row),
each at the position of its depth, ``seq_len + depth`` ("if depth of each draft token is [0, 1,
1, 2] and the prompt length is 7, then positions = [7, 8, 8, 9]"), siblings at one position.
The canary's ``PlanInput`` plans the verify's writes from ``seq_lens`` and the draft count and
the write takes the batch's ``positions`` (``kv_canary/plan_input.py``, run by the leg). After
the verify, ``_finalize_accept_tree_path`` (read) moves the accepted path's KV to the slots of
depths ``1 .. accepted`` with ``move_accept_tokens_to_target_kvcache``, which :func:`as_tree`
runs (:func:`_accept_mover`: its launchers' Triton kernels interpreted) to choose the moves, and
the pool's ``move_kv_cache`` moves the K and V buffers alone: the records stay
(:mod:`conformance.sglang.kv_paths`, run, [23]).

The tree here (:func:`depth`, a named choice: SGLang's shape follows the draft model's scores)
has two nodes at every depth past the root, ``topk`` 2: the node on the path the target accepts
(the engine model's chain of drafts, its tokens) and a sibling with a token of its own. A
verify of the engine model (:meth:`engine_model.Engine.target_verify`) becomes that tree's
(:func:`as_tree`): its slots, KV and rows as the engine planned them, node ``j``'s token and
position the tree's. The engine accepts a prefix of its chain; the move takes the path's nodes
at the depths it accepted, those the tree holds.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types

import numpy as np
import torch

from conformance.sglang import loading
from engine_model import Engine, Forward, Move
from engine_model.steps import MoveGroup
from engine_model.vocabulary import FULL, TARGET_VERIFY

__all__ = ["TOPK", "as_tree", "depth", "sglang_draft_batch", "sglang_tree", "verify", "widen"]

#: The tree's branching: two nodes at every depth past the root.
TOPK = 2
#: A sibling's token: the path's token at its depth with these bits flipped (another token).
_SIBLING = 0x5A5A
_keys = itertools.count(1 << 40)  # the moves' host copies, apart from the engine's own


def depth(j: int) -> int:
    """The depth of node ``j`` (0: the root, the sampled token): the path's node of depth
    ``d`` is node ``2 d - 1``, its sibling node ``2 d``."""
    return (j + 1) // 2


def as_tree(engine: Engine, forward: Forward, records: bool = False) -> list:
    """``forward`` (a target verify the engine just made) as SGLang launches a tree verify,
    then the move of each row's accepted path, save and load (none where nothing moves), the
    records left behind (``records``: moved with the KV)."""
    plan, write = forward.plan, forward.write
    ids, positions = write["input_ids"].copy(), write["positions"].copy()
    slots = forward.groups[0].out_cache_loc
    owners = {r.row: r for r in engine.running.values()}
    rows = plan["req_pool_indices"].tolist()
    accept = np.full((len(rows), 1 + depth(len(slots) // max(len(rows), 1) - 1)), -1)
    for b, row in enumerate(rows):
        at = np.flatnonzero(forward.token_rows == b)
        if row == 0 or row not in owners or not len(at):  # a padding row keeps its tokens
            continue
        prefix, chain = int(plan["prefix_lens"][b]), ids[at].copy()
        for j in range(1, len(at)):
            positions[at[j]] = prefix + depth(j)
            ids[at[j]] = chain[depth(j)] ^ (0 if j % 2 else _SIBLING)
        accepted = min(owners[row].written - prefix - 1, depth(len(at) - 1))
        path = [0, *range(1, 2 * accepted, 2)]  # the path's nodes of depths 0 .. accepted
        accept[b, : len(path)] = at[path]
    # SGLang's own move (run): the path's node of depth d to the window's slot d
    moved = [(s, t) for s, t in _accept_mover()(forward, accept) if s != t]
    sources, targets = [s for s, _ in moved], [t for _, t in moved]
    made = {"input_ids": ids, "positions": positions}
    # the input assert's expected inputs, where they are the inputs themselves (a target
    # verify's, [18]), follow the tree's inputs
    for key, name in (
        ("expected_input_tokens", "input_ids"),
        ("expected_input_positions", "positions"),
    ):
        if write.get(key) is not None:
            made[key] = np.where(write[key] == write[name], made[name], write[key])
    tree = dataclasses.replace(forward, write={**write, **made})
    if not sources:
        return [tree]
    key, n = next(_keys), len(sources)
    save = Move("accept", key, True, (MoveGroup(FULL, np.asarray(sources, dtype=np.int64)),))
    load = Move("accept", key, False, (MoveGroup(
        FULL, np.asarray(targets, dtype=np.int64), kv_from=np.arange(n, dtype=np.int64),
        records_from=np.arange(n, dtype=np.int64) if records else np.full(n, -1, dtype=np.int64),
    ),))  # fmt: skip
    return [tree, save, load]


def _speculative_code(sources: dict, **scope) -> dict:
    """SGLang's speculative code, executed from the installed release's source with its
    ``@triton.jit`` kernels interpreted: ``sources`` maps a path under the ``sglang`` folder to
    the names to take from it (those of them the release defines), ``scope`` adds names the
    code reads. The kernels' launchers take their GPU path (``_is_cpu`` False, not the CPU
    builds), and the out-of-bounds probe (a debug check) does nothing. The namespace, its
    functions calling the interpreted kernels."""
    import triton
    import triton.language as tl

    from conformance.adapters import sglang as adapter

    name = "sglang_speculative_source"
    namespace: dict = {
        "__name__": name, "torch": torch, "triton": triton, "tl": tl, "_is_cpu": False,
        "next_power_of_2": triton.next_power_of_2, "maybe_detect_oob": lambda *a, **k: None,
        **scope,
    }  # fmt: skip
    for relative, names in sources.items():
        path = loading.sglang_root() / relative
        text = path.read_text()
        loading.from_source(path, tuple(n for n in names if f"def {n}(" in text), namespace)
    module = types.ModuleType(name)
    module.__dict__.update(namespace)
    return adapter.interpreted_namespace(module)


def _interpreted_language():
    """The block inside which ``triton.language``'s own helpers are interpreted."""
    from conformance.adapters import sglang as adapter

    return adapter._interpreted_language()


#: SGLang's speculative kernels' folder, under the ``sglang`` folder.
_OPS = "kernels/ops/speculative"


def sglang_tree(seq_lens, depth_steps: int) -> tuple:
    """The tree of :func:`depth` (``depth_steps`` draft steps, ``1 + 2 depth_steps`` nodes a
    request) built by SGLang's own tree kernel (``sgl_build_tree_kernel_efficient_triton`` of
    ``kernels/ops/speculative/spec_tree.py``, the Triton build of ``build_tree_kernel_efficient``,
    executed from the installed release's source and interpreted) for requests of
    ``seq_lens``: each node's position, and the retrieve links (next token, next sibling), as
    ``[requests, nodes]`` arrays. EAGLE's draft encodes the tree as the score index each node
    was selected at and, per step, the score index of the node it expanded: here node ``i`` was
    selected at ``i - 1`` and step ``d`` expanded the path's node of depth ``d``."""
    name = "sgl_build_tree_kernel_efficient_triton"
    kernel = _speculative_code({f"{_OPS}/spec_tree.py": (name,)})[name]
    seq = torch.as_tensor(seq_lens, dtype=torch.int64)
    bs, nodes = int(seq.shape[0]), 1 + TOPK * depth_steps
    parents = torch.tensor([[-1] + [TOPK * (d - 1) for d in range(1, depth_steps)]] * bs)
    selected = torch.arange(nodes - 1).repeat(bs, 1)
    mask = torch.zeros(int(seq.sum()) * nodes + nodes * nodes * bs, dtype=torch.bool)
    positions = torch.empty(bs * nodes, dtype=torch.int64)
    index, next_token, next_sibling = torch.full((3, bs, nodes), -1, dtype=torch.int64)
    kernel[(bs,)](
        parents, selected, seq, torch.cumsum(seq, 0) - seq, mask, positions, index, next_token,
        next_sibling, topk=TOPK, depth=depth_steps, draft_token_num=nodes, tree_mask_mode=0,
        batch_size=bs, parent_list_stride=parents.stride(0),
        selected_index_stride=selected.stride(0),
    )  # fmt: skip
    return positions.view(bs, nodes).numpy(), next_token.numpy(), next_sibling.numpy()


@functools.cache
def _accept_mover():
    """SGLang's ``move_accept_tokens_to_target_kvcache`` (``speculative/spec_utils.py``) with
    the launchers and Triton kernels it calls (of ``kernels/ops/speculative/cache_locs.py`` and
    ``eagle.py``: ``fill_front_out_cache_loc_func`` and ``fill_accept_out_cache_loc_func`` on
    0.5.23, ``assign_extend_cache_locs`` and ``fill_accept_out_cache_loc`` before), executed
    from the installed release's source and interpreted (the kernels, not their CPU builds:
    ``_is_cpu`` False); its out-of-bounds probe (a debug check) does nothing."""
    move = _speculative_code({
        f"{_OPS}/cache_locs.py": ("fill_front_out_cache_loc_func", "assign_extend_cache_locs"),
        f"{_OPS}/eagle.py": ("fill_accept_out_cache_loc_func", "fill_accept_out_cache_loc"),
        "srt/speculative/spec_utils.py": ("move_accept_tokens_to_target_kvcache",),
    })["move_accept_tokens_to_target_kvcache"]  # fmt: skip

    def moves(forward: Forward, accept_index) -> list[tuple[int, int]]:
        """The ``(source, target)`` slots SGLang's move hands the pool's ``move_kv_cache``
        after the tree verify ``forward`` (its ``out_cache_loc``: its rows' windows, one after
        the other; its plan's rows, prefixes and page table), for ``accept_index``
        (``[rows, depths]``: each row's accepted nodes, global indices, -1 past them)."""
        moved: list = []
        pool = types.SimpleNamespace(move_kv_cache=lambda tgt, src: moved.extend(
            zip(src.tolist(), tgt.tolist(), strict=True)))  # fmt: skip
        allocator = types.SimpleNamespace(get_kvcache=lambda: pool)
        accept = torch.as_tensor(accept_index, dtype=torch.int64)
        plan = forward.plan
        batch = types.SimpleNamespace(
            seq_lens=torch.as_tensor(plan["prefix_lens"], dtype=torch.int64),
            req_pool_indices=torch.as_tensor(plan["req_pool_indices"], dtype=torch.int64),
            req_to_token_pool=types.SimpleNamespace(
                req_to_token=torch.as_tensor(plan["req_to_token"], dtype=torch.int64)
            ),
            out_cache_loc=torch.as_tensor(forward.groups[0].out_cache_loc, dtype=torch.int64),
        )
        with _interpreted_language():
            move(batch, accept, (accept != -1).sum(1) - 1, allocator)
        return moved

    return moves


def sglang_draft_batch(seq_lens, rows, req_to_token, topk: int, num_steps: int) -> tuple:
    """EAGLE's draft decode batch for requests of committed lengths ``seq_lens`` in pool rows
    ``rows`` of ``req_to_token``: ``prepare_for_draft`` (``speculative/eagle_worker_common.py``)
    run from the installed release's source on pages of one slot, its slot launcher's Triton
    kernel (``assign_draft_cache_locs_contiguous``) interpreted, ``ForwardBatch.init_new`` a
    stand-in; the draft's ``positions`` and the batch's ``out_cache_loc``."""
    forward_mode = loading.runtime().ForwardMode
    prepare = _speculative_code(
        {
            f"{_OPS}/cache_locs.py": (
                "assign_draft_cache_locs_contiguous_func", "assign_draft_cache_locs_contiguous"),
            "srt/speculative/eagle_worker_common.py": ("prepare_for_draft",),
        },
        ForwardMode=forward_mode,
        CaptureHiddenMode=types.SimpleNamespace(NULL=0, LAST=1),  # kept, not read
        ForwardBatch=types.SimpleNamespace(init_new=lambda batch, runner, **k: batch),
    )["prepare_for_draft"]  # fmt: skip
    seq = torch.as_tensor(seq_lens, dtype=torch.int64)
    batch = types.SimpleNamespace(
        forward_mode=forward_mode.DECODE, seq_lens=seq, seq_lens_cpu=seq.clone(),
        req_pool_indices=torch.as_tensor(rows, dtype=torch.int64), device="cpu",
        token_to_kv_pool_allocator=types.SimpleNamespace(page_size=1),
        multimodal_inputs=[None] * int(seq.shape[0]),
    )  # fmt: skip
    runner = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model_is_mrope=False),
        spec_algorithm=types.SimpleNamespace(is_standalone=lambda: False),
    )
    draft = types.SimpleNamespace()
    pool = types.SimpleNamespace(req_to_token=torch.as_tensor(req_to_token, dtype=torch.int64))
    with _interpreted_language():
        prepare(draft, pool, batch, None, runner, topk, num_steps)
    return draft.positions, batch.out_cache_loc


def verify(engine: Engine, made, records: bool = False) -> list:
    """What a tree server runs for the engine's step ``made``: a target verify as
    :func:`as_tree` makes it, anything else as made."""
    if isinstance(made, Forward) and made.mode == TARGET_VERIFY and engine.lut is None:
        return as_tree(engine, made, records)
    return [made] if made is not None else []


def widen(batch, topk: int):
    """A draft decode step's batch (a ``ForwardBatch`` stand-in, one token a request) as EAGLE
    drafting a tree of ``topk`` gives it to the draft model's canary: each request's position,
    input id and slot ``topk`` times (``prepare_for_draft``'s positions, which
    :func:`sglang_draft_batch` runs), its requests as before. The branches' slots are not
    modelled (each repeats the chain's, where SGLang gives each branch its own): SGLang's plan
    input raises before any launch reads them ([29])."""
    wide = {}
    for name in ("positions", "input_ids", "out_cache_loc"):
        value = getattr(batch, name, None)
        if value is not None:
            wide[name] = value.repeat_interleave(topk)
    return dataclasses.replace(batch, **wide)
