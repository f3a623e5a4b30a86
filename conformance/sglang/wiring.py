"""What SGLang's model runner gives each runner's canary, decided by SGLang's own code: whether a
runner (the target model's, or EAGLE's draft model's) gets a token oracle manager, and so
whether its canary can run with the write's input assert on.

``ModelRunner.init_token_oracle`` (``srt/model_executor/model_runner.py``) sets the runner's
``_token_oracle_manager``, which ``install_canary`` hands to its ``CanaryManager``; from
0.5.18 it gives a draft worker none ("the oracle sampler is process-wide"). Releases up to
0.5.15 have no such method: ``ModelRunner.initialize`` installs it for every runner.
:func:`runner_gets_token_oracle` runs the installed release's method from its source on a
stand-in runner (the module imports SGLang's serving stack), with ``install_token_oracle_from_env``
returning a manager, as it does with the ``token_oracle`` sampling backend that the input
assert needs; on a release without the method it requires a method of ``ModelRunner`` to call
``install_token_oracle_from_env`` under no branch.

A draft model's ``SingleForwardManager`` without an oracle raises ``RuntimeError`` at its first
launch with the input assert on that is not a decode (the divergence [22] of
``docs/UPSTREAM.md``): a server with EAGLE on serves only with the input assert off. The
per-forward leg gives each manager what this says, and runs the draft model's histories in the
configuration SGLang serves (:func:`servable`).

The draft model's runner holds the target worker's request pool and KV allocator
(:func:`draft_runner_pools`, the server's pool allocation run from source): the one page table
and allocator that the engine model's separate draft engine departs from (CONTRACT §15).
"""

from __future__ import annotations
import __future__

import ast
import dataclasses
import functools
import types
from pathlib import Path

from conformance.sglang import loading
from engine_model import EngineConfig

__all__ = [
    "draft_runner_pools",
    "model_runner_file",
    "radix_cache_owner",
    "runner_gets_token_oracle",
    "scheduler_file",
    "eagle_input_assert",
    "servable",
]


def model_runner_file() -> Path:
    return loading.sglang_root() / "srt" / "model_executor" / "model_runner.py"


def _model_runner(tree: ast.Module) -> ast.ClassDef:
    return next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelRunner")


@functools.cache
def runner_gets_token_oracle(is_draft_worker: bool, path: Path | None = None) -> bool:
    """Whether SGLang's ``ModelRunner`` (of ``path``, by default the installed release's) leaves a
    runner (a draft worker's, or the target model's) a token oracle manager when the
    ``token_oracle`` sampling backend is on."""
    path = path or model_runner_file()
    runner_class = _model_runner(ast.parse(path.read_text()))
    methods = {n.name: n for n in runner_class.body if isinstance(n, ast.FunctionDef)}
    if "init_token_oracle" not in methods:  # a release up to 0.5.15
        unconditional = [
            name
            for name, method in methods.items()
            for statement in method.body  # a statement of the method itself, under no branch
            for node in ast.walk(statement)
            if not isinstance(statement, (ast.If, ast.For, ast.While, ast.Try, ast.With))
            and isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "install_token_oracle_from_env"
        ]
        if not unconditional:
            raise LookupError(f"{path}: ModelRunner installs no token oracle for every runner")
        return True  # installed by a method every runner runs (``initialize``)
    method = methods["init_token_oracle"]
    method.decorator_list = []
    installed = object()
    scope: dict = {"install_token_oracle_from_env": lambda **kwargs: installed}
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=[method], type_ignores=[]), str(path), "exec", flags=flags), scope)
    runner = types.SimpleNamespace(
        is_draft_worker=is_draft_worker,
        model_config=types.SimpleNamespace(vocab_size=2),
        server_args=types.SimpleNamespace(),
    )
    scope["init_token_oracle"](runner)
    return runner._token_oracle_manager is installed


def eagle_input_assert() -> bool:
    """Whether an EAGLE server with CUDA graphs can run the write's input assert: its draft
    worker's runner gets a token oracle (else the draft's first write raises, [22]), and the
    draft extend graph runner's capture batch carries the request ids the oracle reads (up to
    0.5.17 it does not, and the capture raises at startup, [28]); both read from the release's
    source (:func:`runner_gets_token_oracle`, ``graphs.capture_keywords``)."""
    from conformance.sglang import graphs

    return runner_gets_token_oracle(True) and "rids_int" in graphs.capture_keywords(
        graphs.DRAFT_EXTEND_RUNNER
    )


def servable(config: EngineConfig, eagle: bool | None = None) -> EngineConfig:
    """``config`` as a server runs it: under EAGLE (``eagle``; by default, the draft model's
    engine, the EAGLE offset) the write's input assert only where such a server can run it
    (:func:`eagle_input_assert`; the setting is the server's, one for both models: [22],
    [28]), and the draft model's without a sweep of the prefix cache (SGLang's scheduler
    attaches its radix cache to the target model's canary alone, :func:`radix_cache_owner`);
    without EAGLE as it is."""
    if eagle is None:
        eagle = config.offset == 1
    if not eagle:
        return config
    served = dataclasses.replace(config, write_input_assert=eagle_input_assert())
    if config.offset != 1:
        return served
    return dataclasses.replace(served, cache_swept=radix_cache_owner() != TARGET_RUNNER_MANAGER)


