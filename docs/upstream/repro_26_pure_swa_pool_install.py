"""SGLang kv_canary: a model whose every attention layer slides, served on SGLang's SWA pool, cannot
start with the canary: install_canary's SWA attacher indexes the first layer of the pool's full
sub-pool, which has no layers, and raises IndexError.

    pip install torch sglang==X --no-deps
    python repro_26_pure_swa_pool_install.py

SGLang serves a model it calls hybrid SWA (srt/configs/model_config.py: is_hybrid_swa_model) on
SWAKVPool (srt/mem_cache/swa_memory_pool.py), whose full sub-pool has one layer per full
attention layer and whose SWA sub-pool one per sliding layer (get_hybrid_layer_ids). For an
architecture whose every layer slides (UnlimitedOCRForCausalLM from 0.5.15; the MTP draft
modules MiMoV2MTP and Step3p5MTP on every release), get_hybrid_layer_ids gives no full attention
layer, so the full sub-pool is an MHATokenToKVPool of zero layers, whose k_buffer is an empty
list (_create_buffers_normal makes one buffer a layer). install_canary attaches the canary with
attach_swa (kv_canary/pool_patcher/adapters/swa.py), which builds the full group first and reads
sub_pool.k_buffer[0].shape[0] for its slot count: IndexError, at server start. The KV-canary
conformance suite's support matrix (docs/SUPPORT.md) runs install_canary with SGLang's own
attachers on such a pool and shows the error.

Runs is_hybrid_swa_model and get_hybrid_layer_ids from the installed source (their module
imports SGLang's serving stack) on the first of those architectures SGLang calls hybrid with no
full layer, then attach_swa and _build_subpool_group from source on a pool of that shape (no
full layer, one sliding layer). Prints SGLang's result beside the contract's and exits 1 while
the divergence is there, 0 once it is gone.
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
    root = sglang_root()
    config_path = os.path.join(root, "srt", "configs", "model_config.py")
    scope = constants(config_path, ("MIMO_V2_MODEL_ARCHS", "SWA_SINK_ARCHS"))
    functions(config_path, ("is_hybrid_swa_model", "get_hybrid_layer_ids"), scope)
    chosen = None
    for arch in ("UnlimitedOCRForCausalLM", "MiMoV2MTP", "Step3p5MTP"):
        text_config = types.SimpleNamespace(num_hidden_layers=4)
        if scope["is_hybrid_swa_model"]([arch], text_config):
            swa, full = scope["get_hybrid_layer_ids"]([arch], text_config)
            if swa and not full:
                chosen = (arch, swa)
                break
    if chosen is None:
        report(
            False, "no architecture of the list is served on the SWA pool without full layers", "-"
        )
    arch, swa = chosen
    adapter = os.path.join(root, "srt", "kv_canary", "pool_patcher", "adapters", "swa.py")
    made = {
        "alloc_canary_buf": lambda num_slots, device: torch.zeros(num_slots, 32, dtype=torch.uint8),
        "make_row_source": lambda layer_buffer, read_bytes: (),
        "CanaryBufferGroup": lambda **fields: types.SimpleNamespace(**fields),
        "PoolKind": types.SimpleNamespace(FULL="FULL", SWA="SWA"),
        "patch_buf_info_method": lambda pool, **kwargs: None,
        "Optional": None,
        "torch": torch,
    }
    functions(adapter, ("attach_swa", "_build_subpool_group"), made)
    layer = torch.zeros(9, 16, dtype=torch.uint8)
    pool = types.SimpleNamespace(
        full_kv_pool=types.SimpleNamespace(k_buffer=[], v_buffer=[]),  # no full layer
        swa_kv_pool=types.SimpleNamespace(k_buffer=[layer], v_buffer=[layer.clone()]),
        full_to_swa_index_mapping=torch.zeros(9, dtype=torch.int64), page_size=1,
    )  # fmt: skip
    try:
        groups = made["attach_swa"](pool=pool, device=torch.device("cpu"), read_bytes=0,
                                    kv_token_id_vs_position_offset=0)  # fmt: skip
        outcome, bug = f"attach_swa attaches {len(groups)} group(s)", False
    except IndexError as error:
        outcome, bug = f"attach_swa raises IndexError: {error}", True
    report(
        bug,
        f"{arch}: sliding layers {swa}, full attention layers none; on its SWAKVPool, " + outcome,
        "the canary installs on the pool's SWA part, or refuses with a kv-canary: message",
    )


def constants(path: str, names: tuple) -> dict:
    """The module-level assignments ``names`` of SGLang's file ``path``, executed."""
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") in names for t in n.targets)]  # fmt: skip
    scope: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)
    return scope


def functions(path: str, names: tuple, scope: dict) -> None:
    """The top-level functions ``names`` of SGLang's file ``path``, executed from its source in
    ``scope`` (annotations unevaluated)."""
    tree = ast.parse(open(path).read())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec", flags=flags), scope)


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


if __name__ == "__main__":
    main()
