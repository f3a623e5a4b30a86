"""SGLang kv_canary: under overlap scheduling with decode CUDA graphs, the scheduler's write fence
lets the next batch's page-table writes start before the canary's per-forward code reads the
page table, so a finished request's overshoot decode can verify its positions at slots that the
next request now owns: a correct server reports them.

    pip install torch sglang==X --no-deps
    python repro_25_overlap_fence_before_canary_reads.py

The overlap loop (srt/managers/scheduler.py, event_loop_overlap) prepares batch k + 1 while
batch k runs, and fences the schedule stream's writes behind batch k's reads of the buffers the
scheduler shares (_apply_war_barrier). The fence is an event the decode graph runner records
(srt/model_executor/runner/decode_cuda_graph_runner.py): from 0.5.14 just before the replay;
from 0.5.18 inside the graph, after the attention backend's metadata (_record_in_graph_
metadata_prep_done, SharedReadEnds.IN_REPLAY, the base backend's answer for decode). The
canary's plan and verify run inside the model's forward (kv_canary/api.py,
_patch_model_forward), after that event, and read req_to_token. A request finished by a stop
token is still in the next batch (batch_result_processor.py: "a finished row reappears for one
overshoot tick"); its row is freed while that batch runs, and the batch after it can take the
row (the request pool hands out the row freed last) and write its own slots there. Where those
writes land first, the overshoot decode's canary verifies the finished request's positions at
the new owner's slots, whose records are not its own. Without graphs no event is published and
the fence waits for the whole forward (0.5.13 always does).

Reads those facts from the installed source, then writes a request's records with SGLang's
write launcher and verifies its first position with SGLang's verify launcher at the slot the
page table names before the next batch's write and after it. Prints SGLang's result beside the
contract's and exits 1 while the divergence is there, 0 once it is gone.
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
    root = sglang_root()  # before the loader registers its bare packages
    fence = fence_point(root)
    processor = read(root, "srt/managers/scheduler_components/batch_result_processor.py")
    overshoot = "(req.finished() or req.is_retracted)" in processor  # skipped: one tick late
    kv = load_kv_canary()
    ctx = context(kv)
    row = torch.tensor([1, 2, 3])  # the finished request's page-table row: positions 0, 1, 2
    plan = kv.write.WritePlan.allocate(write_req_capacity=1, device="cpu")
    plan.write_offsets[:] = torch.tensor([0, 3])
    plan.write_seed_slot_indices[0] = -1
    plan.write_num_valid_reqs[0] = 1
    launch(kv, "write", context=ctx, plan=plan, input_ids=torch.tensor([11, 12, 13]),
           positions=torch.tensor([0, 1, 2]), out_cache_loc=row, enable_write_input_assert=False,
           expected_input_tokens=None, expected_input_positions=None)  # fmt: skip
    # the overshoot decode's canary reads position 0 at the slot the row names: before ...
    launch(kv, "verify", context=ctx, plan=verify_plan(kv, int(row[0]), 0),
           check_verify_expected_token=False)  # fmt: skip
    silent = int(ctx.violation_write_index[0]) == 0
    # ... and after the next batch wrote its new request's slots 5 and 6 into the freed row
    rewritten = row.clone()
    rewritten[:2] = torch.tensor([5, 6])
    launch(kv, "verify", context=ctx, plan=verify_plan(kv, int(rewritten[0]), 0),
           check_verify_expected_token=False)  # fmt: skip
    rows = int(ctx.violation_write_index[0])
    report(
        bool(fence) and overshoot and silent and rows > 0,
        f"the fence of a replayed decode graph: {fence or 'the whole forward'}; a finished "
        f"request decodes once more: {'yes' if overshoot else 'not found'}; the canary's "
        f"verify of position 0 at the row the next batch rewrote: {rows} violation row(s) "
        f"(before the rewrite: {'none' if silent else 'some'})",
        "a correct server reports nothing: the canary's reads of the page table are fenced "
        "with the forward's other reads",
    )


def read(root: str, relative: str) -> str:
    path = os.path.join(root, *relative.split("/"))
    return open(path).read() if os.path.isfile(path) else ""


def fence_point(root: str) -> str:
    """Where the overlap loop's fence lets the next batch's writes start during a replayed
    decode graph, before the canary's reads ("" where it waits for the whole forward)."""
    api = read(root, "srt/kv_canary/api.py")
    wrapper = api[api.find("def _patch_model_forward") :]
    scheduler = read(root, "srt/managers/scheduler.py")
    loop = scheduler[scheduler.find("def event_loop_overlap") :]
    runner = read(root, "srt/model_executor/runner/decode_cuda_graph_runner.py")
    if not 0 <= wrapper.find("pre_ops_maybe_inside_graph(") < wrapper.find("output = original("):
        return ""
    if "self._apply_war_barrier()" not in loop[: loop.find("\n    def ")] or not runner:
        return ""
    if "def _record_in_graph_metadata_prep_done" in runner:
        backend = read(root, "srt/layers/attention/base_attn_backend.py")
        ends = backend[backend.find("def shared_read_ends") :][:600]
        body = runner[runner.find("def run_once():") :]
        marks = [body.find(m) for m in ("self._run_in_graph_metadata_prep(",
                                        "self._record_in_graph_metadata_prep_done()")]  # fmt: skip
        prep = min((m for m in marks if m >= 0), default=-1)
        if "return SharedReadEnds.IN_REPLAY" in ends and 0 <= prep < body.find("out = forward("):
            return "in the graph, after the attention metadata"
        return ""
    replay = runner.find("output = self.backend.replay(")
    event = runner.rfind("war_fastpath_read_done_event = read_done", 0, replay)
    return "before the replay" if 0 <= event < replay else ""


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")
    if spec is None:
        sys.exit("pip install torch sglang==X --no-deps")
    return list(spec.submodule_search_locations)[0]


if __name__ == "__main__":
    main()