#: The scheduler's target model runner's canary manager (its ``tp_worker`` runs the target).
TARGET_RUNNER_MANAGER = ("self", "tp_worker", "model_runner", "canary_manager")


def scheduler_file() -> Path:
    return loading.sglang_root() / "srt" / "managers" / "scheduler.py"


@functools.cache
def radix_cache_owner(path: Path | None = None) -> tuple[str, ...]:
    """Whose canary manager SGLang's scheduler (of ``path``, by default the installed
    release's) attaches its radix cache to, as the attribute chain of every
    ``attach_radix_cache`` call's owner: ``("self", "tp_worker", "model_runner",
    "canary_manager")`` is the target model's runner's (the scheduler's ``tp_worker``), the
    only one a release attaches to."""
    tree = ast.parse((path or scheduler_file()).read_text())
    owners = set()
    aliases: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            aliases[node.target.id] = _chain(node.value)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                aliases[target.id] = _chain(node.value)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "attach_radix_cache"
        ):
            chain = _chain(node.func.value)
            owners.add(aliases.get(chain[0], chain) if len(chain) == 1 else chain)
    if len(owners) != 1:
        raise LookupError(f"the scheduler attaches radix caches to {sorted(owners)}")
    return owners.pop()


def _chain(node: ast.AST) -> tuple[str, ...]:
    """``self.a.b`` as ``("self", "a", "b")`` (empty for anything else)."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ()
    return (node.id, *reversed(parts))


def _bound(path: Path, cls: str, name: str, scope: dict, **fields) -> types.SimpleNamespace:
    """A stand-in of class ``cls`` holding ``fields``, with its method ``name`` from SGLang's
    file ``path`` (run from source in ``scope``) bound to it."""
    method = loading.methods_from_source(path, cls, (name,), scope)[name]
    standin = types.SimpleNamespace(**fields)
    setattr(standin, name, types.MethodType(method, standin))
    return standin


def draft_runner_pools(draft_worker: str = "EagleDraftWorker") -> tuple[bool, bool]:
    """Whether the draft model's runner holds the target worker's request pool, and its KV
    allocator, once an EAGLE server has allocated its pools: SGLang's ``Scheduler.init_memory_pools``
    (``managers/scheduler.py``), ``BaseSpecWorker.alloc_memory_pool``
    (``speculative/base_spec_worker.py``), ``EagleDraftWorker.alloc_memory_pool``
    (``speculative/eagle_worker_v2.py``; ``draft_worker``: another class of those files in its
    place) and ``TpModelWorker.alloc_memory_pool`` (``managers/tp_worker.py``), run from
    source over stand-in workers and runners holding the fields they read. The target worker's
    pool and allocator are the objects ``get_memory_pool`` returns; whatever else each method
    allocates, sizes or checks is a no-op stand-in."""
    srt = loading.sglang_root() / "srt"
    speculative = srt / "speculative"
    spec = types.SimpleNamespace(speculative_use_rejection_sampling=False)
    scope: dict = {
        "get_spec": lambda: spec,
        "kv_cache_builder": types.SimpleNamespace(resolve_decode_retraction_backup=lambda **_: None),
    }  # fmt: skip
    runner = types.SimpleNamespace(
        alloc_memory_pool=lambda *a, **k: None, max_running_requests=1,
        effective_logical_max_total_num_tokens=2, req_to_token_pool=None,
        token_to_kv_pool_allocator=None,
    )  # fmt: skip
    tp_worker = _bound(
        srt / "managers" / "tp_worker.py", "TpModelWorker", "alloc_memory_pool", scope,
        model_runner=runner, model_runner_list=[runner],
        model_config=types.SimpleNamespace(context_len=2),
    )  # fmt: skip
    file = speculative / ("eagle_worker_v2.py" if draft_worker == "EagleDraftWorker" else "base_spec_worker.py")  # fmt: skip
    eagle_draft = _bound(
        file, draft_worker, "alloc_memory_pool", scope, draft_worker=tp_worker,
        init_token_map=lambda: None, init_lm_head=lambda: None,
    )  # fmt: skip
    spec_worker = _bound(
        speculative / "base_spec_worker.py", "BaseSpecWorker", "alloc_memory_pool", scope,
        draft_worker=eagle_draft, init_hicache_draft_plan=lambda: None,
    )  # fmt: skip
    target_pools = (object(), object())
    target = types.SimpleNamespace(
        get_memory_pool=lambda: target_pools,
        model_runner=types.SimpleNamespace(memory_pool_config=None),
    )
    scheduler = _bound(
        scheduler_file(), "Scheduler", "init_memory_pools", scope,
        init_target_memory_pool=lambda: None, tp_worker=target, draft_worker=spec_worker,
    )  # fmt: skip
    scheduler.init_memory_pools()
    return (
        runner.req_to_token_pool is target_pools[0],
        runner.token_to_kv_pool_allocator is target_pools[1],
    )
