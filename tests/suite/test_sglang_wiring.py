"""The per-forward leg wires each runner's canary as SGLang's model runner does
(``conformance.sglang.wiring``): the token oracle its ``ModelRunner.init_token_oracle`` gives
a runner, decided by that code run from source; a draft model's manager without one, and the
draft model's engine run with the input assert off; and the ``RuntimeError`` of [22] shown."""

from __future__ import annotations

import textwrap

import pytest

from conformance import engine_support, upstream
from conformance.sglang import histories, manager_run, wiring
from engine_model import Engine, EngineConfig
from engine_model.faults import Due
from engine_model.vocabulary import SWEEP_STEP

RUNNER = """\
class ModelRunner:
    def __init__(self):
        self.is_draft_worker = False

{methods}
"""

#: ``ModelRunner`` methods as releases write them, and what each leaves (target, draft)
VARIANTS = {
    "every runner (0.5.16)": (
        "def init_token_oracle(self):\n"
        "    self._token_oracle_manager = install_token_oracle_from_env(\n"
        "        server_args=self.server_args, vocab_size=self.model_config.vocab_size)\n",
        (True, True),
    ),
    "no draft worker (0.5.18)": (
        "def init_token_oracle(self):\n"
        "    if self.is_draft_worker:\n"
        "        self._token_oracle_manager = None\n"
        "        return\n"
        "    self._token_oracle_manager = install_token_oracle_from_env(\n"
        "        vocab_size=self.model_config.vocab_size)\n",
        (True, False),
    ),
    "in initialize (0.5.13)": (
        "def initialize(self):\n"
        "    self.x = 1\n"
        "    self._token_oracle_manager = install_token_oracle_from_env(vocab_size=2)\n",
        (True, True),
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_token_oracle_is_what_the_runners_own_code_gives(tmp_path, variant):
    methods, want = VARIANTS[variant]
    path = tmp_path / "model_runner.py"
    path.write_text(RUNNER.format(methods=textwrap.indent(methods, "    ")))
    got = tuple(wiring.runner_gets_token_oracle(draft, path) for draft in (False, True))
    assert got == want


@pytest.mark.parametrize(
    "methods",
    [
        "def initialize(self):\n    pass\n",
        "def initialize(self):\n    if self.is_draft_worker:\n"
        "        self.m = install_token_oracle_from_env(vocab_size=2)\n",
    ],
    ids=["no oracle installed", "installed under a branch"],
)
def test_a_runner_that_installs_no_oracle_for_every_runner_is_not_guessed(tmp_path, methods):
    path = tmp_path / "model_runner.py"
    path.write_text(RUNNER.format(methods=textwrap.indent(methods, "    ")))
    with pytest.raises(LookupError, match="installs no token oracle"):
        wiring.runner_gets_token_oracle(True, path)


def test_the_target_models_runner_gets_the_oracle_on_the_installed_release():
    assert wiring.runner_gets_token_oracle(False)


def test_the_draft_models_manager_has_the_oracle_its_runner_gets_and_runs_servable():
    """A draft model's engine as the leg runs it: its managers hold the token oracle its
    runner gets, and where that is none its input assert is off in every forward."""
    has = wiring.runner_gets_token_oracle(True)
    config = wiring.servable(histories.engine_config(6, eagle_offset=1))
    assert config.write_input_assert == wiring.eagle_input_assert()
    assert not config.cache_swept
    side = manager_run.run_history(6, steps=8)
    assert side.managers, "no forward ran"
    for key, manager in side.managers.items():
        assert key[3]  # the draft model's
        assert (manager._token_oracle_manager is not None) == has
    target = wiring.servable(histories.engine_config(0, eagle_offset=0))
    assert target.write_input_assert


@pytest.mark.parametrize("oracle", [True, False])
@pytest.mark.parametrize("rids", [True, False])
def test_an_eagle_server_runs_the_input_assert_only_where_it_can_start(monkeypatch, oracle, rids):
    """The assert is on under EAGLE only where the draft's runner gets a token oracle ([22])
    and the draft extend graph's capture batch carries the request ids it reads ([28]); on
    the installed release the capture's fields are read from its source."""
    from conformance.sglang import graphs

    keywords = graphs.capture_keywords(graphs.DRAFT_EXTEND_RUNNER)
    assert wiring.eagle_input_assert() == (
        wiring.runner_gets_token_oracle(True) and "rids_int" in keywords
    )
    with_rids = keywords | {"rids_int"} if rids else keywords - {"rids_int"}
    monkeypatch.setattr(wiring, "runner_gets_token_oracle", lambda draft: oracle)
    monkeypatch.setattr(graphs, "capture_keywords", lambda runner: with_rids)
    assert wiring.eagle_input_assert() == (oracle and rids)
    served = wiring.servable(histories.engine_config(6, eagle_offset=1))
    assert served.write_input_assert == (oracle and rids)


def test_an_engine_without_the_input_assert_expects_no_inputs():
    engine = Engine(EngineConfig(write_input_assert=False, seed=3))
    engine.admit(3)
    forward = engine.prefill(3)
    assert forward is not None
    assert not forward.write["enable_write_input_assert"]
    assert forward.write["expected_input_tokens"] is None
    with pytest.raises(ValueError, match="write_input_assert and cache_swept must be bools"):
        EngineConfig(write_input_assert=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="write_input_assert and cache_swept must be bools"):
        EngineConfig(cache_swept=0)  # type: ignore[arg-type]


def test_the_draft_models_canary_with_the_input_assert_on_is_as_its_release_runs_it():
    """[22]: with the input assert on and the draft's runner without an oracle, SGLang's
    runtime raises at the draft model's first forward that is not a decode; where [22]'s
    script does not reproduce, the history runs through."""
    refusal = manager_run.draft_input_assert_refusal()
    expected = upstream.reproduces_on(22, upstream.installed_version())
    assert (refusal is not None) == bool(expected), refusal
    if refusal is not None:
        assert "enable_write_input_assert=True requires a TokenOracleManager" in refusal


SCHEDULER = """\
class Scheduler:
    def init(self):
{body}
"""


@pytest.mark.parametrize(
    ("body", "owner"),
    [
        ("if (c := self.tp_worker.model_runner.canary_manager) is not None:\n"
         "    c.attach_radix_cache(self.tree_cache)",
         wiring.TARGET_RUNNER_MANAGER),
        ("m = self.draft_worker.model_runner.canary_manager\nm.attach_radix_cache(self.tree_cache)",
         ("self", "draft_worker", "model_runner", "canary_manager")),
    ],
    ids=["the target's (every release)", "the draft's"],
)  # fmt: skip
def test_the_radix_cache_goes_where_the_schedulers_code_attaches_it(tmp_path, body, owner):
    path = tmp_path / "scheduler.py"
    path.write_text(SCHEDULER.format(body=textwrap.indent(body, " " * 8)))
    assert wiring.radix_cache_owner(path) == owner
    bare = tmp_path / "scheduler_without_an_attach.py"
    bare.write_text(SCHEDULER.format(body="        pass"))
    with pytest.raises(LookupError, match="attaches radix caches to"):
        wiring.radix_cache_owner(bare)


def test_the_draft_models_canary_is_never_swept():
    """SGLang's scheduler attaches its radix cache to the target model's canary alone (the
    installed release's code says so): a draft model's engine as the leg runs it sweeps nothing,
    its history has no sweep step, and no due a sweep could meet is promised there."""
    assert wiring.radix_cache_owner() == wiring.TARGET_RUNNER_MANAGER
    config = wiring.servable(histories.engine_config(6, eagle_offset=1))
    engine = Engine(config)
    engine.admit(3)
    engine.prefill(3)
    engine.cache_prefix(next(iter(engine.running.values())))
    assert engine.cache and engine.sweep() is None
    side = manager_run.run_history(6, steps=20)
    assert str(SWEEP_STEP) not in side.step_counts
    sweep_tag = int(engine_support.TAGS[("FULL", "SWEEP")])
    tail_tag = int(engine_support.TAGS[("FULL", "TAIL")])
    dues = [Due(3, 1, tags=frozenset({sweep_tag})), Due(4, 1, tags=frozenset({tail_tag}))]
    assert engine_support.swept_dues(engine, dues) == dues[1:]
    assert engine_support.swept_dues(Engine(EngineConfig()), dues) == dues


def test_the_draft_model_s_runner_holds_the_target_s_page_table_and_allocator():
    """SGLang's EAGLE server gives the draft model's runner the target worker's request pool
    (its page table) and KV allocator (``Scheduler.init_memory_pools`` down to
    ``TpModelWorker.alloc_memory_pool``, run from source): the sharing CONTRACT §15's named
    choice departs from. Able to fail: with the base draft worker's ``alloc_memory_pool`` (it
    passes nothing on) in the chain, the runner holds neither."""
    assert wiring.draft_runner_pools() == (True, True)
    assert wiring.draft_runner_pools("EagleDraftWorkerBase") == (False, False)
