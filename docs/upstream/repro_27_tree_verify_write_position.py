"""SGLang kv_canary: with EAGLE drafting a tree (topk > 1), every target verify writes sibling drafts
at one position, and the canary's chain position assert reports WRITE_POSITION on a correct
server.

    pip install torch sglang==X --no-deps
    python repro_27_tree_verify_write_position.py

EAGLE's tree verify (srt/speculative/eagle_utils.py: build_tree_kernel_efficient, a CUDA
kernel, read) gives each draft node the position of its depth: "if depth of each draft token
is [0, 1, 1, 2] and the prompt length is 7, then positions = [7, 8, 8, 9]"; siblings share a
position. The target verify's out_cache_loc runs over [seq_len, seq_len + draft_token_num) of
the request's row. The canary plans the verify's writes from seq_lens and the draft count
(kv_canary/plan_input.py, TARGET_VERIFY) and its write launcher takes the batch's positions; with
the chain position assert on, each
write's position must be its previous record's plus one, the first of a row chained to the
record of position seq_len - 1. A sibling written after its brother, or a node after a deeper
one, breaks that: WRITE_POSITION_MISMATCH rows on every tree verify, no fault anywhere. The
KV-canary conformance suite's support matrix (docs/SUPPORT.md, its EAGLE tree row) runs the
target model's correct history with such verifies through SGLang's per-forward runtime.

Reads those facts from the installed source, then writes a request's prompt (positions 0, 1, 2)
with SGLang's write launcher, and after it a tree verify of four nodes at depths [0, 1, 1, 2]
(positions 3, 4, 4, 5) and, for contrast, a chain of four (positions 3, 4, 5, 6). Prints
SGLang's result beside the contract's and exits 1 while the divergence is there, 0 once it is
gone.
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
    root = sglang_root()
    utils = read(root, "srt/speculative/eagle_utils.py")
    plan_input = read(root, "srt/kv_canary/plan_input.py")
    depth_positions = "build_tree_kernel_efficient" in utils and "positions = [7, 8, 8, 9]" in utils
    verify = plan_input[plan_input.find("is_target_verify()") :][:900]
    planned = "seq_lens" in verify and "draft_token_num" in verify
    kv = load_kv_canary()
    rows = {}
    for name, tail in (("tree", [3, 4, 4, 5]), ("chain", [3, 4, 5, 6])):
        ctx = context(kv)
        for positions, slots, seed in (([0, 1, 2], [1, 2, 3], -1), (tail, [4, 5, 6, 7], 3)):
            plan = kv.write.WritePlan.allocate(write_req_capacity=1, device="cpu")
            plan.write_offsets[:] = torch.tensor([0, len(slots)])
            plan.write_seed_slot_indices[0] = seed
            plan.write_num_valid_reqs[0] = 1
            launch(kv, "write", context=ctx, plan=plan,
                   input_ids=torch.tensor([11 + p for p in positions]),
                   positions=torch.tensor(positions), out_cache_loc=torch.tensor(slots),
                   enable_write_input_assert=False, expected_input_tokens=None,
                   expected_input_positions=None)  # fmt: skip
        rows[name] = int(ctx.violation_write_index[0])
    report(
        depth_positions and planned and rows["tree"] > 0 and rows["chain"] == 0,
        f"a tree verify's positions are its nodes' depths: "
        f"{'yes' if depth_positions else 'not found'}; its writes planned from seq_lens and "
        f"the draft count: {'yes' if planned else 'not found'}; the write of nodes at "
        f"positions 3, 4, 4, 5: {rows['tree']} violation row(s) (a chain at 3, 4, 5, 6: "
        f"{rows['chain']})",
        "a correct tree verify reports nothing",
    )


def read(root: str, relative: str) -> str:
    path = os.path.join(root, *relative.split("/"))
    return open(path).read() if os.path.isfile(path) else ""


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


if __name__ == "__main__":
    main()
