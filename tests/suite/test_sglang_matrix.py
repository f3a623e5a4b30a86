"""The support matrix (``conformance/sglang/matrix.py``, ``docs/SUPPORT.md``) and SGLang's
``install_canary`` run from its source (``conformance/sglang/install.py``)."""

from __future__ import annotations

import ast
import shutil

import pytest

from conformance.sglang import histories, install, loading, matrix
from engine_model import Engine


def test_install_canary_refuses_what_sglang_refuses_and_installs_the_rest():
    """Each refusal is SGLang's own exception and message; the groups are the attacher's."""
    refused = install.install(install.Setting(prefill_graph="tc_piecewise"))
    assert isinstance(refused, install.Refused) and refused.error == "AssertionError"
    assert "piecewise" in refused.message
    refused = install.install(install.Setting(pool=install.MLA_POOL))
    assert isinstance(refused, install.Refused) and refused.error == "NotImplementedError"
    assert install.MLA_POOL in refused.message
    assert install.install(install.Setting()) == install.Installed(
        attacher="attach_mha", groups=("FULL",), swa_window_size=0, speculative_num_steps=1,
        is_eagle_draft_decode=False, kv_token_id_vs_position_offset=0,
    )  # fmt: skip
    swa = install.install(install.Setting(pool=install.SWA_POOL))
    assert isinstance(swa, install.Installed) and swa.groups == ("FULL", "SWA")
    draft = install.install(install.Setting(draft_worker=True, speculative_num_steps=3))
    assert isinstance(draft, install.Installed)
    assert (draft.kv_token_id_vs_position_offset, draft.speculative_num_steps) == (1, 3)
    assert draft.is_eagle_draft_decode


def _copy_of_install_sources(tmp_path):
    """The files :func:`install.install` reads, copied under ``tmp_path`` as a release lays
    them out: its ``srt/kv_canary`` folder there."""
    root = loading.sglang_root()
    for relative in (
        "srt/kv_canary/api.py",
        "srt/kv_canary/pool_patcher",
        "srt/model_executor/cuda_graph_config.py",
        "kernels/ops/kv_canary/_dispatch.py",
    ):
        source, target = root / relative, tmp_path / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copy(source, target)
    return tmp_path / "srt" / "kv_canary"


def test_the_outcome_is_the_release_source_s(tmp_path):
    """Able to fail: a release whose install_canary had no piecewise assert would install,
    and one whose registry named the MLA pool would attach it; nothing in the stand-ins
    refuses."""
    root = _copy_of_install_sources(tmp_path)
    api = root / "api.py"
    text = api.read_text()
    assert "assert not check_cuda_graph_backend(Phase.PREFILL, Backend.TC_PIECEWISE)" in text
    api.write_text(text.replace(
        "assert not check_cuda_graph_backend(Phase.PREFILL, Backend.TC_PIECEWISE)",
        "assert True or check_cuda_graph_backend(Phase.PREFILL, Backend.TC_PIECEWISE)"))  # fmt: skip
    piecewise = install.Setting(prefill_graph="tc_piecewise")
    assert isinstance(install.install(piecewise, root), install.Installed)
    patcher = root / "pool_patcher" / "api.py"
    patcher.write_text(patcher.read_text().replace(
        "    MHATokenToKVPool: attach_mha,", "    MHATokenToKVPool: attach_mha,\n"
        "    MLATokenToKVPool: attach_mha,"))  # fmt: skip
    mla = install.install(install.Setting(pool=install.MLA_POOL), root)
    assert isinstance(mla, install.Installed) and mla.groups == ("FULL",)


