"""SGLang kv_canary: KV that SGLang moves without a forward (a PD decode server's retraction
backup, restored into new slots; HiCache's offload to the host pool and reload; an EAGLE tree's
accepted drafts moved to the front of their block) moves without the canary's records, so a
correct server's canary reports the moved slots.

    pip install torch sglang==X --no-deps
    python repro_23_kv_moves_leave_records_behind.py

install_canary attaches the canary's buffers beside the KV pool (pool_patcher/adapters/mha.py:
tensors of their own, allocated by alloc_canary_buf) and splices them into the pool's
get_contiguous_buf_infos, the list a PD transfer moves. The retraction backup of a PD decode
server (mem_cache/common.py, backup_kv_cache and restore_kv_cache with the cpu_tensor backend,
through Req.offload_kv_cache and load_kv_cache) copies MHATokenToKVPool.get_cpu_copy's layers
into the slots newly allocated to the resumed request (load_cpu_copy): the per-layer K and V
buffers alone. HiCache's host pool (mem_cache/pool_host/mha.py, read, not run here) copies the
device buffers of the pool's buffer info, _mha_buffers: the per-layer K and V buffers alone.
With EAGLE drafting a tree (topk > 1), _finalize_accept_tree_path
(speculative/eagle_worker_common.py, read) moves the accepted path's KV to the front of the
request's block through move_accept_tokens_to_target_kvcache and the pool's move_kv_cache, which
moves the per-layer K and V buffers alone (natively, or by the pointers of
_slot_move_pointer_buffers). The canary's records of the new slots stay whatever those slots
held, so the next verify of the moved positions (a decode's, or the cache sweep's) reports them
on a correct server. The KV-canary conformance suite's support matrix
(conformance/sglang/matrix.py) runs the first two paths on correct histories through SGLang's
per-forward runtime and shows the reports, and makes the third after each tree verify of its
EAGLE tree row.

Runs SGLang's own code: MHATokenToKVPool.get_cpu_copy, load_cpu_copy, _mha_buffers,
move_kv_cache (with the native move) and _slot_move_pointer_buffers from their source (the module imports SGLang's serving stack) on a pool of two layers, SGLang's write
launcher to write a request's records, and its verify launcher on the restored slots. Prints
what SGLang does beside what a canary that can serve would, and exits 1 while the divergence is
there, 0 once it is gone.
"""

import __future__

import ast
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import types

import torch


def load_kv_canary():
    """SGLang's kv_canary from the installed wheel (either layout), without its serving stack."""
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    root = list(spec.submodule_search_locations)[0]
    layouts = (
        ("kernels/ops/kv_canary", "kernels/jit"),
        ("jit_kernel/kv_canary", "jit_kernel"),
    )
    found = [
        (kv, jit) for kv, jit in layouts if os.path.isfile(os.path.join(root, kv, "verify.py"))
    ]
    if not found:
        sys.exit("this sglang has no kv_canary")
    kv, jit = found[0]
    names = set()
    for dotted in ("sglang." + kv.replace("/", "."), "sglang." + jit.replace("/", ".")):
        parts = dotted.split(".")
        names.update(".".join(parts[: i + 1]) for i in range(len(parts)))
    for name in sorted(names, key=lambda n: n.count(".")):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules[name] = package
    utils = types.ModuleType(f"sglang.{jit.replace('/', '.')}.utils")
    utils.cache_once = lambda fn: fn
    utils.load_jit = utils.make_cpp_args = no_cuda
    sys.modules[utils.__name__] = utils
    base = "sglang." + kv.replace("/", ".")
    return types.SimpleNamespace(
        **{
            m: importlib.import_module(f"{base}.{m}")
            for m in ("consts", "verify", "write", "verify_ref", "write_ref")
        }
    )


class NoCudaHere(RuntimeError):
    pass


def no_cuda(*args, **kwargs):
    raise NoCudaHere("the launch reached SGLang's CUDA JIT")


def launch(kv, kind, **kwargs):
    """SGLang's launcher; where it needs CUDA (no CPU path before 0.5.21), its torch reference."""
    launcher = getattr(getattr(kv, kind), f"launch_canary_{kind}_kernel")
    try:
        launcher(**kwargs)
    except NoCudaHere:
        getattr(kv, f"{kind}_ref").__dict__[f"launch_canary_{kind}_kernel_torch_reference"](
            **kwargs
        )


