"""The detection table: which fault classes each ``real_kv_hash_mode`` reports, and when.

For every fault class of :data:`engine_model.faults.FAULTS` (its description is the first column)
and every mode (NONE, PARTIAL, ALL), the reference alone (numpy, no implementation) runs
:data:`TRIALS` engine histories: a short warm-up (``conformance.engine_support.warm_up``), the
fault at a place and KV byte drawn from the trial's seed, then the settle steps (a fresh
request admitted; prefill, decode, prefill, decode; the cache sweep). A history is a trial of its own engine: pages of 1, 2 and 4
slots, with and without a sliding window and the EAGLE offset. The table says in how many
trials the fault was reported, after how many steps, and with which reasons::

    python -m tools.detection_table                  # writes docs/DETECTION.md
    python -m tools.detection_table --check          # exit 1 if docs/DETECTION.md is out of date
    python -m tools.detection_table --check --full   # the same, every trial run again

The document ends with a stamp: a digest of its inputs (every module of the repository that
this one imports, and the versions of Python, numpy and torch: :func:`inputs_digest`) and one
of its own text. ``--check`` trusts a document whose stamp matches both, since every trial is a
function of those inputs alone, and runs every trial again otherwise; ``--full`` runs them
whatever the stamp says (the nightly job does).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np

import reference
from conformance.assertions import FAIL_BIT_NAMES
from conformance.engine_support import OracleRun, inject_and_settle, warm_up
from conformance.sglang.histories import SEEDS
from engine_model import KV_BYTES, Engine, EngineConfig, faults
from engine_model.faults import FAULT_KINDS, FAULTS
from engine_model.vocabulary import LAUNCH_STAGES, SETTLE_MODES, TARGET_VERIFY, settle_step
from reference import RealKvHashMode

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "DETECTION.md"
MODES = tuple(mode.name for mode in RealKvHashMode)
TRIALS = 24
BITS = tuple(FAIL_BIT_NAMES.items())


def trial_config(kind: str, mode: int, trial: int) -> EngineConfig:
    """The engine of one trial: the options cycle over the trials, the seed is the trial's;
    under a window the SWA pool has 40 of the full pool's 64 slots."""
    window = (0, 5)[trial // 3 % 2]
    return EngineConfig(
        page_size=(1, 2, 4)[trial % 3],
        num_pages=64 // (1, 2, 4)[trial % 3],
        pool_rows=6,
        context_len=16,
        swa_window=window,
        offset=(0, 1)[trial // 6 % 2],
        mode=int(mode),
        seed=SEEDS.detection_engine(FAULT_KINDS.index(kind), trial),
        swa_slots=40 if window else 0,
    )


#: SGLang's own perturbations flip byte 0 of a slot's K row (``perturb/utils.py``).
SGLANG_BYTE = 0


def trial(
    kind: str, mode: int, index: int, byte: int | None = None, settle_mode: str | None = None
) -> tuple[int | None, int, list[str], str] | None:
    """One history: ``(steps until the first report or None, the reported bits, problems, the
    stage whose launch reported first)``, or None when the history had no place for the fault.
    ``byte``: the KV byte a fault changes (None: drawn from 0 to 31); ``settle_mode``: the
    forward mode of the settle's decodes (``conformance.engine_support.SETTLE_MODES``; None: the
    class's own, ``FaultClass.settle_mode``)."""
    return _trial(kind, int(mode), index, byte, settle_mode or FAULTS[kind].settle_mode)


@functools.cache
def _trial(
    kind: str, mode: int, index: int, byte: int | None, settle_mode: str
) -> tuple[int | None, int, list[str], str] | None:
    """:func:`trial`, run once per question in a process (the tables and their self-tests ask
    some twice)."""
    engine = Engine(trial_config(kind, mode, index))
    if settle_step(settle_mode).mode == TARGET_VERIFY and engine.config.offset:
        return None  # the draft model's canary runs no target verify
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    if oracle.index:
        return None, 0, [f"{oracle.index} reports before the fault"], ""
    rng = np.random.default_rng(SEEDS.detection_trial(index))
    since = oracle.index
    pick, drawn = int(rng.integers(0, 2**10)), int(rng.integers(0, KV_BYTES))
    made = inject_and_settle(
        engine, oracle, kind, pick, drawn if byte is None else byte, oracle.forward_or_sweep,
        mode=settle_mode,
    )  # fmt: skip
    if made is None:
        return None
    _, problems, first = made
    rows = oracle.rows(since)
    bits = 0
    for row in rows:
        bits |= int(row[reference.ViolationField.FAIL_REASON_BITS])
    stage = ""
    if len(rows):
        tag = reference.CanaryLaunchTag(int(rows[0][reference.ViolationField.KERNEL_KIND]))
        stage = tag.name.split("_")[0]
    return first, bits, problems, stage


#: The random continuation: scheduler events after the fault, and how often the cache is swept.
EVENTS, SWEEP_EVERY = 30, 8


def serving(kind: str, mode: int, index: int) -> int | None | bool:
    """One history that goes on as a server would after the fault: :data:`EVENTS` random
    scheduler events (admit, sharing or not; finish; retract; readmit; the prefix cache evicts
    when an allocation needs room), each followed by
    the next forward, and a cache sweep every :data:`SWEEP_EVERY` events. The number of steps
    until the first report, None when none came, False when the history had no place for the
    fault."""
    engine = Engine(trial_config(kind, mode, index))
    oracle = OracleRun(engine)
    warm_up(engine, oracle.forward_or_sweep)
    rng = np.random.default_rng(SEEDS.detection_serving(index))
    fault = faults.make(engine, kind, int(rng.integers(0, 2**10)), int(rng.integers(0, KV_BYTES)))
    if fault is None:
        return False
    for step in fault.steps:  # the fault's own steps (a faulty move of KV)
        oracle.forward_or_sweep(step)
    if fault.flip is not None:
        oracle.flip(*fault.flip)
    steps = 0
    for event in range(1, EVENTS + 1):
        op = rng.choice(("admit", "admit", "finish", "retract", "readmit", "none"))
        if op == "admit":
            engine.admit(int(rng.integers(1, 9)), int(rng.integers(0, 3)))
        elif op != "none":
            getattr(engine, op)(int(rng.integers(0, 8)))
        todo = [engine.prefill(6) or engine.decode(int(rng.integers(0, 2)))]
        if event % SWEEP_EVERY == 0:
            todo.append(engine.sweep())
        for step in todo:
            if step is not None:
                oracle.forward_or_sweep(step)
                steps += 1
                if oracle.index:
                    return steps
    return None


def serving_cell(results, why: str = "") -> str:
    made = [r for r in results if r is not False]
    seen = sorted(r for r in made if r is not None)
    if not made:
        return "no place"
    if not seen:
        return f"never (0 of {len(made)}){': ' + why if why else ''}"
    return f"{len(seen)} of {len(made)}, median step {seen[len(seen) // 2]}, last {seen[-1]}"


def cell(results, why: str = "") -> str:
    made = [r for r in results if r is not None]
    seen = [r for r in made if r[0] is not None]
    if not made:
        return "no place"
    if not seen:
        return f"never (0 of {len(made)}){': ' + why if why else ''}"
    steps = sorted(r[0] for r in seen)
    reasons = Counter(name for r in seen for bit, name in BITS if r[1] & bit)
    top = "/".join(name for name, _ in reasons.most_common(2))
    when = f"step {steps[0]}" if steps[0] == steps[-1] else f"steps {steps[0]}-{steps[-1]}"
    stages = "/".join(sorted({r[3] for r in seen}, key=LAUNCH_STAGES.index))
    return f"{len(seen)} of {len(made)}, {when} {stages}, {top}"


#: The document, its tables and figures filled in by :func:`render`.
DOCUMENT = """# Which faults each hash mode reports

Generated by `python -m tools.detection_table` from the reference and the engine model
(`engine_model/engine.py`); `python -m tools.detection_table --check` fails when it is out of
date (`--full`: every trial run again, whatever the stamp on the last line says). Do not edit
by hand.

Each cell (the settle's decodes in the class's own forward mode: `DECODE`, and for
`accept_off_by_one` `TARGET_VERIFY` in the histories without the EAGLE offset): in how many of
{TRIALS} engine histories the fault was reported (histories with no
place for it are not counted), the steps after the fault until the first report (the settle:
a fresh request is admitted; 1 prefill, 2 decode, 3 prefill, 4 decode, 5 the cache sweep; a
step with nothing to run is not counted), the launches that reported first (`HEAD`: a
forward's verify or write on a group's head buffer, before the forward, with no real-KV
source; `TAIL`: on its tail buffer after the forward, with the group's KV pool; `SWEEP`: the
cache sweep), and the most frequent reasons. The first table runs the settle right after the
fault; the second lets the server go on; the third repeats the first with SGLang's own
mechanics for the faults that flip a KV byte. The histories cycle over pages of 1, 2 and 4
slots, with and without a sliding window of 5 (then both buffer groups run: `FULL` over the
64-slot pool, `SWA` over a 40-slot pool) and the EAGLE offset; the KV byte a fault changes is
drawn from 0 to 31 of a slot's 32 bytes, in the pool of either group. Without a fault, no
history reports anything.

| fault | `NONE` | `PARTIAL` | `ALL` |
|---|---|---|---|
{rows}

As a server goes on. The same engines; after the fault, {EVENTS} random scheduler events
(admissions, half of them sharing a cached prefix, finishes, retractions, readmissions;
the cache evicts when an allocation needs room), each followed by the next forward, and a
cache sweep every {SWEEP_EVERY} events.
A fault whose request finishes, or whose page is freed and written again, before anything
reads it goes unreported: these cells count how often that happens.

| fault | `NONE` | `PARTIAL` | `ALL` |
|---|---|---|---|
{serving_rows}

With SGLang's own mechanics. SGLang's self-test perturbations (`real_kv_used`,
`real_kv_post_forward`, `real_kv_unused_cache`) flip byte {SGLANG_BYTE} of a slot's K row,
inside the 16 bytes `PARTIAL` reads; the same histories as the first table, with that byte.
This is the answer an engine team running SGLang's self-test gets; the first table's drawn
byte answers how often a change anywhere in a slot's bytes is seen.

| fault | `NONE` | `PARTIAL` | `ALL` |
|---|---|---|---|
{sglang_rows}

By forward mode. The same histories in `ALL`, the settle's two decodes run as
{settle_modes}: a decode, a decode replaying a CUDA graph (two
padding rows at its tail, plans kept from the replay before), a mixed batch (the decode rows in
an extend batch) and EAGLE's target verify (the sampled token and two drafts a row; only the
histories without the EAGLE offset, the target model's canary). The write's expected input tokens are
the token oracle's in a decode and the input ids themselves in every extend mode, as
SGLang's `TokenOracleManager` makes them.

| fault | {settle_headers} |
|---|---|---|---|---|
{mode_rows}

Reading it for `--kv-canary-real-data`:

- `NONE` sees every fault that breaks the chain, a position or a token (page tables, pages
  freed or swapped, swapped tokens) and no change to KV bytes at all.
- `PARTIAL` reads the first 16 bytes of each slot: it sees a changed KV byte only there (about
  half of the drawn bytes).
- `ALL` reads every byte and sees every class the canary can see at all.
- A KV store that lands in the wrong slot is seen at the slot it overwrote (a whole row of
  fresh bytes: `PARTIAL` sees it too); the slot it missed keeps its old bytes, and its write
  fingerprints them as they are.
- A changed KV byte is found by a `TAIL` launch or the sweep, never by a `HEAD` launch, which
  has no real-KV source; a changed page table, a freed page or a swapped token is found first
  by the `HEAD` launches of the next forward, before the forward runs on it.
- A dropped KV store is never seen, in any mode: a write fingerprints the bytes a slot holds
  after the forward, so the record agrees with the stale bytes. The canary tells that a slot's
  KV changed after its record was written, not that the forward stored the right bytes.
- A change to a cached slot no request uses is seen only by the cache sweep (step 5), or by a
  request that shares the prefix later: without sweeps it can stay unseen until the slot is
  evicted.
- Under a sliding window a fault can leave the window before any verify reads it, and a slot
  named twice with identical records (the same tokens at the same positions) is harmless and
  not reported: those histories count as not reported.
"""


def _cell_of_trials(kind: str, label: str, results: list, why: str, problems: list) -> str:
    """One table cell over ``results`` (``label`` names its row and column in a problem)."""
    for r in results:
        if r is not None:
            problems += [f"{kind}, {label}: {p}" for p in r[2]]
    return cell(results, why)


def _rows_of(kind: str, problems: list) -> tuple[str, str, str | None, str]:
    """A fault class's row in each table: by hash mode, by forward mode, with SGLang's byte
    (None: the class flips no byte) and as a server goes on."""
    cls = FAULTS[kind]
    cells = [
        _cell_of_trials(
            kind,
            MODES[mode],
            [trial(kind, mode, i) for i in range(TRIALS)],
            cls.why_never(mode, cls.settle_mode),
            problems,
        )
        for mode in RealKvHashMode
    ]
    by_mode = [
        _cell_of_trials(
            kind,
            f"ALL, {settle_mode}",
            [trial(kind, RealKvHashMode.ALL, i, settle_mode=settle_mode) for i in range(TRIALS)],
            cls.why_never(RealKvHashMode.ALL, settle_step(settle_mode).mode),
            problems,
        )
        for settle_mode in SETTLE_MODES
    ]
    sglang = None
    if cls.flips_byte:
        sglang = [
            _cell_of_trials(
                kind,
                f"{MODES[mode]}, byte 0",
                [trial(kind, mode, i, SGLANG_BYTE) for i in range(TRIALS)],
                cls.why_never(mode),
                problems,
            )
            for mode in RealKvHashMode
        ]
    served = [
        serving_cell([serving(kind, mode, i) for i in range(TRIALS)], cls.why_never(mode))
        for mode in RealKvHashMode
    ]
    row = f"| `{kind}`: {cls.description} | " + " | ".join(cells) + " |"
    return (
        row,
        f"| `{kind}` | " + " | ".join(by_mode) + " |",
        None if sglang is None else f"| `{kind}` | " + " | ".join(sglang) + " |",
        f"| `{kind}` | " + " | ".join(served) + " |",
    )


def render() -> tuple[str, list[str]]:
    """The document and the problems met (a due report missing, a report on a correct history)."""
    problems: list[str] = []
    rows, mode_rows, sglang_rows, serving_rows = [], [], [], []
    for kind in FAULT_KINDS:
        row, mode_row, sglang_row, serving_row = _rows_of(kind, problems)
        rows.append(row)
        mode_rows.append(mode_row)
        if sglang_row is not None:
            sglang_rows.append(sglang_row)
        serving_rows.append(serving_row)
    text = DOCUMENT.format(
        TRIALS=TRIALS,
        EVENTS=EVENTS,
        SWEEP_EVERY=SWEEP_EVERY,
        SGLANG_BYTE=SGLANG_BYTE,
        rows="\n".join(rows),
        serving_rows="\n".join(serving_rows),
        sglang_rows="\n".join(sglang_rows),
        mode_rows="\n".join(mode_rows),
        settle_modes=", ".join(f"`{m}`" for m in SETTLE_MODES),
        settle_headers=" | ".join(f"`{m}`" for m in SETTLE_MODES),
    )
    return text, problems


#: The probe :func:`inputs` runs in a fresh interpreter: this module imported and one trial run,
#: then the files of every module loaded, and the library versions the trials depend on.
_PROBE = """
import json, platform, sys
import numpy, torch
import tools.detection_table as dt
dt.trial(dt.FAULT_KINDS[0], 0, 0)
files = sorted({getattr(m, "__file__", None) or "" for m in list(sys.modules.values())})
versions = [platform.python_version_tuple()[:2], numpy.__version__, torch.__version__]
print(json.dumps({"files": files, "versions": versions}))
"""


def inputs() -> tuple[list[str], list[str]]:
    """What every trial is a function of: the repository's modules this one loads (paths from
    the root, sorted), found in a fresh interpreter, and the versions of Python (major and
    minor), numpy and torch."""
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, capture_output=True, text=True, check=True
    )
    probe = json.loads(out.stdout.splitlines()[-1])
    files = []
    for name in probe["files"]:
        path = Path(name).resolve() if name else None
        if path and path.is_file() and ROOT in path.parents and ".venv" not in path.parts:
            files.append(path.relative_to(ROOT).as_posix())
    return sorted(set(files)), probe["versions"]


def inputs_digest() -> str:
    """The sha256 of :func:`inputs`: each module's path and text, and the versions."""
    files, versions = inputs()
    h = hashlib.sha256(json.dumps(versions).encode())
    for name in files:
        h.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return h.hexdigest()


#: The document's last line: the digests of its inputs and of the text above the line.
STAMP = "<!-- generated from inputs sha256:{inputs}; text sha256:{text} -->\n"
STAMP_RE = re.compile(r"<!-- generated from inputs sha256:(\w+); text sha256:(\w+) -->\n\Z")


def stamped(text: str) -> str:
    """``text`` with its stamp."""
    digest = hashlib.sha256(text.encode()).hexdigest()
    return text + STAMP.format(inputs=inputs_digest(), text=digest)


def stamp_holds(document: str) -> bool:
    """Whether ``document`` ends with a stamp whose text digest is its text's and whose inputs
    digest is today's inputs'."""
    found = STAMP_RE.search(document)
    if found is None:
        return False
    text = document[: found.start()]
    if hashlib.sha256(text.encode()).hexdigest() != found.group(2):
        return False
    return found.group(1) == inputs_digest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the document is out of date"
    )
    parser.add_argument(
        "--full", action="store_true", help="with --check: run every trial whatever the stamp"
    )
    args = parser.parse_args(argv)
    if args.full and not args.check:
        parser.error("--full goes with --check")
    current = DOC.read_text() if DOC.exists() else None
    if args.check and not args.full and current is not None and stamp_holds(current):
        print(f"{DOC.name}: its inputs are unchanged since it was generated (--full reruns)")
        return 0
    text, problems = render()
    for line in problems:
        print(f"detection_table: {line}", file=sys.stderr)
    if problems:
        return 1
    text = stamped(text)
    if args.check:
        if current != text:
            print(
                f"{DOC.name} is out of date: run python -m tools.detection_table", file=sys.stderr
            )
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
