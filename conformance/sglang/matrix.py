"""The support matrix: per serving configuration, whether SGLang's canary installs, whether a
correct history stays silent, and which checks fire in each forward mode, every cell a run.

    python -m conformance.sglang.matrix [--check] [--cells install,history]

Each row (:data:`ROWS`) changes one server option of the baseline (decode CUDA graphs on,
prefill graphs off, no speculative decoding, an MHA model, pages of one slot, chunked prefill,
no hierarchical cache, no PD disaggregation, no DP attention). Its cells:

- ``install``: :func:`conformance.sglang.install.install`, SGLang's ``install_canary`` run from
  the release's source in the row's setting (for EAGLE, the target's runner and the draft
  worker's): it installs (the buffer groups) or refuses, with SGLang's exception;
- ``history``: history 0 of each model of the row (:class:`Model`: its engine, the events a
  server of the row schedules, :class:`conformance.sglang.histories.Scheduling`) through SGLang's
  per-forward runtime beside the reference (:mod:`conformance.sglang.manager_run`, the engine as
  a server runs it, :func:`conformance.sglang.wiring.servable`): ``silent``, or its first report
  (check, forward mode, launch tag, step), or the exception SGLang's runtime raised, or where it
  and the reference differed;
- ``fired``: a fault of every class (:mod:`engine_model.faults`) settled in each of the row's
  settle modes, one trial each, through SGLang's runtime; per forward mode the row's server
  makes (:attr:`Model.shows`: a settle step it never makes is left out), the checks that fired
  (``.`` where the mode ran and nothing fired, empty where the row's trials never ran it). On
  an overlap row each settle starts with a request finishing in the overlap order
  (:func:`conformance.sglang.trials.overlap_lead`), and the cells count what fired in the
  overshoot decode too, the fault's reports and the overlap's alike. On the tree row every
  target verify of the target's trials, the warm-up's and the settle's, is a tree verify
  (:func:`conformance.sglang.tree.verify`), and its cells count what the moves of the accepted
  paths leave behind too.

The KV that a row's HiCache reloads and retraction restores move is moved as SGLang's own code
moves it, run from its source (:mod:`conformance.sglang.kv_paths`, :func:`served`).

A row the leg cannot run says why in place of its cells (``not run: ...``): the leg does not
make what that option changes, and a cell it would show is not a run. ``docs/SUPPORT.md`` is
this module's output on the release it names; ``--check`` compares the cells it runs with the
file's (``--cells``: those columns only, the quick ones ``.ci/run`` runs; the nightly job runs
every cell on every release, and compares where the release is the file's).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import reference
from conformance import upstream
from conformance.sglang import histories, kv_paths, loading, prefill_graphs, tree, wiring
from conformance.sglang.fired import CHECKS, fired_counts
from conformance.sglang.histories import (
    DRAFT_OPS,
    GRAPH_DECODE,
    GRAPH_DECODE_STEP,
    GRAPH_DRAFT_DECODE_STEP,
    GRAPH_DRAFT_EXTEND_STEP,
    GRAPH_VERIFY_STEP,
    MOVE_OPS,
    PLAIN_OPS,
    TARGET_OPS,
    Scheduling,
)
from conformance.sglang.install import MHA_POOL, MLA_POOL, SWA_POOL, Refused, Setting, install
from engine_model import faults
from engine_model.vocabulary import (
    DECODE,
    DRAFT_DECODE,
    DRAFT_EXTEND_V2,
    DRAFT_SETTLE_MODES,
    EXTEND,
    MANAGER_SETTLE_MODES,
    MIXED,
    SWEEP_STEP,
    TARGET_VERIFY,
    StepLabel,
)

__all__ = ["COLUMNS", "DOC", "ROWS", "Model", "Row", "main", "table"]

#: The generated file.
DOC = Path(__file__).resolve().parents[2] / "docs" / "SUPPORT.md"
#: The checks, by the short names the cells use.
SHORT = {
    "CHAIN": "C",
    "POSITION": "P",
    "REAL_KV": "K",
    "TOKEN": "T",
    "WRITE_TOKEN": "WT",
    "WRITE_POSITION": "WP",
}
#: The forward modes of the ``fired`` cells: their step labels' text, and their headers.
_LABELS = (StepLabel(DECODE), GRAPH_DECODE_STEP, StepLabel(MIXED), StepLabel(EXTEND),
           StepLabel(TARGET_VERIFY), GRAPH_VERIFY_STEP, DRAFT_DECODE, GRAPH_DRAFT_DECODE_STEP,
           StepLabel(DRAFT_EXTEND_V2), GRAPH_DRAFT_EXTEND_STEP, SWEEP_STEP)  # fmt: skip
MODES = {str(label): label.short for label in _LABELS}
#: The matrix's columns: the cells of a row, then its fired checks per mode.
COLUMNS = ("option", "install", "history", *MODES.values())

#: A PD decode engine: requests arrive by transfer, nothing is prefilled here. A PD prefill
#: engine: requests are admitted, prefilled and leave.
PD_DECODE_OPS = ("receive", "decode", GRAPH_DECODE, "idle", "finish", "retract", "sweep")
PD_PREFILL_OPS = ("admit", "prefill", "finish", "twin", "sweep")


#: The step labels of the forwards (and sweeps) each kind of server makes: the ``fired`` cells
#: show these only (a fault trial's settle may make a step that the row's server never does,
#: such as a plain decode of a model under EAGLE, whose reports are left out).
(DECODE_L, GRAPH_DECODE_L, MIXED_L, EXTEND_L, VERIFY_L, GRAPH_VERIFY_L, DRAFT_L, GRAPH_DRAFT_L,
 DRAFT_EXTEND_L, GRAPH_DRAFT_EXTEND_L, SWEEP_L) = MODES  # fmt: skip
PLAIN_SHOWS = (EXTEND_L, DECODE_L, GRAPH_DECODE_L, MIXED_L, SWEEP_L)


@dataclass(frozen=True)
class Model:
    """One model's canary in a row: its engine's EAGLE offset (1: the draft model's), the
    events a server schedules for it, the settle modes of its fault trials, the step labels
    of the forwards (and sweeps) the server makes for it, those its cells show, and whether
    its prefills (``EXTEND``, ``MIXED``) replay breakable prefill graphs (prefill_graphs)."""

    name: str
    offset: int
    scheduling: Scheduling
    settle_modes: tuple[str, ...]
    shows: tuple[str, ...] = PLAIN_SHOWS

    @property
    def no_trials(self) -> str:
        """Why no fault trial runs (empty: they do)."""
        if self.prefill_graphs:  # its correct history raises at its first prefill ([24])
            return "a correct history does not run through (the history cell)"
        if self.not_modelled:
            return self.not_modelled
        return "" if self.settle_modes else "no fault settles without a decode"

    prefill_graphs: bool = False
    #: why the leg runs no history of this model (empty: it does)
    not_modelled: str = ""
    #: the draft model's tokens a request in each draft decode step (EAGLE's ``topk``: a
    #: tree's draft decode as ``ManagerRun.tree_draft`` runs it)
    topk: int = 1


DRAFT_DECODE_SETTLE, DRAFT_EXTEND_SETTLE = DRAFT_SETTLE_MODES
TARGET_VERIFY_GRAPH, DRAFT_DECODE_GRAPH, DRAFT_EXTEND_GRAPH = MANAGER_SETTLE_MODES
PLAIN = Model("model", 0, Scheduling(PLAIN_OPS), (GRAPH_DECODE, MIXED))
EAGER = Model("model", 0, Scheduling(PLAIN_OPS, graphs=False), (DECODE, MIXED),
              (EXTEND_L, DECODE_L, MIXED_L, SWEEP_L))  # fmt: skip
TARGET = Model("target", 0, Scheduling(TARGET_OPS, fallback="verify"),
               (TARGET_VERIFY, TARGET_VERIFY_GRAPH), (EXTEND_L, VERIFY_L, GRAPH_VERIFY_L, SWEEP_L))  # fmt: skip
DRAFT = Model("draft", 1, Scheduling(DRAFT_OPS, fallback="draft"),
              (DRAFT_DECODE_SETTLE, DRAFT_DECODE_GRAPH, DRAFT_EXTEND_SETTLE, DRAFT_EXTEND_GRAPH),
              (EXTEND_L, DRAFT_L, GRAPH_DRAFT_L, DRAFT_EXTEND_L, GRAPH_DRAFT_EXTEND_L))  # fmt: skip
PADDED = Model("model", 0, Scheduling(PLAIN_OPS, min_pad=1), (GRAPH_DECODE, MIXED))
PD_DECODE = Model("decode", 0, Scheduling(PD_DECODE_OPS, first_requests=0), (GRAPH_DECODE,),
                  (DECODE_L, GRAPH_DECODE_L, SWEEP_L))  # fmt: skip
PD_PREFILL = Model("prefill", 0, Scheduling(PD_PREFILL_OPS, fallback="prefill"), (),
                   (EXTEND_L, SWEEP_L))  # fmt: skip
#: Breakable prefill graphs: every prefill on the prefill graph runner's replay batch. Its
#: correct history raises at its first prefill (the history cell, [24]): no fault trial runs.
BREAKABLE = Model("model", 0, Scheduling(PLAIN_OPS), (), prefill_graphs=True)
#: HiCache's offload and reload of cached prefixes, and a PD decode server's retractions with a
#: KV backup restored into new slots, each moving what SGLang's path moves (kv_paths).
HICACHE_MODEL = Model("model", 0, Scheduling(PLAIN_OPS + ("relocate",)), (GRAPH_DECODE, MIXED))
BACKUP_MODEL = Model("decode", 0, Scheduling(PD_DECODE_OPS + MOVE_OPS, first_requests=0),
                     (GRAPH_DECODE,), (DECODE_L, GRAPH_DECODE_L, SWEEP_L))  # fmt: skip


#: The events whose KV moves follow SGLang's paths, and the paths (kv_paths).
PATHS = {"relocate": kv_paths.HICACHE, "restore": kv_paths.RETRACTION_BACKUP}


def served(scheduling: Scheduling) -> Scheduling | str:
    """``scheduling`` with its KV moves carrying what SGLang's paths carry of the canary
    (:func:`conformance.sglang.kv_paths.carries`, run on the installed release), or why it
    cannot be (a path its events take that does not run on this release)."""
    unknown = [p for op, p in PATHS.items() if op in scheduling.ops and kv_paths.carries(p) is None]
    if scheduling.tree and kv_paths.carries(kv_paths.EAGLE_TREE) is None:
        unknown.append(kv_paths.EAGLE_TREE)
    if unknown:
        return f"not run: the {unknown[0]} path does not run on this release"
    return dataclasses.replace(
        scheduling,
        reload_records=bool(kv_paths.carries(kv_paths.HICACHE)),
        restore_records=bool(kv_paths.carries(kv_paths.RETRACTION_BACKUP)),
        tree_records=bool(kv_paths.carries(kv_paths.EAGLE_TREE)),
    )


#: Overlap scheduling: each finish makes its overshoot decode, the next batch written into the
#: freed row before that decode's canary reads it where the release's fence allows (overlap).
#: Its fault trials' settles start with such a finish (trials.overlap_lead).
OVERLAP = Model("model", 0, Scheduling(PLAIN_OPS, overlap=True), PLAIN.settle_modes)
OVERLAP_EAGER = Model("model", 0, Scheduling(PLAIN_OPS, graphs=False, overlap=True),
                      EAGER.settle_modes, EAGER.shows)  # fmt: skip
#: EAGLE drafting a tree: the target's verifies as SGLang's tree verify launches them, each
#: accepted path's KV moved without the records (tree); the draft model's draft decode steps
#: give the canary ``topk`` positions a request (``ManagerRun.tree_draft``), which SGLang's
#: plan input refuses ([29]).
TARGET_TREE = Model("target", 0, Scheduling(TARGET_OPS, fallback="verify", tree=True),
                    TARGET.settle_modes, TARGET.shows)  # fmt: skip
DRAFT_TREE = Model("draft", 1, Scheduling(DRAFT_OPS, fallback="draft"), (), DRAFT.shows,
                   topk=tree.TOPK)  # fmt: skip
UNCHUNKED = Model(
    "model", 0, Scheduling(PLAIN_OPS, chunk=histories.CONTEXT_LEN), (GRAPH_DECODE, MIXED)
)


@dataclass(frozen=True)
class Row:
    """A serving configuration: the option it changes from the baseline, its install settings
    (one per runner whose canary it installs: the inputs of ``install_canary`` the option
    changes), its models, the engine's page size and window, and ``not_run``: why the leg runs
    no history of it (empty: it does; :data:`WHERE_REFUSED`: where ``install_canary`` refuses
    it, else ``installed``, why the leg has none where the canary installs)."""

    option: str
    settings: tuple[Setting, ...] = (Setting(),)
    models: tuple[Model, ...] = (PLAIN,)
    page_size: int = 1
    window: int = 0
    not_run: str = ""
    installed: str = ""

    def why_not_run(self) -> str:
        """Why the leg runs no history of the row (empty: it does)."""
        if self.not_run != WHERE_REFUSED:
            return self.not_run
        if all(isinstance(install(s), Refused) for s in self.settings):
            return "the canary does not install"
        return f"the canary installs on this release, but {self.installed}"


_EAGLE = (Setting(speculative_num_steps=3), Setting(draft_worker=True, speculative_num_steps=3))
#: A row the leg runs no history of: where the canary does not install.
WHERE_REFUSED = "where refused"
#: The rows, each one option away from the baseline (the first).
ROWS = (
    Row("baseline: decode CUDA graphs, no prefill graphs, mixed chunks, MHA, pages of 1 slot"),
    Row("decode CUDA graphs off", (Setting(decode_graph="disabled"),), (EAGER,)),
    Row("prefill CUDA graphs piecewise", (Setting(prefill_graph="tc_piecewise"),),
        not_run=WHERE_REFUSED, installed="the leg captures no piecewise prefill graph"),
    Row("prefill CUDA graphs breakable", (Setting(prefill_graph="breakable"),), (BREAKABLE,)),
    Row("a device without the canary's CUDA kernels (CPU), decode graphs on", (Setting(device="cpu"),),
        not_run=WHERE_REFUSED,
        installed="the leg replays the canary's kernels in a graph, not its torch reference"),
    Row("EAGLE, a chain of drafts (topk 1)", _EAGLE, (TARGET, DRAFT)),
    Row("EAGLE, a tree of drafts (topk 2)", _EAGLE, (TARGET_TREE, DRAFT_TREE)),
    Row("DP attention (graph batches padded across ranks)", models=(PADDED,)),
    Row("hierarchical cache (HiCache)", models=(HICACHE_MODEL,)),
    Row("PD disaggregation, decode side", (Setting(disaggregation_mode="decode"),), (PD_DECODE,)),
    Row("PD disaggregation, prefill side", (Setting(disaggregation_mode="prefill"),), (PD_PREFILL,)),
    Row("PD decode side, retraction with a KV backup (cpu_tensor)",
        (Setting(disaggregation_mode="decode"),), (BACKUP_MODEL,)),
    Row("hybrid SWA model (window 5)", (Setting(pool=SWA_POOL),), window=5),
    Row("pure SWA model SGLang does not call hybrid (MistralForCausalLM: a window on every layer)",
        (Setting(architecture="MistralForCausalLM"),)),
    Row("pure SWA model on the SWA pool (UnlimitedOCRForCausalLM: every layer slides)",
        (Setting(architecture="UnlimitedOCRForCausalLM"),), not_run=WHERE_REFUSED,
        installed="the engine model has no SWA pool without full layers"),
    Row("MLA model", (Setting(pool=MLA_POOL),), not_run=WHERE_REFUSED,
        installed="the engine model has no MLA pool"),
    Row("pages of 16 slots", page_size=16),
    Row("pages of 64 slots", page_size=64),
    Row("chunked prefill off", models=(UNCHUNKED,)),
    Row("overlap scheduling", models=(OVERLAP,)),
    Row("overlap scheduling, decode CUDA graphs off", (Setting(decode_graph="disabled"),),
        (OVERLAP_EAGER,)),
)  # fmt: skip
assert all(s.pool in (MHA_POOL, SWA_POOL, MLA_POOL) for r in ROWS for s in r.settings)


def _config(row: Row, model: Model, index: int, **kwargs):
    """The engine of ``model`` in ``row`` as a server runs it (:func:`wiring.servable`, under
    EAGLE where the row has a draft model)."""
    config = histories.engine_config(
        index, eagle_offset=model.offset, page_size=row.page_size, window=row.window, **kwargs)  # fmt: skip
    return wiring.servable(config, eagle=len(row.models) > 1)


def install_cell(row: Row) -> str:
    """What ``install_canary`` does in each of the row's settings."""
    outcomes = [str(install(s)) for s in row.settings]
    if not outcomes:
        return "not run"
    if len(set(outcomes)) == 1:
        return outcomes[0]
    names = ("target", "draft")
    return "; ".join(f"{n}: {o}" for n, o in zip(names, outcomes, strict=True))


def _first_report(side) -> str:
    (label, tag, bits), *_ = side.fired
    checks = "+".join(n for n, b in CHECKS.items() if bits & int(b))
    return f"{checks} in {label} ({reference.CanaryLaunchTag(tag).name})"


def history_outcome(row: Row, model: Model, index: int = 0) -> str:
    """History ``index`` of ``model`` in ``row`` through SGLang's runtime and the reference:
    ``silent``, or what happened first (run once for rows of one engine and scheduling)."""
    return _outcome(row.page_size, row.window, len(row.models) > 1, model, index)


@functools.cache
def _outcome(page_size: int, window: int, eagle: bool, model: Model, index: int) -> str:
    from conformance.sglang import manager_run

    row = Row("", models=(model,) * (2 if eagle else 1), page_size=page_size, window=window)

    if model.not_modelled:
        return f"not run: {model.not_modelled}"
    scheduling = served(model.scheduling)
    if isinstance(scheduling, str):
        return scheduling
    if model.prefill_graphs and (why := prefill_graphs.why_not_modelled()):
        return f"not run: {why}"
    engine, reference_run, side = manager_run.sides(_config(row, model, index))
    side.prefill_graphs, side.draft_topk = model.prefill_graphs, model.topk
    first: list[str] = []

    def run(step) -> None:
        side.run(reference_run, step)
        if side.fired and not first:
            first.append(f"{_first_report(side)} at step {engine.steps}")

    try:
        histories.history(index, run=run, engine=engine, scheduling=scheduling)
    except (RuntimeError, TypeError, AttributeError, manager_run.ServerCannotStart) as raised:
        error = getattr(raised, "error", raised)  # a capture's: SGLang's own exception
        return (
            f"raises at step {engine.steps}: {type(error).__name__}: {str(error).splitlines()[0]}"
        )
    except AssertionError as error:
        return f"differs from the reference: {str(error).splitlines()[0][:160]}"
    if side.divergent:
        first.append(f"[20]: {side.divergent} reports")
    return first[0] if first else f"silent ({engine.steps} steps)"


def history_cell(row: Row) -> str:
    outcomes = [(m.name, history_outcome(row, m)) for m in row.models]
    if len(outcomes) == 1:
        return outcomes[0][1]
    return "; ".join(f"{name}: {o}" for name, o in outcomes)


def fired_cells(row: Row, trials: int = 1) -> list[str]:
    """Per forward mode, the checks SGLang's runtime fired in the row's fault trials (run once
    for rows of one engine and models)."""
    return list(_fired(row.models, row.page_size, row.window, trials))


@functools.cache
def _fired(models: tuple[Model, ...], page_size: int, window: int, trials: int) -> tuple:
    from conformance.sglang import manager_run
    from conformance.sglang.trials import fault_trial

    row = Row("", models=models, page_size=page_size, window=window)

    fired: Counter = Counter()
    ran: set[str] = set()  # the step labels the trials ran that the row's server makes
    for model in row.models:
        # a tree server's trials move the accepted paths' records where SGLang's path carries
        # them on this release (None: a chain server's)
        tree_records = None
        if model.settle_modes and model.scheduling.tree:
            scheduling = served(model.scheduling)
            if isinstance(scheduling, str):  # the tree's path does not run on this release
                return (scheduling, *[""] * (len(MODES) - 1))
            tree_records = scheduling.tree_records
        classes = [  # a class that needs a target verify, where the model makes one
            k for k, c in faults.FAULTS.items()
            if not c.target_model_only or "verify" in model.scheduling.ops
        ]  # fmt: skip
        for mode in model.settle_modes:
            for t in range(trials):
                for fault_class in classes:
                    try:
                        _, _, side = fault_trial(
                            fault_class, t, mode, eagle_offset=model.offset,
                            page_size=row.page_size, window=row.window,
                            verify="verify" in model.scheduling.ops,
                            overlap_graphs=model.scheduling.graphs
                            if model.scheduling.overlap else None,
                            tree_records=tree_records,
                        )  # fmt: skip
                    except (
                        RuntimeError,
                        TypeError,
                        AttributeError,
                        manager_run.ServerCannotStart,
                    ) as raised:  # SGLang's own
                        error = getattr(raised, "error", raised)
                        why = f"{model.name}'s trials raise {type(error).__name__} ({mode})"
                        return (f"not run: {why}", *[""] * (len(MODES) - 1))
                    fired.update({k: n for k, n in side.fired.items() if k[0] in model.shows})
                    ran.update(side.step_labels & set(model.shows))
    counts = fired_counts(fired)
    cells = []
    for label in MODES:
        names = [SHORT[c] for c in CHECKS if counts.get((c, label))]
        cells.append(" ".join(names) if names else ("." if label in ran else ""))
    return tuple(cells)


def row_cells(row: Row, columns: tuple[str, ...]) -> list[str]:
    """The cells of ``row``, those of ``columns`` run (``install``, ``history``, ``fired``),
    the others empty."""
    cells = [row.option, install_cell(row) if "install" in columns else ""]
    if row.not_run:
        return [*cells, f"not run: {row.why_not_run()}", *[""] * len(MODES)]
    cells.append(history_cell(row) if "history" in columns else "")
    if "fired" in columns and any(m.settle_modes for m in row.models):
        return [*cells, *fired_cells(row)]
    why = "; ".join(m.no_trials for m in row.models if m.no_trials)
    note = f"not run: {why}" if "fired" in columns else ""
    return [*cells, note, *[""] * (len(MODES) - 1)]


def table(columns: tuple[str, ...] = ("install", "history", "fired")) -> list[list[str]]:
    return [row_cells(row, columns) for row in ROWS]


def render(rows: list[list[str]], version: str) -> str:
    """``docs/SUPPORT.md``'s text."""
    lines = [
        "# Support matrix: SGLang's canary per serving configuration",
        "",
        f"Generated by `python -m conformance.sglang.matrix` on sglang {version}; "
        "checked by `--check` (see `conformance/sglang/matrix.py` for what each cell runs).",
        "",
        "Checks: " + ", ".join(f"{s} {c}" for c, s in SHORT.items()) + "; `.`: the mode ran "
        "in the row's fault trials and nothing fired; empty: the trials never ran it.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def parse(text: str) -> tuple[str, list[list[str]]]:
    """The release and the rows of a ``docs/SUPPORT.md``."""
    release = re.search(r"on sglang (\S+);", text)
    if release is None:
        raise LookupError("docs/SUPPORT.md names no release")
    rows = [
        [c.strip() for c in line.strip()[1:-1].split(" | ")]
        for line in text.splitlines()
        if line.startswith("| ") and not line.startswith("| option |")
    ]
    return release.group(1), rows


def problems(made: list[list[str]], kept: list[list[str]], columns: tuple[str, ...]) -> list[str]:
    """Where the cells run differ from the file's (only those of ``columns``)."""
    index = {"install": (1,), "history": (2,), "fired": tuple(range(3, len(COLUMNS)))}
    which = [i for c in columns for i in index[c]]
    if [r[0] for r in made] != [r[0] for r in kept]:
        return ["the rows differ from docs/SUPPORT.md's: regenerate it"]
    return [
        f"{mine[0]}: {COLUMNS[i]} is {mine[i]!r}, docs/SUPPORT.md says {theirs[i]!r}"
        for mine, theirs in zip(made, kept, strict=True)
        for i in which
        if mine[i] != theirs[i] and not (mine[i] == "" and i > 2)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m conformance.sglang.matrix", description=__doc__
    )
    parser.add_argument("--check", action="store_true", help="compare with docs/SUPPORT.md")
    parser.add_argument("--cells", default="install,history,fired",
                        help="the columns to run, comma-separated (default: all)")  # fmt: skip
    options = parser.parse_args(argv)
    columns = tuple(options.cells.split(","))
    if set(columns) - {"install", "history", "fired"}:
        parser.error(f"--cells takes install, history and fired, not {options.cells}")
    if not loading.load_or_say(loading.manager_modules):
        return 2
    version = upstream.installed_version()
    if not options.check and columns != ("install", "history", "fired"):
        parser.error("write docs/SUPPORT.md with every column (leave out --cells)")
    made = table(columns)
    if not options.check:
        DOC.write_text(render(made, version))
        print(f"wrote {DOC.name} (sglang {version})")
        return 0
    print(render(made, version), end="")
    if not DOC.is_file():  # an installed copy of the suite: the file is the repository's
        print("no docs/SUPPORT.md beside this copy of the suite: the run is shown only")
        return 0
    release, kept = parse(DOC.read_text())
    if release != version:
        print(f"docs/SUPPORT.md is of sglang {release}; this run, of {version}, is shown only")
        return 0
    found = problems(made, kept, columns)
    for line in found:
        print(f"problem: {line}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
