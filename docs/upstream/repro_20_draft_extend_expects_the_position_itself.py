"""SGLang kv_canary: in the draft model's DRAFT_EXTEND_V2, the write's input assert expects
the token oracle's token at each position itself, while the draft model's canary keys its
tokens one position on (the EAGLE offset): a correct batch is reported.

    pip install torch triton sglang==X --no-deps
    python repro_20_draft_extend_expects_the_position_itself.py

The draft model's canary has kv_token_id_vs_position_offset 1: its KV at position p holds the
token of position p + 1 (EAGLE's draft model reads each token with the hidden state of the
position before it), and SGLang's plan takes each expected token one position on. SGLang's
token oracle manager (srt/kv_canary/token_oracle/oracle_manager.py) fills the write's expected
input tokens of a DRAFT_EXTEND_V2 forward (which ForwardMode.is_extend() leaves out, so the
input assert stays on there: single_forward_manager/manager.py switches it off only in the
draft model's decode) from the oracle at the forward's positions themselves, without that
offset. A draft extend whose input at position p is the token of p + 1, as the offset says,
is reported WRITE_TOKEN_MISMATCH at every token. Whether EAGLE's draft worker gives that
forward such input ids is not established here (the worker is not run): this shows what
SGLang's runtime does with them. The KV-canary conformance suite's runtime leg
(conformance/sglang_manager.py) meets it in every draft extend of its engine histories.

Runs SGLang's TokenOracleManager.fill_expected_inputs and its ForwardMode (the enum's own
source, taken from forward_batch_info.py, whose module needs SGLang's serving stack) on a
two-request draft extend of one token each, and its write launcher (the torch reference) on
the result. Prints SGLang's result beside the contract's (a correct history is silent) and
exits 1 while the divergence is there, 0 once it is gone.
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
    oracle = runtime.oracle.HashOracle(vocab_size=50_000)
    rids = torch.tensor([11, 12], dtype=torch.int64)
    positions = torch.tensor([5, 7], dtype=torch.int64)  # each request's position written
    # the draft model's input at position p: the token of p + 1 (the EAGLE offset)
    ids = oracle.expected_tokens(generalized_req_ids=rids, positions=positions + 1)
    batch = types.SimpleNamespace(
        forward_mode=runtime.ForwardMode.DRAFT_EXTEND_V2,
        positions=positions,
        input_ids=ids.to(torch.int64),
        rids_int=rids,
        bootstrap_room_ids_int=None,
        extend_seq_lens=torch.ones(2, dtype=torch.int64),
        spec_info=types.SimpleNamespace(draft_token_num=1, num_tokens_per_req=1),
    )
    expected = runtime.expected_inputs.ExpectedInputs.allocate(capacity=2, device="cpu")
    runtime.manager.TokenOracleManager(oracle=oracle).fill_expected_inputs(
        forward_batch=batch, expected_inputs_out=expected
    )
    rows = write_reports(kv, batch.input_ids, positions, expected.tokens[:2])
    report(
        rows == 2,
        f"WRITE_TOKEN_MISMATCH rows for a correct two-token draft extend: {rows}",
        "none: each input is the oracle's token one position on, as the draft model's offset says",
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
