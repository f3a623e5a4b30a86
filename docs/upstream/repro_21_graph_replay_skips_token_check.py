"""SGLang kv_canary: a forward that replays a CUDA graph never checks a verified slot's token.

    pip install torch triton sglang==X --no-deps
    python repro_21_graph_replay_skips_token_check.py

With SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT, a forward's ForwardBatch carries
req_all_ids_lens (each request's known tokens, forward_batch_info.py), and PlanInput
(srt/kv_canary/plan_input.py) copies them into the plan's expected-token valid lengths, under
`if req_all_ids_lens is not None`; the plan gathers an expected token only below them
(-1, "skip the token check", elsewhere). SingleForwardManager.pre_ops_maybe_inside_graph
allocates its PlanInput and fills it inside the forward, so a decode that replays a CUDA graph
runs what the capture recorded. The capture batch is the decode graph runner's own
(model_executor/runner/decode_cuda_graph_runner.py, cuda_graph_runner.py before 0.5.17: its
ForwardBatch(...) in capture_prepare), which does not pass req_all_ids_lens: the branch is not
taken at capture, the copy is not recorded, and every replay plans valid lengths 0, so no
verify entry of a replayed decode has an expected token. The token check is off in every
decode that runs as a graph (the default), the forward mode most verifies happen in. Under
speculative decoding the same runner captures TARGET_VERIFY instead, through the same call (its
spec_info from get_spec_info, whose draft_token_num PlanInput reads): a target verify that
replays a graph checks no token either. So do EAGLE's draft model's two graph runners
(speculative/eagle_draft_cuda_graph_runner.py, its multi-step draft decode, and
eagle_draft_extend_cuda_graph_runner.py, its DRAFT_EXTEND_V2): neither capture call passes
req_all_ids_lens.

Reads the runner's capture call from the installed source, builds its batch (its fields the
canary reads, the others None as ForwardBatch's defaults), and runs SGLang's PlanInput on it as
a graph runs it: captured once under a recorder of torch's operations (a CUDA graph records
the same operations), then replayed after the live batch's rows were copied into the static
buffers. Then SGLang's plan (its torch reference) over a two-request decode, and a two-request
target verify of two tokens a row, whose expected tokens the pool holds: planned from the live
batch, every verify entry has its token; planned from the replayed PlanInput, none has (a
release whose PlanInput or capture call has no target verify runs the decode alone). Prints SGLang's result
beside the contract's and exits 1 while the divergence is there, 0 once it is gone.
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
    """The capture batch's PlanInput, replayed, against the live batch's, and their plans: in a
    decode, and in a target verify (a speculative server's runner captures TARGET_VERIFY in
    place of DECODE, through the same ForwardBatch(...) call)."""
    kv = load_kv_canary()
    runtime = runtime_modules(kv)
    passed = capture_keywords(runtime.root)
    decode = replay_case(kv, runtime, passed, "DECODE", tokens_per_row=1)
    verify = replay_case(kv, runtime, passed, "TARGET_VERIFY", tokens_per_row=2)
    bug = "req_all_ids_lens" not in passed and all(
        case is None or not any(t != -1 for t in case[2]) for case in (decode, verify)
    )
    cases = [("decode", decode), ("target verify", verify)]
    # EAGLE's draft model: its multi-step draft decode graph runner, and its draft extend's
    for what, runner, mode_attr, mode, width in DRAFT_RUNNERS:
        draft_passed = draft_keywords(runtime.root, runner, mode_attr)
        if draft_passed is None:
            continue
        draft = replay_case(kv, runtime, draft_passed, mode, tokens_per_row=width)
        kept = "passes" if "req_all_ids_lens" in draft_passed else "does not pass"
        cases.append((f"{what} (its runner {kept} req_all_ids_lens)", draft))
    lines = [
        f"{mode}: a replay plans valid lengths {case[0]} and expected tokens {case[2]} "
        f"(the live batch: {case[1]})"
        for mode, case in cases
        if case is not None
    ]
    report(
        bug,
        f"the capture batch passes {sorted(passed & set(FIELDS))}; " + "; ".join(lines),
        "every verify entry of a replayed forward checks its token: "
        + "; ".join(f"{case[1]}" for _, case in cases if case is not None),
    )


#: The capture batch's fields PlanInput reads (those the runner's call does not pass are None).
FIELDS = (
    "forward_mode", "spec_info", "extend_prefix_lens", "extend_seq_lens", "req_pool_indices",
    "positions", "seq_lens", "req_all_ids_lens",
)  # fmt: skip


def replay_case(kv, runtime, passed, mode, tokens_per_row):
    """PlanInput captured on the runner's capture batch in ``mode`` (``tokens_per_row``: 1, or
    a target verify's draft count, ``spec_info.draft_token_num`` as get_spec_info passes it),
    replayed after the live batch's rows were copied into the static buffers; ``(replayed valid
    lengths, expected tokens planned from the live batch, from the replay)``, or None where
    this release's PlanInput has no such mode."""
    bs = 2
    static = dict(
        req_pool_indices=torch.zeros(bs, dtype=torch.int64),
        positions=torch.zeros(bs * tokens_per_row, dtype=torch.int64),
        seq_lens=torch.ones(bs, dtype=torch.int64),  # seq_len_fill_value
        req_all_ids_lens=torch.zeros(bs, dtype=torch.int64),  # were the runner to keep one
    )
    spec = (
        None
        if mode == "DECODE"
        else types.SimpleNamespace(
            draft_token_num=tokens_per_row, num_tokens_per_req=tokens_per_row
        )
    )
    # a draft extend graph's static extend lengths: the captured width a row
    extend = torch.full((bs,), tokens_per_row, dtype=torch.int64)
    fields = dict(
        forward_mode=runtime.ForwardMode[mode], spec_info=spec, extend_prefix_lens=None,
        extend_seq_lens=extend if mode == "DRAFT_EXTEND_V2" else None, **static,
    )  # fmt: skip
    capture_batch = types.SimpleNamespace(
        **{k: (v if k in passed else None) for k, v in fields.items()}
    )
    plan_input = runtime.plan_input.PlanInput.allocate(bs_capacity=bs, device="cpu")
    try:
        graph = record(lambda: plan_input.fill_from_forward_batch(forward_batch=capture_batch))
    except (NotImplementedError, AttributeError):  # no such mode, or no spec_info passed
        return None
    # the live batch: requests on pool rows 1 and 2, 3 and 5 positions written before it, 4 and
    # 6 tokens known; a decode writes position 3 and 5, a target verify two from each on
    # (a draft extend's seq_lens count its own tokens too: 3 + 2 and 5 + 2)
    seq_lens = {"DECODE": [4, 6], "TARGET_VERIFY": [3, 5], "DRAFT_EXTEND_V2": [5, 7]}[mode]
    live = dict(
        req_pool_indices=torch.tensor([1, 2]),
        positions=torch.tensor([3, 5] if mode == "DECODE" else [3, 4, 5, 6]),
        seq_lens=torch.tensor(seq_lens),
        req_all_ids_lens=torch.tensor([4, 6]),
    )
    for name, value in live.items():
        static[name].copy_(value)
    for op in graph:
        op()
    eager = runtime.plan_input.PlanInput.allocate(bs_capacity=bs, device="cpu")
    eager.fill_from_forward_batch(forward_batch=types.SimpleNamespace(**{**fields, **live}))
    return (
        plan_input.req_to_verify_expected_tokens_valid_lens.tolist(),
        expected_tokens(kv, eager),
        expected_tokens(kv, plan_input),
    )