def context(kv, *, canary_buf=None, write_index=0, assert_positions=1, sources=()):
    """A context of 8 slots of 32 bytes, a ring of 4 rows, and ``sources`` (mode ALL)."""
    return kv.verify.VerifyOrWriteContext(
        canary_buf=torch.zeros(8, 32, dtype=torch.uint8) if canary_buf is None else canary_buf,
        kernel_kind=kv.verify.CanaryLaunchTag.HEAD_K_FULL,
        violation_ring=torch.zeros(4, 8, dtype=torch.int64),
        violation_write_index=torch.tensor([write_index], dtype=torch.int32),
        slot_run_counter=torch.zeros(1, dtype=torch.int64),
        kernel_run_counter=torch.zeros(1, dtype=torch.int64),
        real_kv_sources=tuple(sources),
        real_kv_hash_mode=kv.consts.RealKvHashMode.ALL
        if sources
        else kv.consts.RealKvHashMode.NONE,
        enable_chain_position_assert=torch.tensor([assert_positions], dtype=torch.int32),
    )


def verify_plan(kv, slot, position):
    """A verify plan of one chain head: ``slot`` expected at ``position``, token unchecked."""
    plan = kv.verify.VerifyPlan.allocate(verify_capacity=1, device="cpu")
    plan.verify_slot_indices[0] = slot
    plan.verify_expected_tokens[0] = -1
    plan.verify_expected_positions[0] = position
    plan.verify_prev_slot_indices[0] = -1
    plan.verify_num_valid[0] = 1
    plan.enable[0] = 1
    return plan


def report(bug: bool, sglang: str, contract: str) -> None:
    version = importlib.metadata.version("sglang")
    print(f"sglang {version}:  {sglang}")
    print(f"the contract:   {contract}")
    print("REPRODUCED" if bug else "not reproduced (fixed?)")
    sys.exit(1 if bug else 0)


def main():
    root = sglang_root()  # before the loader registers its bare packages
    kv = load_kv_canary()
    path = os.path.join(root, "srt", "mem_cache", "memory_pool.py")
    ctx = context(kv)
    src, dst = torch.tensor([1, 2, 3]), torch.tensor([5, 6, 7])
    # a request's records at slots 1, 2, 3 (positions 0, 1, 2), by SGLang's write launcher
    plan = kv.write.WritePlan.allocate(write_req_capacity=1, device="cpu")
    plan.write_offsets[:] = torch.tensor([0, 3])
    plan.write_seed_slot_indices[0] = -1
    plan.write_num_valid_reqs[0] = 1
    launch(kv, "write", context=ctx, plan=plan, input_ids=torch.tensor([11, 12, 13]),
           positions=torch.tensor([0, 1, 2]), out_cache_loc=src, enable_write_input_assert=False,
           expected_input_tokens=None, expected_input_positions=None)  # fmt: skip
    # their first position verified where it was written: silent
    launch(kv, "verify", context=ctx, plan=verify_plan(kv, int(src[0]), 0),
           check_verify_expected_token=False)  # fmt: skip
    silent = int(ctx.violation_write_index[0]) == 0
    pool = Pool(ctx.canary_buf)
    sync = types.SimpleNamespace(synchronize=lambda: None)
    scope = {"current_platform": sync}
    get_copy = method(path, "MHATokenToKVPool", "get_cpu_copy", scope)
    load_copy = method(path, "MHATokenToKVPool", "load_cpu_copy", scope)
    if get_copy is None or load_copy is None:
        report(False, "MHATokenToKVPool has no get_cpu_copy / load_cpu_copy", "-")
    before = ctx.canary_buf.clone()
    load_copy(pool, get_copy(pool, src), dst)  # the backup, restored into new slots
    kv_moved = all(torch.equal(b[dst], b[src]) for b in (*pool.k_buffer, *pool.v_buffer))
    records_moved = torch.equal(ctx.canary_buf[dst], before[src])
    hicache = hicache_buffers(path, pool)
    tree = tree_move(path, pool)
    # the same position verified at its new slot, as the resumed request's next decode does
    launch(kv, "verify", context=ctx, plan=verify_plan(kv, int(dst[0]), 0),
           check_verify_expected_token=False)  # fmt: skip
    rows = int(ctx.violation_write_index[0])
    report(
        silent and kv_moved and not records_moved and rows > 0,
        f"retraction backup restored into new slots: KV {'moved' if kv_moved else 'left'}, "
        f"records {'moved' if records_moved else 'left behind'}; the verify of the restored "
        f"position 0: {rows} violation row(s) (where it was written: "
        f"{'none' if silent else 'some'}); HiCache's host pool copies {hicache}; an EAGLE "
        f"tree's accepted path, moved by move_kv_cache: {tree}",
        "the records move with the KV (as the PD transfer's splice moves them): 0 rows",
    )


