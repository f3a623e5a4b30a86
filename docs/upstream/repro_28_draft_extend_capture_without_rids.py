"""SGLang kv_canary: up to 0.5.17, with the write's input assert on (the token_oracle sampling
backend), EAGLE's draft extend CUDA graph cannot be captured with the canary: its capture batch
has no rids_int, and the token oracle manager raises AttributeError on it.

    pip install torch sglang==X --no-deps
    python repro_28_draft_extend_capture_without_rids.py

Up to 0.5.17 every model runner, the draft model's too, gets the token oracle (from 0.5.18 a
draft worker gets none: [22]). EAGLE's draft extend graph runner
(srt/speculative/eagle_draft_extend_cuda_graph_runner.py) captures DRAFT_EXTEND_V2 over a
ForwardBatch(...) built for capture, which passes neither rids_int nor bootstrap_room_ids_int;
the draft model's canary runs inside that capture (with_active_single_forward_manager), and
with the input assert on, SingleForwardManager.pre_ops_maybe_inside_graph calls
TokenOracleManager.fill_expected_inputs, which expands the batch's request ids per token: on
None it raises, at the server's start. The KV-canary conformance suite's support matrix (its
EAGLE chain row, the draft model's history) shows it on those releases.

Reads the capture call's keywords from the installed source and whether ModelRunner gives a
draft worker the token oracle, then runs SGLang's TokenOracleManager.fill_expected_inputs on a
DRAFT_EXTEND_V2 batch of two rows of three tokens with those fields only. Prints SGLang's result
beside the contract's and exits 1 while the divergence is there, 0 once it is gone.
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
    kv = load_kv_canary()
    runtime = runtime_modules(kv)
    passed = capture_keywords(root)
    if passed is None:
        report(False, "this release has no draft extend graph runner of this shape", "-")
    gets, given = oracle_of(root, True)
    if given.startswith("(no ModelRunner.init_token_oracle"):
        gets, given = True, "a TokenOracleManager (installed in ModelRunner.__init__)"
    oracle = importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle_manager")
    expected = importlib.import_module("sglang.srt.kv_canary.expected_inputs")
    fields = dict(
        forward_mode=runtime.ForwardMode.DRAFT_EXTEND_V2, batch_size=2,
        input_ids=torch.tensor([101, 102, 103, 201, 202, 203]),
        positions=torch.tensor([4, 5, 6, 2, 3, 4]), req_pool_indices=torch.tensor([1, 2]),
        seq_lens=torch.tensor([7, 5]), extend_seq_lens=torch.tensor([3, 3]),
        rids_int=torch.tensor([11, 12]), bootstrap_room_ids_int=None,
        spec_info=types.SimpleNamespace(num_tokens_per_req=3, draft_token_num=3),
    )  # fmt: skip
    batch = types.SimpleNamespace(**{k: (v if k in passed else None) for k, v in fields.items()})
    manager = oracle.TokenOracleManager(oracle=types.SimpleNamespace(
        expected_tokens=lambda **kwargs: kwargs["positions"].to(torch.int32)))  # fmt: skip
    out = expected.ExpectedInputs.allocate(capacity=8, device=torch.device("cpu"))
    try:
        manager.fill_expected_inputs(forward_batch=batch, expected_inputs_out=out)
        raised = None
    except (AttributeError, TypeError) as error:
        raised = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    missing = sorted({"rids_int", "bootstrap_room_ids_int"} - passed)
    report(
        gets and len(missing) == 2 and raised is not None,
        f"the draft worker's runner gets {given}; the capture's ForwardBatch(...) lacks "
        f"{missing}; the oracle manager on a DRAFT_EXTEND_V2 batch without them: "
        f"{raised or 'runs'}",
        "the draft extend graph captures with the canary's input assert on",
    )


def capture_keywords(root):
    """The keywords of the ForwardBatch(...) call of the draft extend graph runner (None where
    the release has no such runner)."""
    path = os.path.join(root, "srt", "speculative", "eagle_draft_extend_cuda_graph_runner.py")
    if not os.path.isfile(path):
        return None
    calls = [
        n for n in ast.walk(ast.parse(open(path).read()))
        if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ForwardBatch"
    ]  # fmt: skip
    return {k.arg for k in calls[0].keywords if k.arg} if calls else None


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


def method(path: str, cls: str, name: str, scope: dict):
    """``cls.name`` of SGLang's file ``path``, executed from its source in ``scope`` (None where
    the release has no such method)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    item.decorator_list = []
                    module = ast.Module(body=[item], type_ignores=[])
                    flags = __future__.annotations.compiler_flag  # annotations unevaluated
                    exec(compile(module, path, "exec", flags=flags), scope)
                    return scope[name]
    return None


def oracle_of(root: str, is_draft_worker: bool):
    """What ModelRunner.init_token_oracle leaves a runner, with the token_oracle sampling
    backend on (install_token_oracle_from_env returns a manager)."""
    path = os.path.join(root, "srt", "model_executor", "model_runner.py")
    installed = object()
    scope = {"install_token_oracle_from_env": lambda **kwargs: installed}
    init = method(path, "ModelRunner", "init_token_oracle", scope)
    if init is None:  # releases up to 0.5.15 install it in ModelRunner.__init__
        return None, "(no ModelRunner.init_token_oracle in this release)"
    runner = types.SimpleNamespace(
        is_draft_worker=is_draft_worker,
        model_config=types.SimpleNamespace(vocab_size=32),
        server_args=types.SimpleNamespace(),  # what releases up to 0.5.17 pass on
    )
    init(runner)
    got = runner._token_oracle_manager
    return got is installed, "a TokenOracleManager" if got is installed else repr(got)


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
