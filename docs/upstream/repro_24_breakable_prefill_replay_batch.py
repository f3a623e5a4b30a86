"""SGLang kv_canary: with breakable prefill CUDA graphs, the canary runs every prefill on the prefill
graph runner's replay batch, which carries no rids_int and no req_all_ids_lens: with the token
oracle on, the first prefill that replays a graph raises, and without it no prefill checks a
token.

    pip install torch sglang==X --no-deps
    python repro_24_breakable_prefill_replay_batch.py

install_canary (srt/kv_canary/api.py) refuses piecewise prefill graphs and names
--cuda-graph-backend-prefill=breakable as the setting to use with the canary. Under it the
prefill graph runner (srt/model_executor/runner/prefill_cuda_graph_runner.py) captures only the
transformer body (_run_forward calls self.layer_model.forward, which _patch_model_forward does not
wrap), and at each replay (_execute_body_capture; execute before 0.5.16) it swaps
layer_model.forward for the graph's replay and calls the wrapped outer model.forward eagerly on
the batch load_batch builds (tail_batch, static_forward_batch, for the breakable backend): the ForwardBatch(...) that
load_batch builds, its token axis padded to the captured bucket. That call passes neither rids_int
nor bootstrap_room_ids_int nor req_all_ids_lens. So SingleForwardManager.pre_ops_maybe_inside_graph
runs on a batch without them: TokenOracleManager.fill_expected_inputs (the write's input assert,
with the token oracle on) expands rids_int per token and raises TypeError on None, and
PlanInput.fill_from_forward_batch leaves the expected-token valid lengths 0, so the plan checks no
token. The KV-canary conformance suite's support matrix (docs/SUPPORT.md, its breakable prefill
row) runs a correct history this way through SGLang's per-forward runtime.

Reads those four facts from the installed source, then runs SGLang's TokenOracleManager and
PlanInput on a two-request prefill (3 and 2 tokens, padded to 8) as load_batch builds it, and on
the live batch. Prints SGLang's result beside the contract's and exits 1 while the divergence is
there, 0 once it is gone.
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
    """The source facts, then SGLang's oracle manager and PlanInput on the replay batch and on
    the live batch."""
    kv = load_kv_canary()
    runtime = runtime_modules(kv)
    facts = source_facts(runtime.root)
    if facts is None:
        report(False, "this release has no breakable prefill replay of the outer forward", "")
        return
    passed, body_only, outer_at_replay, wraps_outer = facts
    live, replay = batches(runtime, passed)
    oracle = importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle_manager")
    expected = importlib.import_module("sglang.srt.kv_canary.expected_inputs")
    outcomes = []
    for batch in (live, replay):
        manager = oracle.TokenOracleManager(oracle=types.SimpleNamespace())
        out = expected.ExpectedInputs.allocate(capacity=16, device=torch.device("cpu"))
        try:
            manager.fill_expected_inputs(forward_batch=batch, expected_inputs_out=out)
            raised = None
        except (TypeError, RuntimeError) as error:
            raised = f"{type(error).__name__}: {str(error).splitlines()[0]}"
        plan_input = runtime.plan_input.PlanInput.allocate(bs_capacity=2, device="cpu")
        plan_input.fill_from_forward_batch(forward_batch=batch)
        lens = plan_input.req_to_verify_expected_tokens_valid_lens.tolist()
        outcomes.append((raised, lens))
    missing = sorted({"rids_int", "req_all_ids_lens"} - passed)
    bug = (
        bool(missing)
        and body_only
        and outer_at_replay
        and wraps_outer
        and (outcomes[1][0] is not None or not any(outcomes[1][1]))
    )
    report(
        bug,
        f"load_batch's ForwardBatch(...) lacks {missing}; the body alone captured: {body_only}; "
        f"the wrapped model.forward run at replay: {outer_at_replay and wraps_outer}; on the "
        f"replay batch the oracle manager {outcomes[1][0] or 'runs'} and the plan's valid "
        f"lengths are {outcomes[1][1]}",
        f"as on the live batch: the oracle manager {outcomes[0][0] or 'runs'}, valid lengths "
        f"{outcomes[0][1]}",
    )


def source_facts(root):
    """What the installed source says: the fields load_batch's ForwardBatch(...) passes, whether
    _run_forward calls self.layer_model.forward, whether a replay swaps layer_model.forward for
    the graph and calls self.model_runner.model.forward, and whether install_canary wraps
    model.forward (None where the release has no prefill graph runner of this shape)."""
    import ast

    path = os.path.join(root, "srt", "model_executor", "runner", "prefill_cuda_graph_runner.py")
    if not os.path.isfile(path):
        return None
    functions = [
        n for n in ast.walk(ast.parse(open(path).read())) if isinstance(n, ast.FunctionDef)
    ]
    named = {n.name: n for n in functions}
    if not {"load_batch", "_run_forward"} <= named.keys():
        return None
    calls = [
        n for n in ast.walk(named["load_batch"])
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ForwardBatch"
    ]  # fmt: skip
    passed = {k.arg for k in calls[0].keywords if k.arg} if calls else set()
    body_only = "self.layer_model.forward(" in ast.unparse(named["_run_forward"])
    at_replay = any(
        "self.layer_model.forward = " in text and "self.model_runner.model.forward(" in text
        for text in (ast.unparse(f) for f in functions if f.name != "_run_forward")
    )
    api = open(os.path.join(root, "srt", "kv_canary", "api.py")).read()
    wraps_outer = 'wrap_method(model_runner.model, "forward"' in api.replace("'", '"')
    return passed, body_only, at_replay, wraps_outer


def batches(runtime, passed):
    """A two-request prefill of 3 and 2 tokens (pool rows 1 and 2, requests 11 and 12, nothing
    cached), as the scheduler's ForwardBatch has it and as load_batch's, padded to 8 tokens (the
    registry pads positions and out_cache_loc with 0 and leaves input_ids as they were)."""
    live = dict(
        forward_mode=runtime.ForwardMode.EXTEND, batch_size=2, spec_info=None,
        input_ids=torch.tensor([101, 102, 103, 201, 202]),
        positions=torch.tensor([0, 1, 2, 0, 1]), out_cache_loc=torch.tensor([5, 6, 7, 8, 9]),
        req_pool_indices=torch.tensor([1, 2]), seq_lens=torch.tensor([3, 2]),
        extend_prefix_lens=torch.tensor([0, 0]), extend_seq_lens=torch.tensor([3, 2]),
        rids_int=torch.tensor([11, 12]), bootstrap_room_ids_int=None,
        req_all_ids_lens=torch.tensor([3, 2]),
    )  # fmt: skip
    pad = torch.tensor([7, 7, 7])
    replay = {k: (v if k in passed else None) for k, v in live.items()}
    replay.update(
        input_ids=torch.cat([live["input_ids"], pad]),
        positions=torch.cat([live["positions"], torch.zeros(3, dtype=torch.int64)]),
        out_cache_loc=torch.cat([live["out_cache_loc"], torch.zeros(3, dtype=torch.int64)]),
    )
    return types.SimpleNamespace(**live), types.SimpleNamespace(**replay)


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
