"""SGLang kv_canary: the plan launcher's checks run on CUDA only.

    pip install torch triton sglang==X --no-deps
    python repro_12_plan_checks_cuda_only.py

A plan launch of two requests into a write plan that holds one is refused on CUDA ("bs=2
exceeds write_req_capacity=1"). From 0.5.21, on CPU and XPU, SGLang dispatches to its torch
reference before any of its kernel path's checks, and the reference runs the launch, writing
the seed of the first request only (as it also takes more than 4096 rows and strided tensors).

Prints SGLang's result beside the contract's (the KV-canary conformance suite's
docs/CONTRACT.md §12 P6) and exits 1 while the divergence is there, 0 once it is gone.
SGLang's kv_canary is loaded from the installed wheel on its own, without its serving stack;
its Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1) on CPU tensors.
"""

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
    kv = load_kv_canary()
    plan = plan_modules(kv)
    args = plan_call(kv, bs=2, write_capacity=1)
    want = "ValueError: kv-canary: bs=2 exceeds write_req_capacity=1"
    try:
        plan.api.launch_canary_plan_kernels(**args)
    except NoCudaHere:
        report(True, "the launch reached the CUDA entries kernel unrefused", want)
    except ValueError as error:
        report(False, f"ValueError: {error}", want)
    plan_out = args["write_plan_out"]
    report(
        True,
        f"the launch ran; write_seed_slot_indices = {plan_out.write_seed_slot_indices.tolist()}, "
        f"write_offsets = {plan_out.write_offsets.tolist()} (ending where the dropped row "
        f"starts), write_num_valid_reqs = {plan_out.write_num_valid_reqs.tolist()} (bs, above "
        "the capacity)",
        want,
    )


def plan_modules(kv):
    """SGLang's plan and scatter modules, their Triton kernels interpreted on CPU tensors."""
    os.environ["TRITON_INTERPRET"] = "1"  # read when Triton and SGLang's kernels are imported
    base = kv.verify.__name__.rpartition(".")[0]
    return types.SimpleNamespace(
        api=importlib.import_module(f"{base}.plan.api"),
        ref=importlib.import_module(f"{base}.plan_ref"),
        scatter=importlib.import_module(f"{base}.scatter_req_token_ids"),
    )


def plan_call(kv, *, bs=1, write_capacity=1, prefix=3, lut_len=None, pool=False, **changes):
    """A plan launch of ``bs`` requests (rows 1..bs of an 8-slot-per-row page table), each with
    ``prefix`` tokens written and one more now; ``changes`` replace arguments."""
    table = torch.arange(8 * (bs + 1), dtype=torch.int32).reshape(bs + 1, 8) + 1
    lut = None if lut_len is None else torch.arange(lut_len, dtype=torch.int64) + 100
    args = dict(
        verify_plan_out=kv.verify.VerifyPlan.allocate(verify_capacity=64, device="cpu"),
        write_plan_out=kv.write.WritePlan.allocate(write_req_capacity=write_capacity, device="cpu"),
        req_pool_indices=torch.arange(1, bs + 1, dtype=torch.int64),
        prefix_lens=torch.full((bs,), prefix, dtype=torch.int64),
        extend_seq_lens=torch.ones(bs, dtype=torch.int64),
        req_to_token=table,
        swa_window_size=0,
        full_to_swa_index_mapping=lut,
        verify_capacity=64,
        req_to_verify_expected_tokens=torch.zeros_like(table) if pool else None,
        req_to_verify_expected_tokens_valid_lens=torch.full((bs,), 8) if pool else None,
        kv_token_id_vs_position_offset=0,
    )
    args.update(changes)
    return args


def kernel_path(api):
    """SGLang's plan launcher as it runs on CUDA (its kernel path), on CPU tensors: from 0.5.21
    it sends CPU tensors to its torch reference, so that dispatch is turned off here."""
    if hasattr(api, "use_torch_reference"):
        api.use_torch_reference = lambda device: False
    return api.launch_canary_plan_kernels


if __name__ == "__main__":
    main()
