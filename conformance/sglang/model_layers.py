"""Which KV pool SGLang makes for a model and how many layers each part has, decided by its own
code: ``is_hybrid_swa_model`` and ``get_hybrid_layer_ids`` of ``configs/model_config.py``
(whose module imports the serving stack), run from the installed release's source with the
module's architecture lists (``MIMO_V2_MODEL_ARCHS``, ``SWA_SINK_ARCHS``) on a stand-in of the
model's Hugging Face text config.

A model SGLang calls hybrid SWA is served on ``SWAKVPool`` where ``--enable-unified-memory`` is
off by default (:func:`unified_memory_by_default`, read from the release's server options; the
pool classes of ``kv_cache_configurator.py`` read, not run), on its unified pool otherwise; the
full sub-pool made with one layer per full attention layer and the SWA sub-pool with one per
sliding layer; any other model on ``MHATokenToKVPool``, its window (if any) applied by the
attention backend alone. Layers of the
sub-pools are made as ``MHATokenToKVPool._create_buffers_normal`` makes them (:func:`layer_buffers`,
run from source where the release has it)."""

from __future__ import annotations

import ast
import contextlib
import types

import torch

from conformance.sglang import loading

__all__ = ["MHA_POOL", "SWA_POOL", "layer_buffers", "pool_of", "unified_memory_by_default"]

MODEL_CONFIG = "srt/configs/model_config.py"
MEMORY_POOL = "srt/mem_cache/memory_pool.py"
#: The module-level names the two functions read.
_CONSTANTS = ("MIMO_V2_MODEL_ARCHS", "SWA_SINK_ARCHS")
#: The stand-in config's layers.
LAYERS = 4
#: The pool classes SGLang's models make: an MHA model's, a hybrid SWA model's.
MHA_POOL = "MHATokenToKVPool"
SWA_POOL = "SWAKVPool"


def _constants(path) -> dict:
    """The module's architecture lists, executed from their assignments in its source."""
    tree = ast.parse(path.read_text())
    body = [
        n
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", "") in _CONSTANTS for t in n.targets)
    ]
    scope: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), scope)
    return scope


def layer_ids(architecture: str, root=None, **config) -> tuple[list[int], list[int]] | None:
    """``(swa_attention_layer_ids, full_attention_layer_ids)`` of a model of ``architecture``
    (``config``: fields of its text config besides ``num_hidden_layers``, :data:`LAYERS`), or
    None where SGLang does not call it hybrid SWA (``root``: another ``sglang`` folder)."""
    path = (loading.sglang_root() if root is None else root) / MODEL_CONFIG
    scope = _constants(path)
    loading.from_source(path, ("is_hybrid_swa_model", "get_hybrid_layer_ids"), scope)
    text_config = types.SimpleNamespace(num_hidden_layers=LAYERS, **config)
    if not scope["is_hybrid_swa_model"]([architecture], text_config):
        return None
    swa, full = scope["get_hybrid_layer_ids"]([architecture], text_config)
    return list(swa or []), list(full or [])


def unified_memory_by_default(root=None) -> bool:
    """Whether the release serves hybrid models on its unified memory pool by default: the
    default of ``enable_unified_memory`` in ``arg_groups/fields/memory.py`` (a release without
    that file, up to 0.5.19, has no unified pool)."""
    path = (loading.sglang_root() if root is None else root) / "srt/arg_groups/fields/memory.py"
    if not path.is_file():
        return False
    text = path.read_text()
    at = text.find("enable_unified_memory: A[")
    return at >= 0 and text[text.index("] = ", at) :].startswith("] = True")


def pool_of(architecture: str, root=None, **config) -> dict:
    """The ``Setting`` fields of the pool SGLang makes for a model of ``architecture``: the
    class, and for ``SWAKVPool`` its full sub-pool's layers."""
    ids = layer_ids(architecture, root, **config)
    if ids is None:
        return {"pool": MHA_POOL}
    if unified_memory_by_default(root):
        return {"pool": "UnifiedSWAKVPool", "full_layers": len(ids[1])}
    return {"pool": SWA_POOL, "full_layers": len(ids[1])}


def layer_buffers(layers: int, slots: int = 16, row_bytes: int = 16) -> tuple[list, list]:
    """``k_buffer`` and ``v_buffer`` of an ``MHATokenToKVPool`` of ``layers`` layers and
    ``slots`` slots of ``row_bytes`` bytes, made by its ``_create_buffers_normal`` run from
    source over a stand-in of the fields it reads (a release without it: one buffer a layer,
    as every release's pool makes them, read)."""
    path = loading.sglang_root() / MEMORY_POOL
    scope = {
        "torch": torch,
        "nullcontext": contextlib.nullcontext,
        "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "ceil_align": lambda n, k: -(-n // k) * k,
    }
    try:
        make = loading.methods_from_source(
            path, "MHATokenToKVPool", ("_create_buffers_normal",), scope
        )["_create_buffers_normal"]
    except LookupError:
        k = [torch.zeros(slots, row_bytes, dtype=torch.uint8) for _ in range(layers)]
        return k, [b.clone() for b in k]
    pool = types.SimpleNamespace(
        memory_saver_adapter=types.SimpleNamespace(region=lambda *a: contextlib.nullcontext()),
        enable_custom_mem_pool=False, custom_mem_pool=None, kv_cache_layout="nhd",
        _kv_buffer_shapes=lambda: ((slots, row_bytes), (slots, row_bytes)),
        store_dtype=torch.uint8, device="cpu", use_hnd=False, page_size=1, layer_num=layers,
    )  # fmt: skip
    make(pool)
    return pool.k_buffer, pool.v_buffer
