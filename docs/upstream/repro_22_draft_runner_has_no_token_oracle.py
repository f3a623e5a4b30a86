"""SGLang kv_canary: with the write's input assert on, EAGLE's draft model cannot run its canary:
the model runner gives a draft worker no token oracle, and the draft model's canary asks for one
at its first launch that is not a decode (a draft extend), and raises.

    pip install torch sglang==X --no-deps
    python repro_22_draft_runner_has_no_token_oracle.py

The input assert (SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT) compares each written token with
the token oracle's (the token_oracle sampling backend). ModelRunner.init_token_oracle
(srt/model_executor/model_runner.py) sets a draft worker's _token_oracle_manager to None ("the
oracle sampler is process-wide"), install_canary passes that to the draft model's
CanaryManager, and SingleForwardManager.pre_ops_maybe_inside_graph
(srt/kv_canary/single_forward_manager/manager.py) raises RuntimeError when the input assert is
on for a launch and it has no oracle manager; _should_enable_write_input_assert_for_launch
switches the assert off for the draft model's decodes only. EAGLE's worker
(srt/speculative/eagle_worker_v2.py, read, not run here) runs the draft model's canary around
its draft extends, the first one right after each prefill. Up to 0.5.17 every model runner,
the draft's too, installed the oracle. The KV-canary conformance suite's per-forward leg
(conformance/sglang_manager.py) shows the same RuntimeError on a draft model's history.

Runs SGLang's own code from its source (the modules import its serving stack):
ModelRunner.init_token_oracle on a draft and a target model runner, and SingleForwardManager's
_should_enable_write_input_assert_for_launch and pre_ops_maybe_inside_graph up to its oracle
check, on a draft model's manager as install_canary builds it (the allocations before that check
stand in as None). Prints what SGLang does beside what a canary that can serve would, and exits
1 while the divergence is there, 0 once it is gone.
"""

import __future__

import ast
import enum
import functools
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
    target_has, target_got = oracle_of(root, is_draft_worker=False)
    draft_has, draft_got = oracle_of(root, is_draft_worker=True)
    runners = f"the target model's runner gets {target_got}, the draft model's {draft_got}"
    if draft_has is None or draft_has:
        report(False, f"ModelRunner.init_token_oracle: {runners}", "a token oracle for the draft")
    assert_on, outcome = draft_extend_launch(root, forward_mode(root), None)
    report(
        bool(assert_on) and outcome.startswith("RuntimeError"),
        f"ModelRunner.init_token_oracle: {runners}; the draft model's canary, input assert on, "
        f"DRAFT_EXTEND_V2: input assert for the launch {assert_on}; {outcome}",
        "a draft extend with the input assert on runs, or the input assert is refused at "
        "install where EAGLE is on",
    )


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


def forward_mode(root: str):
    """SGLang's ForwardMode, executed from its own source in forward_batch_info.py."""
    path = os.path.join(root, "srt", "model_executor", "forward_batch_info.py")
    tree = ast.parse(open(path).read())
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    scope = {"IntEnum": enum.IntEnum, "auto": enum.auto, "total_ordering": functools.total_ordering}
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), scope)
    return scope["ForwardMode"]


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


class Noop:
    """The phase checker and the plan allocations the method makes before its oracle check."""

    def update(self, **kwargs):
        pass

    @staticmethod
    def allocate(**kwargs):
        return None


def draft_extend_launch(root: str, ForwardMode, oracle):
    """SingleForwardManager.pre_ops_maybe_inside_graph of the draft model's manager (input assert
    on, is_eagle_draft_decode, the oracle ``oracle``) on a DRAFT_EXTEND_V2 batch: what it
    raises, or None."""
    path = os.path.join(root, "srt", "kv_canary", "single_forward_manager", "manager.py")
    scope = {
        "VerifyPlan": Noop,
        "WritePlan": Noop,
        "ExpectedInputs": Noop,
        "PlanInput": Noop,
        "_SingleForwardPhase": types.SimpleNamespace(AFTER_PRE_OUT=1, AFTER_PRE_MAYBE_IN=2),
    }
    pre = method(path, "SingleForwardManager", "pre_ops_maybe_inside_graph", scope)
    should = method(
        path, "SingleForwardManager", "_should_enable_write_input_assert_for_launch", scope
    )
    if pre is None or should is None:
        return None, "no such methods"

    class Manager:  # the attributes the method reads before its oracle check
        _phase_checker = Noop()
        _verify_capacity = _write_req_capacity = _write_entry_capacity = 4
        _device = "cpu"
        _buffer_groups = ((),)
        _config = types.SimpleNamespace(enable_write_input_assert=True)
        _is_eagle_draft_decode = True
        _token_oracle_manager = oracle
        _should_enable_write_input_assert_for_launch = should

    batch = types.SimpleNamespace(forward_mode=ForwardMode.DRAFT_EXTEND_V2)
    assert_on = should(Manager(), batch)
    try:
        pre(Manager(), batch)
    except RuntimeError as error:
        return assert_on, f"RuntimeError: {error}"
    except Exception:  # past the oracle check: the stand-ins end the call, no refusal
        return assert_on, "no refusal"
    return assert_on, "no refusal"


if __name__ == "__main__":
    main()
