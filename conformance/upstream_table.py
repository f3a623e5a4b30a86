"""``docs/UPSTREAM.md``: SGLang's history under the suite, generated from the expectations files
of ``conformance.upstream.RELEASES`` (given to :func:`render`, so this module needs no import
of that one).

    python -m conformance.upstream table          # write docs/UPSTREAM.md
    python -m conformance.upstream table --check  # exit 1 if it is out of date

Releases are the columns, divergences the rows: a cell counts the tests that a release's
expectations file lists with that divergence's tag. The divergences themselves (title, level,
what an engine sees, the repro script) are :data:`DIVERGENCES`; every tag an expectations file
uses must be one of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from conformance import expectations

_TAGS = re.compile(r"(?:\[\d+\])+")


@dataclass(frozen=True)
class Divergence:
    title: str
    level: str  # the conformance level whose tests show it
    engine_sees: str = ""  # for a real divergence: what an engine that hits it sees
    repro: str = ""  # docs/upstream/<script>, for a real divergence
    #: (oldest, newest) release on which the script reproduces it, measured on every release
    reproduces: tuple[str, str] = ("", "")


DIVERGENCES: dict[int, Divergence] = {
    1: Divergence(
        "N-D sources refused: the row width is taken as `shape[1] * element_size()`",
        "core",
        "An engine that hands the canary its KV pool as it is, `[pages, page_size, heads, "
        "head_dim]`, gets a `ValueError` at construction naming a width of `shape[1]` "
        "elements, and has to reshape every pool into a `[pages, bytes]` view first; a pool "
        "whose `shape[1] * element_size()` happens to be a multiple of 16 is accepted and then "
        "hashed over the wrong bytes.",
        "repro_1_nd_source.py",
        ("0.5.13", "0.5.23"),
    ),
    2: Divergence(
        "the position assert at INT64_MAX: `prev_pos + 1` in Python ints",
        "core",
        "A request whose positions run through 2^63 - 1 (a sentinel, or positions offset by a "
        "large base) gets a spurious `WRITE_POSITION_MISMATCH` row and then `ValueError: "
        "Overflow when unpacking long long`, after the canary buffer and `slot_run_counter` "
        "have already changed: the launch fails half done.",
        "repro_2_position_wrap.py",
        ("0.5.13", "0.5.23"),
    ),
    3: Divergence(
        "refused launches change state: counters move before the error",
        "core",
        "A launch that raises (a missing expected-token tensor, a slot stride of 24 bytes) has "
        "already bumped `kernel_run_counter` (and, in verify, `slot_run_counter`), so an "
        "engine that retries after fixing the call counts one launch too many, and health "
        "checks built on the counters drift.",
        "repro_3_refusal_moves_counters.py",
        ("0.5.21", "0.5.23"),
    ),
    4: Divergence(
        "the launchers' checks run on CUDA only",
        "core",
        "On CPU and XPU (the torch reference path) a strided `canary_buf` or token array and "
        "a wrong expected-tensor combination are not refused: verify reads the strided buffer "
        "as if it were dense, and write fails later inside torch. The same call raises the "
        "contract's error on CUDA, so a bug found on a GPU box cannot be reproduced on a "
        "laptop.",
        "repro_4_cpu_skips_checks.py",
        ("0.5.21", "0.5.23"),
    ),
    5: Divergence(
        "the contract's own additions (type checks, rules 1, 2, 8 and 10, the §4, §8, §12 "
        "and §13 launch checks, §11)",
        "full",
    ),
    6: Divergence(
        "a negative ring write index: the ring is sliced from a negative start",
        "core",
        "An engine whose `violation_write_index` is below 0 (set so by its caller, or wrapped "
        "past 2^31 - 1) sees the torch reference assign its violation rows to "
        "`ring[index : index + n]`, a slice counted from the ring's end: the rows land in the "
        "ring's last rows, or the launch fails with a `RuntimeError` about tensor sizes. The "
        "contract stores nothing below index 0 and counts on; SGLang's CUDA kernel writes "
        "before the ring, into memory it does not own.",
        "repro_6_negative_ring_index.py",
        ("0.5.13", "0.5.23"),
    ),
    7: Divergence(
        "rows measured by `shape[1]`: rules 7 and 9 check the dim-1 width, not `stride(0)`",
        "core",
        "A source that is a view of a wider pool, rows `stride(0)` apart but `shape[1]` bytes "
        "wide (a `[pages, 17]` slice of a `[pages, 32]` uint8 pool), is refused with `dim-1 "
        "byte width must be a multiple of 16` although its rows are where the contract says; "
        "a source whose `shape[1]` width is a multiple of 16 but whose row stride is not is "
        "accepted. The messages of rules 7 and 9 name that dim-1 width.",
        "repro_7_rows_by_shape.py",
        ("0.5.13", "0.5.21"),
    ),
    8: Divergence(
        "rule 9 missing: a row too narrow for its page is accepted",
        "core",
        "A source whose rows are narrower than `page_size * num_bytes_per_token` (a wrong page "
        "size in the engine's config) is accepted at construction; the CUDA kernel then reads "
        "each page's last slots from past the row, the next page's bytes, and the canary hashes "
        "memory that is not that slot's KV.",
        "repro_8_narrow_row_accepted.py",
        ("0.5.13", "0.5.20"),
    ),
    9: Divergence(
        "a source that is not contiguous as a whole is refused at launch",
        "core",
        "An engine that gives the canary one layer of its pool, a view whose rows are dense but "
        "whose pages sit a whole pool row apart, has every write and verify refused with "
        "`real_kv_sources[0].tensor must be contiguous`, the one layout a pool of several "
        "layers produces; making a contiguous copy would hash a snapshot instead of the live "
        "KV (CONTRACT §3).",
        "repro_9_layer_view_refused.py",
        ("0.5.13", "0.5.20"),
    ),
    10: Divergence(
        "the contiguity error names `canary_buf`, not `context.canary_buf`",
        "core",
    ),
    11: Divergence(
        "plan refusals name SGLang's internals: `launch_canary_plan_kernels_torch_reference`, "
        "`launch_plan_entries_kernel`, `out_write_offsets`, `lut_tensor`",
        "core",
        "A plan launch with the expected-token pool but no valid lengths (P3), or a "
        "`verify_capacity` that is not the verify plan's length (P5), is refused with a message "
        "that names `launch_canary_plan_kernels_torch_reference` on CPU and XPU (from 0.5.21) "
        "or, for P3 on the kernel path, `launch_plan_entries_kernel`, a function the engine never "
        "called. On the kernel path (CUDA on every release; every device before 0.5.21) a "
        "strided `write_plan_out.write_offsets` is refused as `out_write_offsets` and a strided "
        "`full_to_swa_index_mapping` as `lut_tensor` (P7): the offsets kernel's own parameter "
        "names. Log matching and alerting keyed on the public launcher's message and argument "
        "names miss them.",
        "repro_11_plan_messages.py",
        ("0.5.13", "0.5.23"),
    ),
    12: Divergence(
        "the plan's launch checks run on CUDA only: more than 4096 rows, more rows than the "
        "write plan holds and strided tensors are taken on CPU",
        "core",
        "From 0.5.21, on CPU and XPU (the torch reference path), a plan launch of 4097 rows, of "
        "more rows than `write_plan_out` holds, or with a strided `req_to_token`, `prefix_lens` "
        "or plan tensor runs: the reference caps the seeds and offsets it writes at the write "
        "plan's capacity, its offsets ending where the first dropped row starts, and sets "
        "`write_num_valid_reqs` to `bs`, above the capacity, so the rows past it are silently "
        "never written; a strided tensor is read through its view. The same launch is refused on CUDA, so a configuration that "
        "works in CPU tests fails on the GPU box.",
        "repro_12_plan_checks_cuda_only.py",
        ("0.5.21", "0.5.23"),
    ),
    13: Divergence(
        "a refused plan launch has already changed the plans: `write_offsets` zeroed, the "
        "offsets kernel run",
        "core",
        "On the kernel path (CUDA; every device before 0.5.21) the launcher zeroes "
        "`write_plan_out.write_offsets` before the offsets kernel checks its arguments, and "
        "checks P3 only after that kernel has filled the write plan, `verify_num_valid` and "
        "`enable`. A launch refused for a wrong dtype, a strided tensor, a write plan too small "
        "or a missing valid-lengths tensor leaves the previous step's plans half overwritten: "
        "an engine that catches the error and launches write with its old plan writes nothing "
        "(all offsets 0), or with the new, half-made one.",
        "repro_13_refused_plan_changes_plans.py",
        ("0.5.13", "0.5.23"),
    ),
    14: Divergence(
        "P13 unchecked by the Triton offsets kernel: a seed slot past the SWA table is clamped "
        "to its last entry",
        "full",
        "With a `full_to_swa_index_mapping` shorter than the full pool, SGLang's torch reference "
        "refuses a slot past its end (P13), but its Triton offsets kernel, which plans the write "
        "seeds on the kernel path (CUDA, and every device before 0.5.21), clamps the slot to the "
        "table's last entry and seeds the write chain from whatever SWA slot that holds: the "
        "write then links the request to an unrelated slot's chain hash, and verify reports "
        "chain mismatches that no corruption caused. SGLang's own reference and its own kernel "
        "disagree; from 0.5.21 a CPU run takes the reference, so the release legs show it only "
        "before 0.5.21, the kernel-path legs (`sglang-kernels-0.5.NN`) from then on, and the "
        "repro script runs the Triton kernel (interpreted) on every release.",
        "repro_14_swa_seed_clamped.py",
        ("0.5.13", "0.5.23"),
    ),
    15: Divergence(
        "the scatter takes at most 511 requests, the plan 4096",
        "core",
        "An engine batch of 512 to 4096 requests, which the plan kernel takes, cannot fill its "
        "expected-token pool: `launch_scatter_req_token_ids_kernel` raises `bs+1=... exceeds "
        "BATCH_BLOCK=512`, so a large decode batch either fails its step or runs without the "
        "token check.",
        "repro_15_scatter_511_requests.py",
        ("0.5.13", "0.5.23"),
    ),
    16: Divergence(
        "the scatter checks neither its offsets nor its pool rows: it reads and writes outside "
        "its buffers",
        "full",
        "Offsets that do not start at 0, that decrease or that end short of `flat_in`, and a "
        "request whose pool row is past the pool or -1, are not refused. The Triton kernel "
        "takes a token's request to be the number of offsets at or below its index, less one: "
        "tokens past `offsets[bs]` are written to the row named by `req_pool_indices[bs]`, the "
        "word after the indices; tokens before an `offsets[0] > 0` belong to request -1, whose "
        "offset and row are the words before `offsets` and before `req_pool_indices`; a token "
        "between decreasing offsets lands at a negative column, the previous pool row's last "
        "columns (before the pool for row 0); a row past the pool is written into whatever "
        "memory follows it, row -1 into what precedes it (on a GPU, other allocations). Under "
        "the suite's memory watch each such launch fails with the accesses it made outside its "
        "buffers.",
        "repro_16_scatter_out_of_bounds.py",
        ("0.5.13", "0.5.23"),
    ),
    17: Divergence(
        "on the kernel path (CUDA on every release; every device before 0.5.21) the plan "
        "launcher checks only the offsets kernel's arguments: a strided expected-token pool or "
        "verify plan field reaches the CUDA entries kernel (on CPU before 0.5.21, the torch "
        "reference in its place) with no `kv-canary:` check (`repro_11_plan_messages.py` shows "
        "it on every release)",
        "core",
    ),
    18: Divergence(
        "the write's input assert cannot fire in an extend mode: the token oracle manager "
        "expects the input ids themselves in EXTEND, MIXED and TARGET_VERIFY",
        "core",
        "With mixed chunked prefill or EAGLE, a sampled token that is swapped or corrupted "
        "before a MIXED batch or a target verify writes it is its own expected input, and the "
        "expected-token pool holds it too: the canary stays silent, where a DECODE batch "
        "reports WRITE_TOKEN_MISMATCH. Under EAGLE the target model runs no DECODE, so its "
        "canary never checks a sampled token. The runtime leg (`conformance/sglang_runtime.py`) "
        "runs the same manager on every forward of the engine histories, on every release: the "
        "input ids in `EXTEND`, `MIXED` and `TARGET_VERIFY`, the oracle's tokens in `DECODE`, "
        "`IDLE` and `DRAFT_EXTEND_V2` (which `ForwardMode.is_extend()` leaves out, so the draft "
        "model's draft extend keeps a check that can fire: under the EAGLE offset it fires on "
        "every token of a correct history, [20]).",
        "repro_18_input_assert_off_in_extend_modes.py",
        ("0.5.13", "0.5.23"),
    ),
    19: Divergence(
        "plan rows unchecked (P10, P11): a row outside the page table or a prefix past its row "
        "is planned from memory outside the table, or refused by torch itself",
        "full",
        "A request whose pool row is not a row of `req_to_token`, or whose prefix is longer than "
        "the row, is not refused by SGLang's checks. Its torch reference (the CPU path from "
        "0.5.21) reads every row before it writes: a row past the table or a prefix past the row "
        "raises torch's own `IndexError` with both plans untouched, and a row of -1 is not "
        "refused at all: negative indexing plans the table's last row, another request's "
        "slots. Its Triton offsets kernel (the kernel path: CUDA, and every device before "
        "0.5.21) reads a row of -1 from the memory before the table, a row past the table from "
        "the memory after it and a prefix past the row from the next row, and seeds the write "
        "chain from the slot it finds there.",
        "repro_19_plan_rows_unchecked.py",
        ("0.5.13", "0.5.23"),
    ),
    20: Divergence(
        "the draft model's draft extend expects the oracle's token at each position itself, "
        "not one position on as its canary's EAGLE offset keys its tokens",
        "core",
        "The token oracle manager fills a `DRAFT_EXTEND_V2` forward's expected input tokens "
        "from the oracle at the forward's positions, and the input assert stays on there (the "
        "manager switches it off only in the draft model's decode). The draft model's canary "
        "has the EAGLE offset 1: its input at position p is the token of p + 1. A draft extend "
        "fed so is reported `WRITE_TOKEN_MISMATCH` at every token of a correct history: the "
        "per-forward leg (`conformance/sglang_manager.py`) meets it in every draft extend of "
        "its engine histories on the releases whose model runner gives the draft worker a "
        "token oracle (up to 0.5.17), and leaves those reports out of its comparison; from "
        "0.5.18 the draft worker has none, and its canary cannot run with the input assert "
        "on at all ([22]). Whether EAGLE's draft worker gives that forward such input ids is "
        "not established here (the worker is not run).",
        "repro_20_draft_extend_expects_the_position_itself.py",
        ("0.5.13", "0.5.23"),
    ),
    21: Divergence(
        "a forward that replays a CUDA graph (a decode, a target verify, EAGLE's draft decode "
        "or draft extend) never checks a verified slot's token: the capture batch has no "
        "`req_all_ids_lens`, so every replay plans the expected-token valid lengths 0",
        "core",
        "With the verify token assert on (`SGLANG_KV_CANARY_ENABLE_VERIFY_TOKEN_ASSERT`), a "
        "slot whose record names a token other than the request's is reported "
        "`VERIFY_TOKEN_MISMATCH` by an eager forward, and by no decode that replays a CUDA "
        "graph (the default for decode batches up to the largest captured size). "
        "`SingleForwardManager.pre_ops_maybe_inside_graph` fills its `PlanInput` inside the "
        "graph; `PlanInput.fill_from_forward_batch` copies the valid lengths only `if "
        "req_all_ids_lens is not None`, and the decode graph runner's capture batch "
        "(`capture_prepare`'s `ForwardBatch(...)`) does not pass that field: the copy is "
        "never captured, every replay plans valid lengths 0 and the plan gathers no expected "
        "token (-1: not checked). Under speculative decoding (EAGLE) the runner captures "
        "`TARGET_VERIFY` in place of `DECODE` through the same call (its `spec_info` from "
        "`get_spec_info`), so a target verify that replays a graph checks no token either "
        "(shown on 0.5.23 by the per-forward leg and by the script). EAGLE's draft model has "
        "two graph runners of its own, and neither capture call passes `req_all_ids_lens`: "
        "the draft decode runner (`speculative/eagle_draft_cuda_graph_runner.py`, every step "
        "of its multi-step draft in one graph, each step's canary bracket inside it) and the "
        "draft extend runner (`speculative/eagle_draft_extend_cuda_graph_runner.py`, "
        "`DRAFT_EXTEND_V2`). The script captures `PlanInput` on a batch of the fields each "
        "call passes and replays it (shown on 0.5.13, 0.5.20 and 0.5.23); the per-forward leg "
        "replays both graphs too, and their verify entries check no token. Chain, position and "
        "real-KV checks are untouched, and so is the write's input assert "
        "(`WRITE_TOKEN_MISMATCH`), whose oracle runs inside the graph. The per-forward leg "
        "(`conformance/sglang_manager.py`) replays its graph decodes, target verifies, draft "
        "decodes and draft extends as captured and counts the verify entries left unchecked; "
        "its fault trials settled by replayed graphs meet every predicted report but the "
        "`TOKEN` bit "
        "(where any one of a report's bits was due, `TOKEN` among them, none is: a record "
        "that differs in its token alone shows nothing at its slot under a replay, its chain "
        "breaking one position on).",
        "repro_21_graph_replay_skips_token_check.py",
        ("0.5.13", "0.5.23"),
    ),
    22: Divergence(
        "with the write's input assert on, EAGLE's draft model cannot run its canary: the model "
        "runner gives a draft worker no token oracle, and its draft extend asks for one",
        "core",
        "With `SGLANG_KV_CANARY_ENABLE_WRITE_INPUT_ASSERT` on (the `token_oracle` sampling "
        "backend) and EAGLE speculative decoding, the draft model's canary raises "
        "`RuntimeError: kv-canary: enable_write_input_assert=True requires a "
        "TokenOracleManager` at its first `DRAFT_EXTEND_V2` launch. `ModelRunner."
        "init_token_oracle` sets a draft worker's token oracle manager to None (the oracle "
        "sampler is process-wide), `install_canary` passes that to the draft model's "
        "`CanaryManager`, and `SingleForwardManager` switches the input assert off for the "
        "draft model's decodes only; `install_canary` (run from its source by the support "
        "matrix: a draft worker's canary installs) does not refuse the combination at "
        "startup. EAGLE's "
        "worker (`speculative/eagle_worker_v2.py`, read, not run here) makes a draft extend "
        "after each prefill and each verify, so such a server does not serve, no EAGLE server "
        "checks its written tokens, and [20] is never reached on one. Up to 0.5.17 every model "
        "runner, the draft's too, installed the oracle. The script runs `init_token_oracle` "
        "and `SingleForwardManager`'s input-assert decision and oracle check from their "
        "source; the per-forward leg (`conformance/sglang_manager.py`) gives each manager "
        "what `init_token_oracle` gives its runner, shows the `RuntimeError` on a draft "
        "model's history with the assert on, and runs the draft model's histories with the "
        "assert off.",
        "repro_22_draft_runner_has_no_token_oracle.py",
        ("0.5.18", "0.5.23"),
    ),
    23: Divergence(
        "KV that SGLang moves without a forward (a retraction's backup, HiCache, an EAGLE "
        "tree's accepted path) moves without the canary's records: a correct server reports "
        "the moved slots",
        "core",
        "A PD decode server with the canary and a `cpu_tensor` retraction backup reports the "
        "positions of every resumed request at its next decode (`CHAIN`, `POSITION`, and "
        "`TOKEN` and `REAL_KV` where the stale record's differ), and a server with HiCache "
        "reports a reloaded prefix at the next cache sweep: no fault, only moved KV. "
        "`install_canary` keeps the canary's buffers beside the pool's and splices them into "
        "`get_contiguous_buf_infos`, the list a PD transfer moves (carried: the runtime leg "
        "runs the splice). The retraction backup (`backup_kv_cache` and `restore_kv_cache`, "
        "through `Req.offload_kv_cache` and `load_kv_cache`) copies "
        "`MHATokenToKVPool.get_cpu_copy`'s per-layer K and V buffers into the slots newly "
        "allocated to the resumed request (`load_cpu_copy`), and on 0.5.23 HiCache's host "
        "pool copies the buffers of the pool's buffer info (`_mha_buffers`: the per-layer K "
        "and V buffers; the host pool's own copy in `pool_host/mha.py` read, not run); the "
        "canary's records of the new slots stay those of their previous owner. The script "
        "runs `get_cpu_copy`, `load_cpu_copy` and `_mha_buffers` from their source on a pool "
        "with SGLang's canary records and verifies the restored position with SGLang's "
        "verify launcher; the support matrix (`conformance/sglang/matrix.py`, "
        "`conformance/sglang/kv_paths.py`) runs both paths on correct histories through "
        "SGLang's per-forward runtime and shows each first report. Releases before 0.5.23 "
        "have no `_mha_buffers`: their HiCache path is not run. With EAGLE drafting a tree "
        "(`topk` > 1), `_finalize_accept_tree_path` (read) moves the accepted drafts' KV to "
        "the front of their request's block through `move_accept_tokens_to_target_kvcache` "
        "(run by the suite's tree verifies to choose the moves, its Triton kernels "
        "interpreted) and the pool's `move_kv_cache`, which moves the per-layer K and V "
        "buffers alone: the "
        "script runs `move_kv_cache` with the native move and `_slot_move_pointer_buffers` "
        "(the buffers the default move copies) from their source, and `kv_paths` runs the "
        "same (shown on 0.5.20 and 0.5.23; 0.5.13's pool has another shape, not run). The "
        "support matrix's EAGLE tree row makes that move after each of the target model's "
        "tree verifies (`conformance/sglang/tree.py`), where [27] reports first.",
        "repro_23_kv_moves_leave_records_behind.py",
        ("0.5.13", "0.5.23"),
    ),
    24: Divergence(
        "with breakable prefill CUDA graphs the canary runs each prefill on the graph runner's "
        "replay batch, which has no `rids_int` and no `req_all_ids_lens`: with the token "
        "oracle on the first such prefill raises, and without it no prefill checks a token",
        "core",
        "`install_canary` refuses piecewise prefill graphs and names "
        "`--cuda-graph-backend-prefill=breakable` as the setting to use with the canary. Under "
        "it the prefill graph runner (`model_executor/runner/prefill_cuda_graph_runner.py`) "
        "captures the transformer body alone (`_run_forward` calls `layer_model.forward`, "
        "which the canary does not wrap), and each replay swaps `layer_model.forward` for the "
        "graph and calls the wrapped outer `model.forward` eagerly on the batch `load_batch` "
        "builds: its token axis padded to the captured bucket, a `MIXED` batch as `EXTEND`, "
        "and only the fields that call passes, which are neither `rids_int` nor "
        "`bootstrap_room_ids_int` nor `req_all_ids_lens`. With the token oracle on (the "
        "write's input assert), `TokenOracleManager.fill_expected_inputs` expands `rids_int` "
        "per token and raises `TypeError` on None at the server's first prefill that replays "
        "a graph; without it, `PlanInput` plans the expected-token valid lengths 0 and no "
        "prefill checks a token. The script reads the runner's source for those facts and "
        "runs SGLang's oracle manager and `PlanInput` on a prefill as `load_batch` builds it "
        "(0.5.13 has another breakable runner, which it does not run); the support matrix's "
        "breakable prefill row runs a correct history through SGLang's per-forward runtime on "
        "that batch (`conformance/sglang/prefill_graphs.py`) and shows the `TypeError` at "
        "its first prefill.",
        "repro_24_breakable_prefill_replay_batch.py",
        ("0.5.14", "0.5.23"),
    ),
    25: Divergence(
        "under overlap scheduling with decode CUDA graphs the scheduler's write fence ends "
        "before the canary reads the page table: a finished request's overshoot decode can "
        "verify its positions at the slots of the request that took its row",
        "core",
        "The overlap loop (`managers/scheduler.py`: `event_loop_overlap`) prepares the next "
        "batch while a forward runs, its page-table writes fenced behind the forward's reads "
        "of the buffers the scheduler shares (`_apply_war_barrier`). A replayed decode graph "
        "gives that fence an event recorded before the model's forward: from 0.5.14 just "
        "before the replay (`war_fastpath_read_done_event`), from 0.5.18 inside the graph "
        "after the attention backend's metadata (`SharedReadEnds.IN_REPLAY`, the base "
        "backend's answer for decode). The canary's plan and verify run inside the model's "
        "forward (`_patch_model_forward`) and read `req_to_token` after that event. A request "
        "finished by a stop token is still in the next batch, one decode past its end "
        "(`batch_result_processor.py`); its row is freed while that batch runs, and the batch "
        "after it can take the row and write its new request's slots there. Where the write "
        "lands first, the overshoot decode's canary verifies the finished request's positions "
        "at the new request's slots and reports `CHAIN`, `POSITION` and `REAL_KV` on a "
        "correct server; the fence allows that order and does not force it. An eager decode "
        "publishes no event (the fence waits for the whole forward), and 0.5.13 has no "
        "event. The script reads those facts from the source and verifies a position with "
        "SGLang's verify launcher at the row as the next batch leaves it; the support "
        "matrix's overlap rows (`conformance/sglang/overlap.py`) run correct histories "
        "through SGLang's per-forward runtime in that order, with decode graphs (the first "
        "report) and without (silent).",
        "repro_25_overlap_fence_before_canary_reads.py",
        ("0.5.14", "0.5.23"),
    ),
    26: Divergence(
        "a model whose every attention layer slides, served on SGLang's SWA pool, cannot "
        "start with the canary: the SWA attacher indexes the first layer of a full sub-pool "
        "that has none (`IndexError`)",
        "core",
        "SGLang serves a model it calls hybrid SWA (`is_hybrid_swa_model`) on `SWAKVPool`, "
        "its full sub-pool one layer per full attention layer (`get_hybrid_layer_ids`). An "
        "architecture whose every layer slides (`UnlimitedOCRForCausalLM` from 0.5.15; the "
        "MTP draft modules `MiMoV2MTP` and `Step3p5MTP` on every release) has none, so the "
        "full sub-pool is an `MHATokenToKVPool` of zero layers and an empty `k_buffer`. "
        "`install_canary` attaches the canary with `attach_swa`, which builds the full group "
        "first from `k_buffer[0]` and raises `IndexError` at server start, where a "
        "`kv-canary:` refusal or a canary over the SWA part alone would be expected. The "
        "script runs `is_hybrid_swa_model` and `get_hybrid_layer_ids` from the source on "
        "those architectures, and `attach_swa` from the source on a pool of that shape; the "
        "support matrix's pure SWA rows run `install_canary` with SGLang's own attachers on "
        "the pool SGLang's code chooses (`conformance/sglang/model_layers.py`): "
        "`MistralForCausalLM`, which SGLang does not call hybrid, gets an MHA pool and "
        "installs.",
        "repro_26_pure_swa_pool_install.py",
        ("0.5.13", "0.5.23"),
    ),
    27: Divergence(
        "with EAGLE drafting a tree (`topk` > 1) every target verify writes sibling drafts at "
        "one position: the chain position assert reports `WRITE_POSITION` on a correct server",
        "core",
        "EAGLE's tree verify (`speculative/eagle_utils.py`: `build_tree_kernel_efficient`, "
        "whose Triton build the suite's self-test runs, `conformance/sglang/tree.py`) gives "
        "each draft node the position of its depth, so siblings share "
        "a position, while its `out_cache_loc` runs over the request's next "
        "`draft_token_num` slots. The canary plans the verify's writes from `seq_lens` and the "
        "draft count (`PlanInput`, `TARGET_VERIFY`) and writes the batch's positions; with the "
        "chain position assert on, each write must be its previous record's position plus "
        "one, so a sibling written after its brother reports `WRITE_POSITION_MISMATCH` at "
        "every tree verify, with no fault anywhere. The script runs SGLang's write launcher "
        "on four nodes at depths 0, 1, 1 and 2 after a prompt (one row) and on a chain of "
        "four (none); the support matrix's EAGLE tree row runs the target model's correct "
        "history with tree verifies (`conformance/sglang/tree.py`: two nodes at every depth, "
        "the accepted path's KV moved as SGLang's `move_kv_cache` moves it) through SGLang's "
        "per-forward runtime and shows `WRITE_POSITION` in `TARGET_VERIFY` at its first "
        "verify. The draft model's tree decode (`topk` tokens a step) is [29].",
        "repro_27_tree_verify_write_position.py",
        ("0.5.13", "0.5.23"),
    ),
    28: Divergence(
        "up to 0.5.17, with the write's input assert on, EAGLE's draft extend CUDA graph "
        "cannot be captured with the canary: its capture batch has no `rids_int`, and the "
        "token oracle manager raises `AttributeError`",
        "core",
        "Up to 0.5.17 every model runner, the draft model's too, gets the token oracle (from "
        "0.5.18 a draft worker gets none, [22]). EAGLE's draft extend graph runner "
        "(`speculative/eagle_draft_extend_cuda_graph_runner.py`) captures `DRAFT_EXTEND_V2` "
        "over a `ForwardBatch(...)` that passes neither `rids_int` nor "
        "`bootstrap_room_ids_int`, and with the input assert on the draft model's canary "
        "calls `TokenOracleManager.fill_expected_inputs` in that capture, which expands the "
        "request ids per token and raises `AttributeError` on None: such a server does not "
        "start. The script reads the capture call's keywords and what `ModelRunner` gives a "
        "draft worker from the source, and runs SGLang's oracle manager on a "
        "`DRAFT_EXTEND_V2` batch of those fields. On those releases the nightly job's "
        "per-forward leg runs the draft model's history with the assert on and shows it "
        "stopping at its first draft extend graph's capture, and runs EAGLE's histories and "
        "the support matrix with the assert off, as such a server must "
        "(`wiring.eagle_input_assert`).",
        "repro_28_draft_extend_capture_without_rids.py",
        ("0.5.13", "0.5.17"),
    ),
    29: Divergence(
        "with EAGLE drafting a tree (`topk` > 1) the draft model's canary cannot plan a draft "
        "decode step: its plan input copies `topk` positions a request into a buffer of one a "
        "request and raises `RuntimeError`",
        "core",
        "EAGLE's draft decode gives each request `topk` tokens a step: the `ForwardBatch`'s "
        "positions are `seq_lens.repeat_interleave(topk)` (`prepare_for_draft`, run by the "
        "suite's self-test on 0.5.23; on older releases the draft input's preparation, read), "
        "its `req_pool_indices` one a request, "
        "its mode `DECODE`; the draft decode graph runner captures that shape "
        "(`positions[:bs * captured_req_width]`, the width `speculative_eagle_topk`). The "
        "draft model's canary runs in each step, and `PlanInput.fill_from_forward_batch` "
        "copies a decode's positions into `prefix_lens[:bs]`: with `topk` > 1 it raises "
        "`RuntimeError` at the first draft decode step, or at the server's start where the "
        "draft decode graph is captured. The script finds that repeat in the source and runs "
        "SGLang's `PlanInput` on a `DECODE` batch of two requests and two positions each (and "
        "of one each, which plans); the support matrix's EAGLE tree row runs the draft model's "
        "correct history with its draft decode steps widened so (`conformance/sglang/tree.py`: "
        "`widen`) through SGLang's per-forward runtime, which raises at its first draft decode "
        "step.",
        "repro_29_tree_draft_decode_plan_input.py",
        ("0.5.13", "0.5.23"),
    ),
}


def _tags(entry: expectations.Entry) -> list[int]:
    """The divergences an entry shows: the ``[N]`` tags its reason starts with (``[7][9]``)."""
    match = _TAGS.match(entry.reason)
    if not match:
        raise ValueError(f"entry {entry.pattern!r}: its reason starts with no [N] tag")
    return [int(tag) for tag in re.findall(r"\d+", match.group(0))]


def _entries(folder: Path, stem: str) -> list[expectations.Entry]:
    path = folder / f"{stem}.txt"
    return expectations.parse(path.read_text(), source=str(path))


def counts_of(path: Path) -> dict[int, int]:
    """How many entries of one expectations file carry each tag."""
    tally: dict[int, int] = {}
    for entry in expectations.parse(path.read_text(), source=str(path)):
        for tag in _tags(entry):
            if tag not in DIVERGENCES:
                raise ValueError(f"{path}: tag [{tag}] is not in DIVERGENCES")
            tally[tag] = tally.get(tag, 0) + 1
    return tally


def counts(releases: Sequence, folder: Path) -> dict[str, dict[int, int]]:
    """Per expectations stem: how many entries carry each tag."""
    return {
        stem: counts_of(folder / f"{stem}.txt")
        for stem in sorted({r.expectations for r in releases})
    }


def example(tag: int, releases: Sequence, folder: Path) -> tuple[str, str]:
    """(release, test pattern) of the newest release listing ``tag``."""
    for entry_release in reversed(releases):
        for entry in _entries(folder, entry_release.expectations):
            if tag in _tags(entry):
                return entry_release.version, entry.pattern
    return "", ""


def _release_rows(releases: Sequence, folder: Path) -> list[str]:
    """The table of the releases' files: a column a release, a row a divergence."""
    tallies = counts(releases, folder)
    header = ["divergence", "level", *(r.version for r in releases), "first", "last"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    files = ["files", "", *(r.expectations.removeprefix("sglang-") for r in releases), "", ""]
    lines.append("| " + " | ".join(files) + " |")
    for tag, divergence in DIVERGENCES.items():
        cells = [str(tallies[r.expectations].get(tag, 0) or "-") for r in releases]
        present = [r.version for r, c in zip(releases, cells) if c != "-"]
        if not present:
            continue
        first, last = present[0], present[-1]
        fixed = last if last != releases[-1].version else "open"
        lines.append(
            f"| [{tag}] {divergence.title} | {divergence.level} | "
            + " | ".join(cells)
            + f" | {first} | {fixed} |"
        )
    return lines


def _kernel_rows(folder: Path) -> list[str]:
    """The table of the plan's kernel path files (none: no lines)."""
    kernel_files = sorted(folder.glob("sglang-*-kernels.txt"))
    if not kernel_files:
        return []
    stems = [f.stem for f in kernel_files]
    tally = {stem: counts_of(folder / f"{stem}.txt") for stem in stems}
    names = [stem.removeprefix("sglang-").removesuffix("-kernels") for stem in stems]
    lines = [
        "The plan's kernel path, the one SGLang takes on CUDA, of the releases whose CPU path",
        "is another (`tox -e sglang-kernels-RELEASE`, `CANARY_SGLANG_PLAN=kernels`; files",
        "`sglang-RELEASE-kernels.txt`): their files differ from the release's only in the plan",
        "group, whose entries are 0.5.20's, so that a fix of that path shows as an unexpected",
        "pass.",
        "",
        "| divergence | " + " | ".join(f"{n} kernels" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for tag, divergence in DIVERGENCES.items():
        cells = [str(tally[stem].get(tag, 0) or "-") for stem in stems]
        if any(c != "-" for c in cells):
            lines.append(f"| [{tag}] {divergence.title} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def _real_divergences(releases: Sequence, folder: Path) -> list[str]:
    """A section a real divergence: what an engine sees, a test that shows it, its script."""
    lines = ["## The real divergences", ""]
    for tag, divergence in DIVERGENCES.items():
        if not divergence.engine_sees:
            continue
        release_shown, pattern = example(tag, releases, folder)
        lines.append(f"### [{tag}] {divergence.title}")
        lines.append("")
        lines.append(divergence.engine_sees)
        lines.append("")
        if pattern:
            lines.append(f"Shown by `{pattern}` (in {release_shown}).")
        if divergence.repro:
            first, last = divergence.reproduces
            lines.append(
                f"Reproduce it with `docs/upstream/{divergence.repro}` "
                "(`pip install torch sglang==X --no-deps`, then `python` the script): it "
                f"reproduces on {first} to {last}."
            )
        lines.append("")
    return lines


def render(releases: Sequence, folder: Path) -> str:
    """The document for ``releases`` (``conformance.upstream.Release``) and their files."""
    lines = [
        "# SGLang's kv_canary, release by release",
        "",
        "Generated by `python -m conformance.upstream table` from `conformance/expectations/` and",
        "`conformance/upstream_table.py`; `tests/suite/test_upstream.py` fails when it is out of",
        "date. Do not edit it by hand.",
        "",
        "Each column is a release (`tox -e sglang-RELEASE`), each row a divergence from the",
        "contract. A cell counts the tests that release's expectations file lists for it (`-`:",
        "none). Releases whose kv_canary files are byte-identical share one file: the `files`",
        "row names it. Level `full` rows are the contract's own additions, which SGLang never",
        "promised; `--canary-level core` leaves their tests out.",
        "",
        *_release_rows(releases, folder),
        "",
        "`first` and `last` are the oldest and newest releases whose file shows it (`open`: the",
        "newest does). A file lists each failing test once, under the divergence that fails it",
        "first, so an older release can have a divergence that its file does not show: up to",
        "0.5.20, [9] refuses at launch nearly every source the suite builds, before [2], [3],",
        "[4] or [6] can show. The repro scripts below tell them apart on any release (that of",
        "[2] reproduces on 0.5.13; those of [3] and [4] do not, since before 0.5.21 a launcher",
        "made every check before it reached the kernel). The plan runs the other way round:",
        "from 0.5.21 a CPU run takes SGLang's torch reference, so [13] and [14], which live in",
        "its kernel path (CUDA), show in these files up to 0.5.20 only, and from 0.5.21 in the",
        "kernel path's files below; their scripts run that path, its Triton kernel interpreted,",
        "and reproduce them on every release.",
        "",
        *_kernel_rows(folder),
        *_real_divergences(releases, folder),
    ]
    return "\n".join(lines).rstrip() + "\n"