def test_every_pool_class_the_matrix_names_is_sglang_s():
    """The pools a row installs on are classes SGLang's ``mem_cache`` defines."""
    classes = {
        node.name
        for path in (loading.sglang_root() / "srt" / "mem_cache").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    named = {s.pool for row in matrix.ROWS for s in row.settings}
    assert named and named <= classes


@pytest.mark.parametrize("model", sorted(
    {m for row in matrix.ROWS if not row.not_run for m in row.models}, key=repr))  # fmt: skip
def test_a_row_s_history_makes_only_the_forwards_its_server_makes(model):
    """Every forward of a model's histories is of a step label its server makes (or an idle
    step, or a PD transfer's prefill engine's), and every label the model shows but SWEEP
    occurs in its first histories."""
    seen = set()
    for index in range(4):
        config = histories.engine_config(index, eagle_offset=model.offset, page_size=1, window=0)
        engine = Engine(config)
        for forward in histories.history(index, engine=engine, scheduling=model.scheduling):
            label = histories.step_label(forward)
            if label.prefill_engine or label.mode == "IDLE":
                continue
            seen.add(str(label))
    assert seen <= set(model.shows), seen - set(model.shows)
    assert set(model.shows) - {matrix.SWEEP_L} <= seen


def test_the_docs_install_and_history_cells_are_today_s_runs():
    """``docs/SUPPORT.md``'s install and history cells, run afresh on the installed release
    (the nightly job runs every cell on every release)."""
    release, kept = matrix.parse(matrix.DOC.read_text())
    made = matrix.table(("install", "history"))
    if release != loading_version():
        pytest.skip(f"docs/SUPPORT.md is of sglang {release}")
    assert matrix.problems(made, kept, ("install", "history")) == []


def test_a_changed_cell_is_a_problem():
    """Able to fail: a cell that differs from the file's, in a column checked, is named."""
    _, kept = matrix.parse(matrix.DOC.read_text())
    changed = [list(row) for row in kept]
    changed[0][2] = "raises at step 1: something"
    assert matrix.problems(changed, kept, ("install",)) == []
    (problem,) = matrix.problems(changed, kept, ("install", "history"))
    assert kept[0][0] in problem and "history" in problem


def loading_version() -> str:
    from conformance import upstream

    return upstream.installed_version()


def test_sglang_s_kv_moves_leave_the_records_behind():
    """[23]: run on the installed release, each path moves (or names) the KV and not the
    canary's records."""
    from conformance.sglang import kv_paths

    moved = {p.name: p for p in kv_paths.paths()}
    backup = moved[kv_paths.RETRACTION_BACKUP]
    assert backup.kv_moved and not backup.records_moved
    if kv_paths.HICACHE in moved:  # 0.5.23 on
        assert moved[kv_paths.HICACHE].kv_moved and not moved[kv_paths.HICACHE].records_moved
    if kv_paths.EAGLE_TREE in moved:  # a pool with _slot_move_pointer_buffers
        tree = moved[kv_paths.EAGLE_TREE]
        assert tree.kv_moved and not tree.records_moved


def test_a_tree_move_that_carried_the_records_is_seen(tmp_path, monkeypatch):
    """Able to fail: a pool whose default move named the canary's buffers with its own would
    show the records carried."""
    from conformance.sglang import kv_paths

    text = kv_paths.memory_pool_file().read_text()
    at = text.index("    def _slot_move_pointer_buffers(", text.index("class MHATokenToKVPool("))
    old = "buffers = [*self.k_buffer, *self.v_buffer]"
    assert old in text[at : at + 800]
    named = "buffers = [*self.k_buffer, *self.v_buffer, *self.canary_buffers]"
    path = tmp_path / "memory_pool.py"
    path.write_text(text[:at] + text[at:].replace(old, named, 1))
    real = kv_paths._pool

    def pool():
        made, group = real()
        made.canary_buffers = [group.k_head, group.k_tail, group.v_head, group.v_tail]
        return made, group

    monkeypatch.setattr(kv_paths, "_pool", pool)
    tree = kv_paths.eagle_tree(path)
    assert tree is not None and tree.records_moved


def test_a_copy_that_moves_nothing_is_seen(tmp_path):
    """Able to fail: a release whose load_cpu_copy loaded nothing would show its KV left."""
    from conformance.sglang import kv_paths

    text = kv_paths.memory_pool_file().read_text()
    at = text.index("    def load_cpu_copy(", text.index("class MHATokenToKVPool("))
    body = text.index("):\n", at) + 3  # the first line of the method's body
    broken = text[:body] + "        return None\n" + text[body:]
    path = tmp_path / "memory_pool.py"
    path.write_text(broken)
    assert not kv_paths.retraction_backup(path).kv_moved


@pytest.mark.parametrize("records", [True, False])
def test_a_hicache_history_reports_only_where_the_reload_leaves_the_records(records):
    """The HiCache row's history is silent where its reloads carry the records, as the legs'
    engines move them, and reports where they do not, as SGLang's host pool moves them: the
    row's reports come from the records left behind."""
    import dataclasses

    from conformance.sglang import manager_run

    row = next(r for r in matrix.ROWS if "HiCache" in r.option)
    (model,) = row.models
    scheduling = dataclasses.replace(model.scheduling, reload_records=records)
    engine, reference_run, side = manager_run.sides(matrix._config(row, model, 0))
    histories.history(0, run=lambda step: side.run(reference_run, step), engine=engine,
                      scheduling=scheduling)  # fmt: skip
    assert engine.events["a cached prefix offloaded and reloaded into other slots"]
    assert bool(side.fired) == (not records), side.fired


def test_a_row_left_out_where_refused_says_so_only_where_sglang_refuses():
    """A row the leg runs no history of where the canary does not install says so where
    ``install_canary`` refuses it, and why it still has none where it installs (as a release
    before 0.5.22 installs on a device without the canary's kernels)."""
    refused = matrix.Row("x", (install.Setting(pool=install.MLA_POOL),),
                         not_run=matrix.WHERE_REFUSED, installed="y")  # fmt: skip
    assert refused.why_not_run() == "the canary does not install"
    installs = matrix.Row("x", (install.Setting(),), not_run=matrix.WHERE_REFUSED, installed="y")
    assert installs.why_not_run() == "the canary installs on this release, but y"


def test_a_copy_without_the_file_shows_the_run_only(monkeypatch, tmp_path, capsys):
    """An installed copy of the suite has no docs/SUPPORT.md: ``--check`` shows its run and
    passes, rather than failing on a file that is the repository's."""
    monkeypatch.setattr(matrix, "DOC", tmp_path / "SUPPORT.md")
    monkeypatch.setattr(matrix, "table", lambda columns: [["x", "y", "z", *[""] * 9]])
    assert matrix.main(["--check", "--cells", "install"]) == 0
    assert "shown only" in capsys.readouterr().out


def test_the_pool_of_a_model_is_sglang_s_choice():
    """SGLang's own ``is_hybrid_swa_model`` and ``get_hybrid_layer_ids`` decide the pool of
    the pure SWA rows: an MHA pool where it does not call the model hybrid, and an SWA pool
    without full layers where every layer slides."""
    from conformance.sglang import model_layers

    assert model_layers.pool_of("MistralForCausalLM", sliding_window=4096) == {
        "pool": install.MHA_POOL
    }
    assert model_layers.pool_of("UnlimitedOCRForCausalLM") == {
        "pool": install.SWA_POOL, "full_layers": 0,
    }  # fmt: skip
    assert not model_layers.unified_memory_by_default()
    hybrid = model_layers.layer_ids("GptOssForCausalLM",
                                    layer_types=["sliding_attention", "full_attention"] * 2)  # fmt: skip
    assert hybrid == ([0, 2], [1, 3])


def test_a_release_whose_model_has_full_layers_is_read_as_one(tmp_path):
    """Able to fail: a release whose ``get_hybrid_layer_ids`` gave the model a full layer."""
    from conformance.sglang import model_layers

    source = loading.sglang_root() / model_layers.MODEL_CONFIG
    target = tmp_path / model_layers.MODEL_CONFIG
    target.parent.mkdir(parents=True)
    text = source.read_text()
    at = text.index('elif "UnlimitedOCRForCausalLM" in model_architectures:')
    old = "full_attention_layer_ids = []"
    assert old in text[at : at + 300]
    target.write_text(text[:at] + text[at:].replace(old, "full_attention_layer_ids = [0]", 1))
    assert model_layers.pool_of("UnlimitedOCRForCausalLM", tmp_path) == {
        "pool": install.SWA_POOL, "full_layers": 1,
    }  # fmt: skip


def test_every_attacher_of_the_registry_is_sglang_s_own(monkeypatch):
    """Each pool class of the release's registry installs through its attacher run from
    SGLang's source: the groups it makes are SGLang's ``CanaryBufferGroup``s, sized from the
    stand-in pool. Able to fail: a pool that lacks what ``attach_dsv4`` reads (its SWA
    sub-pool) fails in SGLang's code; no attacher stands in and answers anyway."""
    registry = install._registry(install.kv_canary_dir() / "pool_patcher" / "api.py")
    assert set(registry.values()) >= {"attach_mha", "attach_swa", "attach_dsv4"}
    for pool, attacher in registry.items():
        made = install.install(install.Setting(pool=pool))
        assert isinstance(made, install.Installed) and made.attacher == attacher, pool
    dsv4 = install.install(install.Setting(pool=install.DSV4_POOL, draft_worker=True,
                                           speculative_num_steps=3))  # fmt: skip
    assert isinstance(dsv4, install.Installed) and dsv4.groups == ("SWA",)
    assert dsv4.kv_token_id_vs_position_offset == 1  # the field of SGLang's group
    part = install._pool

    def without_the_swa_sub_pool(setting, pool_class):
        pool = part(setting, pool_class)
        del pool.swa_kv_pool
        return pool

    monkeypatch.setattr(install, "_pool", without_the_swa_sub_pool)
    with pytest.raises(AttributeError, match="swa_kv_pool"):
        install.install(install.Setting(pool=install.DSV4_POOL))


@pytest.mark.parametrize("full_layers", [0, 1])
def test_install_runs_sglang_s_own_swa_attacher(full_layers):
    """The SWA pool's canary attached by SGLang's ``attach_swa`` itself: groups of SGLang's
    ``CanaryBufferGroup`` where the pool has a full layer, and SGLang's ``IndexError`` where it
    has none ([26]); the stand-in pool indexes nothing itself."""
    made = install.install(install.Setting(pool=install.SWA_POOL, full_layers=full_layers))
    if full_layers:
        assert isinstance(made, install.Installed) and made.groups == ("FULL", "SWA")
    else:
        assert made == install.Refused("IndexError", "list index out of range")
        assert str(made).startswith("raises: IndexError")
