"""SGLang kv_canary: a plan row outside the page table, or a prefix past its row, is not refused.

    pip install torch triton sglang==X --no-deps
    python repro_19_plan_rows_unchecked.py

The contract refuses, before any work, a request whose pool row is not a row of req_to_token
(P10) and a prefix longer than the row (P11). SGLang checks neither:

- its torch reference (the CPU path from 0.5.21) reads every row before it writes: a row past
  the table, or a prefix past the row, raises torch's own IndexError with both plans untouched;
  a row of -1 is not refused at all: negative indexing plans the table's last row;
- its Triton offsets kernel (the kernel path: CUDA, and every device before 0.5.21) reads a row
  of -1 from the memory before the table, and a row past the table from the memory after it,
  and seeds the write chain from whatever slot it finds there.

Here the page table is a slice of a larger tensor, so the kernel's reads land, harmlessly, in
its neighbours, where the seeds show them. Prints SGLang's result beside the contract's (the
KV-canary conformance suite's docs/CONTRACT.md §12 P10, P11) and exits 1 while the divergence
is there, 0 once it is gone. SGLang's kv_canary is loaded from the installed wheel on its own,
without its serving stack; its Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1)
on CPU tensors.
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
    # rows 0..3 of memory; the page table is rows 1 and 2, so row -1 of the table is memory
    # row 0 and row 2 of the table is memory row 3 (slots 100.. and 300..)
    memory = torch.zeros(4, 8, dtype=torch.int32)
    for r in range(4):
        memory[r] = torch.arange(8, dtype=torch.int32) + 100 * r
    table = memory[1:3]
    seen = []
    for label, rows, prefix in (
        ("row 2 of 2", [2], 3),
        ("row -1", [-1], 3),
        ("prefix 9 of 8", [1], 9),
    ):
        args = plan_call(kv, req_to_token=table, prefix=prefix, req_pool_indices=torch.tensor(rows))
        args["write_plan_out"].write_seed_slot_indices.fill_(-7)
        try:
            plan.ref.launch_canary_plan_kernels_torch_reference(**args)
            seeds = args["write_plan_out"].write_seed_slot_indices.tolist()
            seen.append(f"{label}: the torch reference planned, seeds {seeds}")
        except IndexError as error:
            seeds = args["write_plan_out"].write_seed_slot_indices.tolist()
            seen.append(f"{label}: the torch reference raised IndexError ({error}), seeds {seeds}")
        args = plan_call(kv, req_to_token=table, prefix=prefix, req_pool_indices=torch.tensor(rows))
        try:
            kernel_path(plan.api)(**args)
        except NoCudaHere:
            pass  # the offsets kernel ran; the CUDA entries kernel comes next
        except (IndexError, ValueError) as error:
            seen.append(f"{label}: the kernel path refused: {type(error).__name__}: {error}")
            continue
        seeds = args["write_plan_out"].write_seed_slot_indices.tolist()
        seen.append(f"{label}: the Triton offsets kernel seeds {seeds}")
    planned = [line for line in seen if "planned" in line or "seeds" in line and "kernel" in line]
    report(
        bool(planned),
        "; ".join(seen),
        "each launch refused before any work: IndexError naming req_pool_indices[0] (P10), "
        "ValueError naming prefix_lens[0] (P11)",
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
