"""SGLang's per-forward canary under breakable prefill CUDA graphs
(``--cuda-graph-backend-prefill=breakable``, the setting ``install_canary``'s refusal of
piecewise prefill graphs names as the one to use), on the CPU: the batch the prefill graph
runner hands the canary.

Read in ``model_executor/runner/prefill_cuda_graph_runner.py`` (0.5.23), and held to it by
``tests/suite/test_sglang_prefill_graphs.py``:

- Under the breakable (and full) backend the runner captures the transformer body alone:
  ``_run_forward`` calls ``self.layer_model.forward``, the module that holds the decoder layers,
  which ``install_canary`` does not wrap (``_patch_model_forward`` wraps ``model.forward``, and
  the body only under prefill context parallelism). No canary op is in the graph.
- At each replay, ``_execute_body_capture`` swaps ``layer_model.forward`` for the graph's replay
  and calls the wrapped outer ``model.forward`` eagerly on ``static_forward_batch``: the canary's
  inside-the-graph ops run afresh on that batch, not on the scheduler's. The outside ops run on
  the live batch (``ModelRunner.forward``'s ``with_ops_outside_graph``).
- ``static_forward_batch`` is the ``ForwardBatch(...)`` that ``load_batch`` builds: only the
  fields its call passes (:func:`replay_keywords`), the token-axis slots (``input_ids``,
  ``positions``, ``out_cache_loc``) padded to the captured token count the batch rounds up to
  (``_pad_to_bucket``; the registry pads ``positions`` and ``out_cache_loc`` with 0 and leaves
  ``input_ids`` as the last replay left it), and a ``MIXED`` batch given the mode ``EXTEND``
  (the graphs are captured in ``EXTEND``).

:func:`replay_batch` makes that batch from the leg's live one; a ``ManagerRun`` whose
``prefill_graphs`` is set runs every ``EXTEND`` and ``MIXED`` forward on it. The captured token
counts are :data:`TOKEN_BUCKETS` (the leg's choice: a server's come from its CUDA graph config);
a forward of more tokens than the largest runs eagerly, as ``can_run_graph`` sends it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
from pathlib import Path

import torch

from conformance import upstream
from conformance.sglang import loading
from conformance.sglang.standins import ManagerBatchStandIn
from engine_model.vocabulary import EXTEND, MIXED

__all__ = [
    "RUNNER",
    "STALE_INPUT_ID",
    "TOKEN_BUCKETS",
    "bucket",
    "replay_batch",
    "replay_keywords",
    "runner_file",
    "why_not_modelled",
]

#: The prefill graph runner, below ``sglang/srt/``.
RUNNER = "model_executor/runner/prefill_cuda_graph_runner.py"
#: The token counts the leg's prefill graphs are captured at.
TOKEN_BUCKETS = (4, 8, 16, 32, 64)
#: What a padded ``input_ids`` slot holds: a value the last replay left (any token id).
STALE_INPUT_ID = 7


def runner_file() -> Path:
    """The installed release's prefill graph runner (``LookupError`` where it has none)."""
    path = loading.sglang_root() / "srt" / RUNNER
    if not path.is_file():
        raise LookupError(f"sglang {upstream.installed_version()} has no srt/{RUNNER}")
    return path


@functools.cache
def replay_keywords() -> frozenset[str]:
    """The fields ``load_batch``'s ``ForwardBatch(...)`` call passes (``LookupError`` where the
    runner has no such call)."""
    tree = ast.parse(runner_file().read_text())
    for function in ast.walk(tree):
        if isinstance(function, ast.FunctionDef) and function.name == "load_batch":
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "ForwardBatch":
                    return frozenset(k.arg for k in node.keywords if k.arg is not None)
    raise LookupError(f"srt/{RUNNER}: load_batch builds no ForwardBatch(...)")


def why_not_modelled() -> str | None:
    """Why the installed release's prefill graphs are not the ones this module models (None:
    they are): the runner's ``_run_forward`` must call ``self.layer_model.forward`` (the body
    alone captured), a replay must swap ``layer_model.forward`` and call
    ``self.model_runner.model.forward`` (the wrapped outer forward, eagerly), and
    ``install_canary`` must wrap ``model.forward`` (``kv_canary/api.py``)."""
    try:
        tree = ast.parse(runner_file().read_text())
        replay_keywords()
    except LookupError as error:
        return str(error)
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    run = [ast.unparse(f) for f in functions if f.name == "_run_forward"]
    if not run or "self.layer_model.forward(" not in run[0]:
        return f"srt/{RUNNER}: _run_forward does not capture the body alone (layer_model.forward)"
    if not any(
        "self.layer_model.forward = " in text and "self.model_runner.model.forward(" in text
        for text in (ast.unparse(f) for f in functions if f.name != "_run_forward")
    ):
        return f"srt/{RUNNER}: no replay calls the outer model.forward around the body's graph"
    api = (loading.sglang_root() / "srt" / "kv_canary" / "api.py").read_text()
    if 'wrap_method(model_runner.model, "forward"' not in api:
        return "srt/kv_canary/api.py: install_canary does not wrap model.forward"
    return None


def bucket(tokens: int) -> int | None:
    """The captured token count a forward of ``tokens`` tokens replays (None: none fits, it
    runs eagerly)."""
    return next((b for b in TOKEN_BUCKETS if b >= tokens), None)


def replay_batch(inside: ManagerBatchStandIn) -> ManagerBatchStandIn | None:
    """``static_forward_batch`` of the live batch ``inside`` (an ``EXTEND`` or ``MIXED`` one):
    the fields ``load_batch`` does not pass set to None, the token-axis fields padded to the
    bucket, the mode ``EXTEND`` (None: no bucket fits, the forward runs eagerly)."""
    tokens = int(inside.positions.shape[0])
    size = bucket(tokens)
    if size is None:
        return None
    passed = replay_keywords()
    pad = size - tokens

    def padded(tensor: torch.Tensor, value: int) -> torch.Tensor:
        return torch.cat([tensor, torch.full((pad,), value, dtype=tensor.dtype)])

    fields = {
        f.name: getattr(inside, f.name) if f.name in passed else None
        for f in dataclasses.fields(inside)
    }
    fields.update(
        forward_mode=loading.runtime().ForwardMode[EXTEND] if inside.forward_mode.name == MIXED
        else inside.forward_mode,
        input_ids=padded(inside.input_ids, STALE_INPUT_ID),
        positions=padded(inside.positions, 0),
        out_cache_loc=padded(inside.out_cache_loc, 0),
        batch_size=inside.batch_size,
    )  # fmt: skip
    return ManagerBatchStandIn(**fields)
