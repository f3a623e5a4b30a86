"""Whether SGLang's ``install_canary`` installs the canary in a serving configuration, or refuses
it, decided by SGLang's own code.

``install_canary`` (``srt/kv_canary/api.py``) runs in ``ModelRunner`` before the graphs are
captured: it refuses a piecewise prefill graph (an ``AssertionError``), a device without the
canary's CUDA kernels while decode graphs are on (``torch_reference_conflicts_with_decode_graph``,
a ``ValueError``), and a KV pool class no attacher is registered for
(``pool_patcher/api.py``'s ``attach_canary_buffers``, a ``NotImplementedError``); otherwise it
builds the buffer groups of the pool's attacher and the ``CanaryManager``. The module imports
SGLang's serving stack, so :func:`install` runs those functions from the installed release's
source (``install_canary``, ``torch_reference_conflicts_with_decode_graph``,
``attach_canary_buffers`` with its registry of attachers, the graph configuration's ``Phase``,
``Backend`` and ``check_cuda_graph_backend``, and ``use_torch_reference``), with stand-ins for
what a configuration decides:

- the server's configuration: the published CUDA graph configuration (``get_exec``), the
  speculative steps (``get_spec``), the disaggregation mode (``get_disagg``), and the canary's
  options (:data:`SERVER_OPTIONS`, ``--kv-canary log``, which SGLang's own
  ``CanaryConfig.from_env`` reads: :func:`conformance.sglang.loading.canary_config`);
- the model runner: its device, whether it is a draft worker, a pool of the class the
  configuration's model makes (an instance of a class of that name: the registry is looked up
  by the pool's exact class, as SGLang's is), its request pool and sizes;
- the pool: every attacher of the release's registry is SGLang's own (``pool_patcher/adapters``,
  run), on a pool of the configuration's shape (:func:`_pool`: its layers made as
  ``MHATokenToKVPool`` makes them, :func:`conformance.sglang.model_layers.layer_buffers`; for
  ``SWAKVPool`` and ``DeepSeekV4TokenToKVPool`` a full and an SWA sub-pool, the full one of
  ``full_layers`` layers); the pool's class and layers of a model architecture are SGLang's own
  choice (:func:`conformance.sglang.model_layers.pool_of`); an attacher that reads a field the
  stand-in pool lacks fails loudly (an ``AttributeError``), not quietly;
- what is built after the attachers: ``CanaryLaunchCapacities``, ``CanaryManager`` and the
  model's forward patch record their arguments.

A stand-in refuses nothing: every refusal :func:`install` reports is raised by SGLang's code,
and so is every other exception it reports (``raises``: an error that is not one of
``install_canary``'s own ``kv-canary:`` refusals).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import logging
import types
from dataclasses import dataclass
from pathlib import Path

import torch

from conformance.sglang import loading, model_layers

__all__ = ["Installed", "Refused", "Setting", "install", "kv_canary_dir"]

#: The pool classes SGLang's models make: an MHA model's, a hybrid SWA model's
#: (:mod:`conformance.sglang.model_layers`), an MLA model's.
MHA_POOL, SWA_POOL = model_layers.MHA_POOL, model_layers.SWA_POOL
MLA_POOL = "MLATokenToKVPool"
#: DeepSeek V4's pool, whose attacher (``attach_dsv4``) wires its SWA sub-pool alone.
DSV4_POOL = "DeepSeekV4TokenToKVPool"


@dataclass(frozen=True)
class Setting:
    """What decides ``install_canary``'s outcome in a serving configuration: the device (a GPU
    with the canary's CUDA kernels unless ``device`` says otherwise), each phase's CUDA graph
    backend (``Backend``'s values: ``full``, ``breakable``, ``disabled``, ``tc_piecewise``),
    the KV pool's class, whether the runner is EAGLE's draft worker, the speculative steps and
    the disaggregation mode."""

    decode_graph: str = "full"
    prefill_graph: str = "disabled"
    pool: str = MHA_POOL
    draft_worker: bool = False
    speculative_num_steps: int | None = None
    disaggregation_mode: str = "null"
    device: str = "cuda"
    #: the layers of the pool's full part (of ``SWAKVPool``'s full sub-pool; 0: a model whose
    #: every layer slides)
    full_layers: int = 1
    #: a model architecture whose pool SGLang's own code chooses (``pool`` and ``full_layers``
    #: then its choice: :func:`conformance.sglang.model_layers.pool_of`); empty: ``pool``
    architecture: str = ""


@dataclass(frozen=True)
class Installed:
    """The canary installed: its attacher and buffer groups (``PoolKind`` names), and the
    arguments of its ``CanaryManager`` that a configuration decides."""

    attacher: str
    groups: tuple[str, ...]
    swa_window_size: int
    speculative_num_steps: int
    is_eagle_draft_decode: bool
    kv_token_id_vs_position_offset: int

    def __str__(self) -> str:
        return f"installs ({'+'.join(self.groups)})"


@dataclass(frozen=True)
class Refused:
    """The canary refused: the exception SGLang's code raised, its type and message."""

    error: str
    message: str

    def __str__(self) -> str:
        verb = "refuses" if self.message.startswith("kv-canary") else "raises"
        return f"{verb}: {self.error}: {self.message}"


def kv_canary_dir() -> Path:
    return loading.sglang_root() / "srt" / "kv_canary"


def _registry(api_file: Path) -> dict[str, str]:
    """``_POOL_ATTACHERS`` of ``pool_patcher/api.py``: pool class name to attacher name."""
    for node in ast.parse(api_file.read_text()).body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if getattr(target, "id", "") == "_POOL_ATTACHERS" and isinstance(node.value, ast.Dict):
            return {
                key.id: value.id
                for key, value in zip(node.value.keys, node.value.values)
                if isinstance(key, ast.Name) and isinstance(value, ast.Name)
            }
    raise LookupError(f"{api_file}: no _POOL_ATTACHERS")


def _attacher(name: str):
    """The registry's attacher ``name``, SGLang's own (``pool_patcher/adapters``), run on the
    stand-in pool with its buffers allocated on the CPU rather than on the device."""
    loading.manager_modules()
    for package in ("pool_patcher", "pool_patcher.adapters"):
        loading.register_package(f"{loading.KV_CANARY}.{package}")
    module = f"{loading.KV_CANARY}.pool_patcher.adapters.{name.removeprefix('attach_')}"
    sglang_s = getattr(importlib.import_module(module), name)

    def on_the_cpu(*, device, **kwargs):
        return sglang_s(device=torch.device("cpu"), **kwargs)

    on_the_cpu.__name__ = name
    return on_the_cpu


def _recorder(**kwargs) -> types.SimpleNamespace:
    return types.SimpleNamespace(**kwargs)


def _graph_scope(srt: Path, setting: Setting, source: str) -> dict:
    """``Phase``, ``Backend`` and ``check_cuda_graph_backend`` of the release's
    ``cuda_graph_config.py``, over the setting's backends as the published configuration (from
    0.5.18; up to 0.5.17 the server args' and the global server args' configuration); none
    where ``install_canary`` reads no such configuration."""
    graph: dict = {}
    if "check_cuda_graph_backend" not in source:
        return graph
    graph_file = srt / "model_executor" / "cuda_graph_config.py"
    loading.from_source(graph_file, ("Phase", "Backend"), graph)
    published = types.SimpleNamespace(
        decode=types.SimpleNamespace(backend=setting.decode_graph),
        prefill=types.SimpleNamespace(backend=setting.prefill_graph),
    )
    graph["get_exec"] = lambda: types.SimpleNamespace(
        graph=types.SimpleNamespace(cuda_graph_config=published)
    )
    graph["get_global_server_args"] = graph["get_server_args"] = lambda: types.SimpleNamespace(
        cuda_graph_config=published
    )
    loading.from_source(graph_file, ("check_cuda_graph_backend",), graph, scope_imports=True)
    return {k: graph[k] for k in ("Phase", "Backend", "check_cuda_graph_backend")}


def _kernel_scope(srt: Path, source: str) -> dict:
    """The release's ``use_torch_reference``, where ``install_canary`` asks it."""
    if "use_torch_reference" not in source:
        return {}
    dispatch = srt.parent / "kernels" / "ops" / "kv_canary" / "_dispatch.py"
    return {"use_torch_reference": loading.from_source(
        dispatch, ("use_torch_reference",), {"torch": torch})["use_torch_reference"]}  # fmt: skip


def _patcher(root: Path) -> tuple[dict[str, str], dict[str, type], object]:
    """The registry of attachers (pool class name to attacher name), a stand-in class of each
    registered name, and ``attach_canary_buffers`` run from its source over them."""
    patcher_file = root / "pool_patcher" / "api.py"
    registry = _registry(patcher_file)
    pool_classes = {name: type(name, (), {}) for name in registry}
    attachers = {attacher: _attacher(attacher) for attacher in set(registry.values())}
    scope = loading.from_source(
        patcher_file,
        ("attach_canary_buffers",),
        {
            "_POOL_ATTACHERS": {pool_classes[c]: attachers[a] for c, a in registry.items()},
            "resolve_real_kv_read_bytes": importlib.import_module(
                f"{loading.KV_CANARY}.pool_patcher.buffer_alloc"
            ).resolve_real_kv_read_bytes,
            "logger": logging.getLogger("kv_canary.install"),
        },
    )
    return registry, pool_classes, scope["attach_canary_buffers"]


#: The server's canary options of ``--kv-canary log`` (the others SGLang's defaults).
SERVER_OPTIONS = {"kv_canary": "log", "kv_canary_real_data": "none", "kv_canary_sweep_interval": 0}


def _install_scope(setting: Setting, attach) -> dict:
    """The names ``install_canary`` reads besides SGLang's functions run from source: the
    server's configuration of ``setting``, and recorders for what it builds."""
    config = loading.manager_modules().config
    spec = types.SimpleNamespace(speculative_num_steps=setting.speculative_num_steps)
    disagg = types.SimpleNamespace(disaggregation_mode=setting.disaggregation_mode)
    return {
        "torch": torch,
        "logger": logging.getLogger("kv_canary.install"),
        "current_platform": types.SimpleNamespace(
            capabilities=types.SimpleNamespace(graph_capture=True)
        ),
        # SGLang's own, over the options of ``--kv-canary log`` (the others their defaults)
        "CanaryConfig": types.SimpleNamespace(
            from_env=lambda server_args: loading.canary_config(
                config, options=SERVER_OPTIONS, env={}
            )
        ),
        "CanaryMode": config.CanaryMode,
        "PerturbConfig": types.SimpleNamespace(from_env=lambda: types.SimpleNamespace()),
        "attach_canary_buffers": attach,
        "SWATokenToKVPoolAllocator": type("SWATokenToKVPoolAllocator", (), {}),
        "CanaryLaunchCapacities": types.SimpleNamespace(from_args=_recorder),
        "CanaryManager": _recorder,
        "_patch_model_forward": lambda **kwargs: None,
        "get_spec": lambda: spec,
        "get_disagg": lambda: disagg,
        "get_parallel": lambda: types.SimpleNamespace(),
    }


def _pool(setting: Setting, pool_class: type):
    """A pool of ``pool_class`` (a stand-in class of its name) with the fields the attachers
    read: its layers' K and V buffers, its page size and buffer-info methods; for
    ``SWAKVPool`` and ``DeepSeekV4TokenToKVPool`` a full sub-pool of ``setting.full_layers``
    layers, an SWA sub-pool of one and the full-to-SWA table."""

    def part(layers: int) -> types.SimpleNamespace:
        k, v = model_layers.layer_buffers(layers)
        return types.SimpleNamespace(k_buffer=k, v_buffer=v, page_size=1, size=16)

    pool = pool_class()
    pool.page_size = 1
    pool.get_contiguous_buf_infos = pool.get_state_buf_infos = lambda: ([], [], [])
    if setting.pool in (SWA_POOL, DSV4_POOL):
        pool.full_kv_pool, pool.swa_kv_pool = part(setting.full_layers), part(1)
        pool.full_to_swa_index_mapping = torch.zeros(17, dtype=torch.int64)
    else:
        whole = part(setting.full_layers)
        pool.k_buffer, pool.v_buffer = whole.k_buffer, whole.v_buffer
    return pool


def _runner(setting: Setting, pool_class: type) -> types.SimpleNamespace:
    """A model runner of ``setting``: its device, role, pool and sizes, and the server args a
    release up to 0.5.17 reads the options from."""
    server_args = types.SimpleNamespace(
        disable_piecewise_cuda_graph=setting.prefill_graph != "tc_piecewise",
        disable_cuda_graph=setting.decode_graph == "disabled",
        speculative_num_steps=setting.speculative_num_steps,
        disaggregation_mode=setting.disaggregation_mode,
    )
    return types.SimpleNamespace(
        server_args=server_args,
        device=setting.device,
        is_draft_worker=setting.draft_worker,
        token_to_kv_pool=_pool(setting, pool_class),
        token_to_kv_pool_allocator=object(),
        req_to_token_pool=types.SimpleNamespace(
            size=8, req_to_token=torch.zeros(9, 16, dtype=torch.int32), max_context_len=16
        ),
        max_total_num_tokens=96,
        sliding_window_size=None,
    )


def install(setting: Setting, root: Path | None = None) -> Installed | Refused:
    """``install_canary`` of the installed release (or of the ``srt/kv_canary`` folder
    ``root``) run from its source in ``setting``: what it installs, or the exception it
    raises."""
    root = root or kv_canary_dir()
    if setting.architecture:
        setting = dataclasses.replace(setting, **model_layers.pool_of(setting.architecture))
    source = (root / "api.py").read_text()
    registry, pool_classes, attach = _patcher(root)
    scope = _install_scope(setting, attach)
    scope.update(_graph_scope(root.parent, setting, source))
    scope.update(_kernel_scope(root.parent, source))
    names = ["install_canary"]
    if "def torch_reference_conflicts_with_decode_graph" in source:
        names.append("torch_reference_conflicts_with_decode_graph")
    loading.from_source(root / "api.py", tuple(names), scope)
    runner = _runner(setting, pool_classes.get(setting.pool) or type(setting.pool, (), {}))
    try:
        manager = scope["install_canary"](
            server_args=runner.server_args, model_runner=runner, token_oracle_manager=None
        )
    except (AssertionError, ValueError, NotImplementedError, RuntimeError, IndexError) as error:
        return Refused(type(error).__name__, str(error))
    groups = manager.buffer_groups
    return Installed(
        attacher=registry[setting.pool],
        groups=tuple(g.kind.name for g in groups),
        swa_window_size=manager.swa_window_size,
        speculative_num_steps=manager.speculative_num_steps,
        is_eagle_draft_decode=manager.is_eagle_draft_decode,
        kv_token_id_vs_position_offset=getattr(
            groups[0], "kv_token_id_vs_position_offset", getattr(groups[0], "offset", 0)
        ),
    )