class Pool:
    """The fields of an MHATokenToKVPool that the copies read: two layers of K and V, 16 bytes a
    slot, each slot's bytes distinct; the canary buffer beside it, as install_canary leaves it."""

    def __init__(self, canary_buf):
        values = (torch.arange(2 * 8 * 16) % 251 + 1).to(torch.uint8).view(2, 8, 16)
        self.k_buffer = [values[0].clone(), values[1].clone()]
        self.v_buffer = [(values[0] ^ 0x5A).clone(), (values[1] ^ 0x5A).clone()]
        self.layer_num, self.page_size, self.use_hnd = 2, 1, False
        self.cpu_offloading_chunk_size = 2
        self.kv_cache_layout, self.k_data_ptrs, self.v_data_ptrs = "nhd", None, None
        self.canary_buf = canary_buf


def tree_move(path: str, pool) -> str:
    """MHATokenToKVPool.move_kv_cache, which EAGLE calls (move_accept_tokens_to_target_kvcache,
    speculative/spec_utils.py) to move a tree's accepted drafts to the front of their block: run
    with the native move (SGLANG_NATIVE_MOVE_KV_CACHE), and the buffers the default move copies
    by pointer (_slot_move_pointer_buffers, run); whether the canary buffer moves or is named."""
    native = types.SimpleNamespace(get=lambda: True)
    scope = {"maybe_detect_oob": lambda *a, **k: None,
             "envs": types.SimpleNamespace(SGLANG_NATIVE_MOVE_KV_CACHE=native)}  # fmt: skip
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if getattr(n, "name", "") == "move_kv_cache_native"]
    if not body:
        return "not run (this release has no move_kv_cache_native)"
    flags = __future__.annotations.compiler_flag  # annotations unevaluated
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec", flags=flags), scope)
    names = ("move_kv_cache", "_move_kv_cache_impl", "_move_native_fp4_scales",
             "_slot_move_pointer_buffers")  # fmt: skip
    found = {n: method(path, "MHATokenToKVPool", n, scope) for n in names}
    if found["move_kv_cache"] is None or found["_slot_move_pointer_buffers"] is None:
        return "not run (this release's MHATokenToKVPool has another shape)"
    for name, fn in found.items():
        if fn is not None:
            setattr(pool, name, types.MethodType(fn, pool))
    pool.use_native_move_kv_cache, pool.size = True, 8
    pool.k_scale_buffer = pool.native_k_scale_buffer = None
    src, dst = torch.tensor([4, 6]), torch.tensor([2, 3])
    before, kv_before = pool.canary_buf.clone(), pool.k_buffer[0][src].clone()
    pool.move_kv_cache(dst, src)
    moved = torch.equal(pool.k_buffer[0][dst], kv_before)
    records = torch.equal(pool.canary_buf[dst], before[src])
    named = any(b is pool.canary_buf for b in pool._slot_move_pointer_buffers())
    return (
        f"KV {'moved' if moved else 'left'}, records {'moved' if records else 'left behind'}, "
        f"the canary buffer {'among' if named else 'not among'} the default move's buffers"
    )


def hicache_buffers(path: str, pool) -> str:
    """What MHATokenToKVPool._mha_buffers names, the device buffers HiCache's host pool copies:
    the pool's K and V layers, and whether the canary buffer is among them."""
    scope = {"KVBuffers": lambda **fields: types.SimpleNamespace(**fields)}
    scope["KVBufferLayout"] = lambda layout: layout
    scope["KVBufferLayout"].NHD = "nhd"
    mha_buffers = method(path, "MHATokenToKVPool", "_mha_buffers", scope)
    if mha_buffers is None:
        return "(no _mha_buffers in this release)"
    named = mha_buffers(pool)
    ids = {id(t) for t in (*named.k, *named.v)}
    layers = all(id(t) in ids for t in (*pool.k_buffer, *pool.v_buffer))
    canary = id(pool.canary_buf) in ids
    return (f"{'the K and V layers' if layers else 'other buffers'}, "
            f"{'with' if canary else 'without'} the canary buffer")  # fmt: skip


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


def method(path: str, cls: str, name: str, scope: dict):
    """``cls.name`` of SGLang's file ``path``, executed from its source in ``scope``, its own
    ``from ... import`` statements taking their names from ``scope`` (None where the release
    has no such method)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    item.decorator_list = []
                    item.body = [s for s in item.body if not isinstance(s, ast.ImportFrom)]
                    module = ast.Module(body=[item], type_ignores=[])
                    flags = __future__.annotations.compiler_flag  # annotations unevaluated
                    exec(compile(module, path, "exec", flags=flags), scope)
                    return scope[name]
    return None


if __name__ == "__main__":
    main()
