"""SGLang kv_canary: with EAGLE drafting a tree (topk > 1), the draft model's canary cannot plan
a draft decode step: its plan input copies the batch's topk positions a request into a buffer of
one a request, and raises RuntimeError.

    pip install torch sglang==X --no-deps
    python repro_29_tree_draft_decode_plan_input.py

EAGLE's draft decode (srt/speculative/: prepare_for_draft, or on older releases the draft
input's prepare for decode) gives each request topk tokens a step: the ForwardBatch's positions
are seq_lens.repeat_interleave(topk),
its req_pool_indices one a request, its forward mode DECODE; the draft decode graph runner
captures the same shape (positions[:bs * captured_req_width], the width topk). The draft
model's canary runs in each step (with_active_single_forward_manager), and
PlanInput.fill_from_forward_batch, for a decode, copies the positions into prefix_lens[:bs]:
with topk > 1 the shapes differ and it raises, at the first draft decode step, or at the
server's start where the draft decode graph is captured. The KV-canary conformance suite's
support matrix (its EAGLE tree row, the draft model's cells) shows it.

Looks for that repeat in the installed source of srt/speculative, then runs SGLang's PlanInput on a DECODE
batch of two requests and two positions each, as topk 2 makes it, and on the chain's one
position each (topk 1). Prints SGLang's result beside the contract's and exits 1 while the
divergence is there, 0 once it is gone.
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
    kv = load_kv_canary()
    runtime = runtime_modules(kv)
    folder = os.path.join(root, "srt", "speculative")
    sources = [
        open(os.path.join(folder, f)).read() for f in os.listdir(folder) if f.endswith(".py")
    ]
    repeats = any("seq_lens.repeat_interleave(topk" in text for text in sources)
    plans = {}
    for topk in (1, 2):
        batch = types.SimpleNamespace(
            forward_mode=runtime.ForwardMode.DECODE, batch_size=2,
            req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([5, 7]),
            positions=torch.tensor([5, 7]).repeat_interleave(topk),
            input_ids=torch.arange(101, 101 + 2 * topk), req_all_ids_lens=None,
            spec_info=types.SimpleNamespace(num_tokens_per_req=topk),
        )  # fmt: skip
        plan = runtime.plan_input.PlanInput.allocate(bs_capacity=8, device=torch.device("cpu"))
        try:
            plan.fill_from_forward_batch(forward_batch=batch)
            plans[topk] = f"prefix_lens {plan.prefix_lens[:2].tolist()}"
        except RuntimeError as error:
            plans[topk] = f"RuntimeError: {str(error).splitlines()[0]}"
    report(
        repeats and plans[2].startswith("RuntimeError") and not plans[1].startswith("Runtime"),
        f"the draft decode repeats each request's position topk times: {repeats}; the plan "
        f"input of a draft decode step, topk 1: {plans[1]}; topk 2: {plans[2]}",
        "the draft model's canary plans each draft decode step of a tree",
    )


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


def runtime_modules(kv):
    """SGLang's PlanInput, and its ForwardMode run from the enum's own source in
    forward_batch_info.py (whose module needs SGLang's serving stack)."""
    import ast
    import enum
    import functools

    del kv  # loaded first: the packages registered below join its namespace
    root = list(sys.modules["sglang"].__path__)[0]
    srt = os.path.join(root, "srt")
    for name, folder in (("sglang.srt", srt), ("sglang.srt.kv_canary", srt + "/kv_canary")):
        if name not in sys.modules:
            sys.modules[name] = types.ModuleType(name)
            sys.modules[name].__path__ = [folder]
    path = os.path.join(srt, "model_executor", "forward_batch_info.py")
    with open(path) as f:
        body = [n for n in ast.parse(f.read()).body if getattr(n, "name", "") == "ForwardMode"]
    scope = dict(IntEnum=enum.IntEnum, auto=enum.auto, total_ordering=functools.total_ordering)
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), scope)
    plan_input = importlib.import_module("sglang.srt.kv_canary.plan_input")
    return types.SimpleNamespace(root=root, ForwardMode=scope["ForwardMode"], plan_input=plan_input)


if __name__ == "__main__":
    main()