def capture_keywords(root):
    """The fields the decode graph runner's capture ForwardBatch(...) call passes."""
    import ast

    base = os.path.join(root, "srt", "model_executor")
    for name in ("runner/decode_cuda_graph_runner.py", "cuda_graph_runner.py"):
        path = os.path.join(base, name)
        if not os.path.isfile(path):
            continue
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ForwardBatch":
                mode = next((k.value for k in node.keywords if k.arg == "forward_mode"), None)
                if getattr(mode, "attr", None) == "capture_forward_mode":
                    return {k.arg for k in node.keywords if k.arg}
    sys.exit("this sglang has no decode graph runner that builds a capture ForwardBatch")


#: EAGLE's draft model's graph runners: what each captures, its file below srt/speculative/, the
#: attribute its capture ForwardBatch(...) passes as forward_mode, the mode, and a row's tokens.
DRAFT_RUNNERS = (
    ("draft decode", "eagle_draft_cuda_graph_runner.py", "DECODE", "DECODE", 1),
    ("draft extend", "eagle_draft_extend_cuda_graph_runner.py", "forward_mode", "DRAFT_EXTEND_V2", 2),
)  # fmt: skip


def draft_keywords(root, runner, mode_attr):
    """The fields one of EAGLE's draft graph runners passes to its capture ForwardBatch(...)
    (None where a release has no such runner, or none whose call passes that forward_mode)."""
    import ast

    path = os.path.join(root, "srt", "speculative", runner)
    if not os.path.isfile(path):
        return None
    text = open(path).read()
    if mode_attr == "forward_mode" and "DRAFT_EXTEND_V2" not in text:
        return None
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ForwardBatch":
            mode = next((k.value for k in node.keywords if k.arg == "forward_mode"), None)
            if getattr(mode, "attr", None) == mode_attr:
                return {k.arg for k in node.keywords if k.arg}
    return None


def record(fn):
    """The torch operations ``fn`` makes (a CUDA graph's capture records the same), each as a
    call that reruns it over the same tensors, its result written into the tensor it made at
    capture (a graph's own memory, which the later operations read); ``fn`` itself runs once,
    as SGLang's warm-up."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = []

    def again(func, args, kwargs, made):
        out = func(*args, **kwargs)
        if isinstance(made, torch.Tensor) and isinstance(out, torch.Tensor) and out is not made:
            made.copy_(out)

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
            kwargs = kwargs or {}
            result = func(*args, **kwargs)
            ops.append(lambda: again(func, args, kwargs, result))
            return result

    with Recorder():
        fn()
    return ops


def expected_tokens(kv, plan_input):
    """SGLang's plan (its torch reference) of a decode from ``plan_input``: the expected token
    of each verify entry (-1: not checked), the pool holding every request's tokens."""
    ref = importlib.import_module(kv.verify.__name__.rpartition(".")[0] + ".plan_ref")
    table = torch.arange(24, dtype=torch.int32).reshape(3, 8) + 1
    pool = torch.arange(24, dtype=torch.int32).reshape(3, 8) + 1000
    verify = kv.verify.VerifyPlan.allocate(verify_capacity=16, device="cpu")
    ref.launch_canary_plan_kernels_torch_reference(
        verify_plan_out=verify,
        write_plan_out=kv.write.WritePlan.allocate(write_req_capacity=2, device="cpu"),
        req_pool_indices=plan_input.req_pool_indices,
        prefix_lens=plan_input.prefix_lens,
        extend_seq_lens=plan_input.extend_seq_lens,
        req_to_token=table,
        swa_window_size=0,
        full_to_swa_index_mapping=None,
        verify_capacity=16,
        req_to_verify_expected_tokens=pool,
        req_to_verify_expected_tokens_valid_lens=plan_input.req_to_verify_expected_tokens_valid_lens,
        kv_token_id_vs_position_offset=0,
    )
    return verify.verify_expected_tokens[: int(verify.verify_num_valid[0])].tolist()


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
