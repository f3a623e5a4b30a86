"""SGLang kv_canary: a negative ring write index slices the ring from a negative start.

    pip install torch sglang==X --no-deps
    python repro_6_negative_ring_index.py

With violation_write_index = -1 and two violations, the contract stores nothing for index -1
(not in [0, ring_capacity)), the second violation's row at index 0, and counts the index on to
1. SGLang's torch reference assigns the rows to ring[-1:1], a slice from Python's last row:
an empty slice here, and the launch fails with a RuntimeError (with other counts the rows land
in the ring's last rows; its CUDA kernel writes before the ring instead).

Prints SGLang's result beside the contract's (the KV-canary conformance suite's
docs/CONTRACT.md §5 and §10) and exits 1 while the divergence is there, 0 once it is gone.
SGLang's kv_canary is loaded from the installed wheel on its own, without its serving stack.
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
    ctx = context(kv, write_index=-1)
    for slot in (1, 2):  # two chain heads stored at position 3
        ctx.canary_buf.view(torch.int64)[slot, :4] = torch.tensor([5, 3, 0, 0])
    plan = kv.verify.VerifyPlan.allocate(verify_capacity=2, device="cpu")
    plan.verify_slot_indices[:] = torch.tensor([1, 2])
    plan.verify_expected_tokens.fill_(-1)
    plan.verify_expected_positions.fill_(4)  # expected at 4: each slot is one violation row
    plan.verify_prev_slot_indices.fill_(-1)
    plan.verify_num_valid[0] = 2
    plan.enable[0] = 1
    try:
        launch(kv, "verify", context=ctx, plan=plan, check_verify_expected_token=False)
    except RuntimeError as error:
        got = f"RuntimeError: {error}"
    else:
        stored = [i for i in range(4) if bool(ctx.violation_ring[i].any())]
        got = f"rows stored at {stored}; write index {int(ctx.violation_write_index[0])}"
    want = "rows stored at [0]; write index 1"
    report(got != want, got, want)


if __name__ == "__main__":
    main()
