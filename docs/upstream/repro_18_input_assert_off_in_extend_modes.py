"""SGLang kv_canary: the write's input assert cannot fire in an extend mode, so a swapped
sampled token that a MIXED batch or a TARGET_VERIFY writes goes unreported.

    pip install torch triton sglang==X --no-deps
    python repro_18_input_assert_off_in_extend_modes.py

SGLang's token oracle manager (srt/kv_canary/token_oracle/oracle_manager.py) fills the write's
expected input tokens from the token oracle only in DECODE (and IDLE): in every mode whose
ForwardMode.is_extend() holds (EXTEND, MIXED, TARGET_VERIFY) it copies input_ids themselves.
Mixed chunked prefill puts the decode rows, each writing its sampled token, in such a batch,
and EAGLE's target verify writes the sampled token as its first input: a token the sampler
swapped (the self-test's next_token_swap) is then its own expected input, and the verify's
token check reads the same swapped token from the expected-token pool. The canary cannot
report it there; in a DECODE batch it reports WRITE_TOKEN_MISMATCH.

Runs SGLang's TokenOracleManager.fill_expected_inputs and its ForwardMode (the enum's own
source, taken from forward_batch_info.py, whose module needs SGLang's serving stack) on a
two-request batch whose sampled tokens are swapped, and its write launcher (the torch
reference) on the result. Prints SGLang's result beside the contract's (the KV-canary
conformance suite's docs/CONTRACT.md §15: the write input assert is a check that must be able
to fire) and exits 1 while the divergence is there, 0 once it is gone.
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
    runtime = runtime_modules(kv)
    mode = runtime.ForwardMode
    oracle = runtime.oracle.HashOracle(vocab_size=50_000)
    rids = torch.tensor([11, 12], dtype=torch.int64)
    positions = torch.tensor([5, 7], dtype=torch.int64)  # each request's next position
    truth = oracle.expected_tokens(generalized_req_ids=rids, positions=positions).to(torch.int64)
    swapped = truth.flip(0)  # the sampler swapped the two requests' tokens
    reported = {}
    for name in ("DECODE", "MIXED", "TARGET_VERIFY"):
        batch = types.SimpleNamespace(
            forward_mode=getattr(mode, name),
            positions=positions,
            input_ids=swapped,
            rids_int=rids,
            bootstrap_room_ids_int=None,
            extend_seq_lens=torch.ones(2, dtype=torch.int64),
            spec_info=types.SimpleNamespace(draft_token_num=1, num_tokens_per_req=1),
        )
        expected = runtime.expected_inputs.ExpectedInputs.allocate(capacity=2, device="cpu")
        runtime.manager.TokenOracleManager(oracle=oracle).fill_expected_inputs(
            forward_batch=batch, expected_inputs_out=expected
        )
        reported[name] = write_reports(kv, swapped, positions, expected.tokens[:2])
    bug = any(reported[m] == 0 for m in ("MIXED", "TARGET_VERIFY")) and reported["DECODE"] == 2
    report(
        bug,
        "WRITE_TOKEN_MISMATCH rows for two swapped tokens: "
        + ", ".join(f"{m} {n}" for m, n in reported.items()),
        "the input assert reports both swapped tokens in every mode where it is on",
    )


def write_reports(kv, ids, positions, expected_tokens) -> int:
    """The rows a write of two one-token requests stores with the input assert on."""
    ctx = context(kv)
    plan = kv.write.WritePlan.allocate(write_req_capacity=2, device="cpu")
    plan.write_offsets.copy_(torch.tensor([0, 1, 2]))
    plan.write_seed_slot_indices.fill_(-1)
    plan.write_num_valid_reqs.fill_(2)
    launch(
        kv, "write", context=ctx, plan=plan, input_ids=ids, positions=positions,
        out_cache_loc=torch.tensor([1, 2], dtype=torch.int64), enable_write_input_assert=True,
        expected_input_tokens=expected_tokens.clone(), expected_input_positions=positions.clone(),
    )  # fmt: skip
    return int(ctx.violation_write_index.item())


def runtime_modules(kv):
    """SGLang's token oracle, its manager and ExpectedInputs (torch only), and ForwardMode
    executed from its own source in forward_batch_info.py."""
    import ast
    import enum
    import functools

    root = list(sys.modules["sglang"].__path__)[0]  # the loader made it a namespace
    srt = os.path.join(root, "srt")
    for name in ("sglang.srt", "sglang.srt.kv_canary", "sglang.srt.kv_canary.token_oracle"):
        package = types.ModuleType(name)
        package.__path__ = [os.path.join(root, *name.split(".")[1:])]
        sys.modules.setdefault(name, package)
    source = open(os.path.join(srt, "model_executor", "forward_batch_info.py")).read()
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ForwardMode")
    scope = {"IntEnum": enum.IntEnum, "auto": enum.auto, "total_ordering": functools.total_ordering}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "forward_batch_info.py", "exec"), scope)
    del kv  # loaded first, so that the namespace packages above join its own
    return types.SimpleNamespace(
        ForwardMode=scope["ForwardMode"],
        oracle=importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle"),
        manager=importlib.import_module("sglang.srt.kv_canary.token_oracle.oracle_manager"),
        expected_inputs=importlib.import_module("sglang.srt.kv_canary.expected_inputs"),
    )


if __name__ == "__main__":
    main()
