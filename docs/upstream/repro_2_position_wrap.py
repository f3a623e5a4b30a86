"""SGLang kv_canary: the write's position assert fails at INT64_MAX, then the launch raises half done.

    pip install torch sglang==X --no-deps
    python repro_2_position_wrap.py

A request seeded from a slot at position 2^63 - 1 writes its next token at position -2^63:
in int64 arithmetic that is prev_pos + 1, so the contract reports nothing. SGLang's reference
computes prev_pos + 1 with Python ints (2^63): the launch fails with "ValueError: Overflow
when unpacking long long" (in longer chains after a spurious WRITE_POSITION_MISMATCH row and
with the canary buffer already changed).

Prints SGLang's result beside the contract's (the KV-canary conformance suite's
docs/CONTRACT.md §6) and exits 1 while the divergence is there, 0 once it is gone.
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
    ctx = context(kv)
    canary = ctx.canary_buf.view(torch.int64)
    canary[1, :4] = torch.tensor([5, 2**63 - 1, 11, 0])  # slot 1: token 5 at INT64_MAX
    plan = kv.write.WritePlan.allocate(write_req_capacity=1, device="cpu")
    plan.write_offsets[:] = torch.tensor([0, 1])
    plan.write_seed_slot_indices[0] = 1
    plan.write_num_valid_reqs[0] = 1
    error = None
    try:
        launch(
            kv,
            "write",
            context=ctx,
            plan=plan,
            input_ids=torch.tensor([7]),
            positions=torch.tensor([-(2**63)]),
            out_cache_loc=torch.tensor([2]),
            enable_write_input_assert=False,
            expected_input_tokens=None,
            expected_input_positions=None,
        )
    except Exception as caught:  # noqa: BLE001 - what SGLang raises is the finding
        error = caught
    rows = int(ctx.violation_write_index[0])
    got = f"{rows} violation row(s)" + (f", then {type(error).__name__}: {error}" if error else "")
    report(rows != 0 or error is not None, got, "0 violation rows: -2^63 follows 2^63 - 1 in int64")


if __name__ == "__main__":
    main()
