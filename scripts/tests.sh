#!/usr/bin/env bash
# The project's own tests: lint (ruff, mypy, and actionlint and zizmor over the workflows);
# every kernel variant compiled for sm_90 and gfx942; the known-bad gate (the conformance suite
# must pass on canary and fail on every known-bad module but one, which the nightly gate kills,
# as it runs the correct variant); the SGLang leg; the installed-package check (the wheel in a fresh environment, the suite's command run
# from an empty folder, where canary_torch, as a file implementation, passes the stored
# vectors: its whole-suite run is the nightly gate's, as .ci/run is near its 12-minute budget,
# docs/PERFORMANCE.md); then the self-tests of canary, reference,
# strategies, the suite, the tools and the benchmarks' helpers. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
source "$root/scripts/_specs.sh"
# the reports the installed-package check compares with, and its own work; gone at the end
work="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
# the installed-package check's first half (tests/installed.py): build the wheel, install it
# into a fresh environment, run the suite's command from an empty folder. It runs in the
# background, beside the single-threaded steps below; its log is shown when it is done. It
# needs a Python with pip and nothing of the project's environment, so where this machine's
# Python has pip it starts before that environment is made: on a fresh clone the two installs,
# each of one core, run side by side.
installed=""
start_installed() {
    "$1" -m tests.installed outside --workdir "$work/installed" --torch "$torch_spec" \
        --sglang "$sglang_spec" --file-run vectors > "$work/installed.log" 2>&1 &
    installed=$!
}
if "$python" -m pip --version > /dev/null 2>&1; then
    start_installed "$python"
fi
source "$root/scripts/_env.sh"
[ -n "$installed" ] || start_installed "$py"
# each step says when it starts, in seconds since the script did: where the time goes
begun=$SECONDS
mark() { echo "=== tests.sh ($((SECONDS - begun)) s): $*" >&2; }
# The project's bytecode, written once for the some three hundred suite runs that follow, forked
# and fresh, each of which would otherwise compile the same hundred modules again (about 0.4 s a
# run, docs/PERFORMANCE.md): the modules, then the suite's test modules as pytest rewrites
# them. Python's own checks (the source's time and size) keep it current; the folders are
# __pycache__, which git ignores. This machine's Python may be told to write no bytecode
# (PYTHONDONTWRITEBYTECODE), and the forked runs write none, so it is written here.
mark "the project's bytecode"
PYTHONDONTWRITEBYTECODE='' "$py" -m compileall -q -j 0 canary canary_torch conformance \
    engine_model reference strategies strength tools tests > /dev/null
PYTHONDONTWRITEBYTECODE='' "$py" -m pytest -q -p no:cacheprovider --co conformance > /dev/null
# the sglang leg of the installed release (the newest; CANARY_SGLANG picks another): SGLang's
# own kv_canary, which must fail exactly as that release's expectations file says; every release
# runs in `tox -m upstream`. One process, in the background too, so that no core idles beside
# the single-process steps below.
# The per-forward manager leg with one fault trial a class and mode here (the README's table of
# the checks that fire, which the leg compares, holds for one trial as for the default two).
# The support matrix's every cell runs nightly; here its install and history cells, one run of
# each option, are a self-test (tests/suite/test_sglang_matrix.py).
# The suite's run on it draws the ``ci`` profile's examples without shrinking its expected
# failures (the ``mutation`` profile: 47 s against 86 s, docs/PERFORMANCE.md); the nightly legs
# shrink them.
CANARY_MATRIX=off CANARY_MANAGER_TRIALS=1 "$py" -m conformance.upstream run --canary-report "$work/sglang.json" -q \
    --hypothesis-profile mutation \
    > "$work/sglang.log" 2>&1 &
sglang=$!
mark "lint: ruff, mypy, actionlint, zizmor"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# types of canary, canary_torch, reference and strategies ([tool.mypy] in pyproject.toml)
"$venv/bin/mypy"
# the workflows of .github/workflows (config .github/actionlint.yaml); zizmor without its
# online audits, which need a GitHub token
"$venv/bin/actionlint"
"$venv/bin/zizmor" --offline --quiet .github/workflows
# every kernel variant compiled for an NVIDIA and an AMD target, no GPU needed (tox -m compile
# covers the whole matrix): the interpreter runs code that the compiler rejects
mark "the compile check"
"$py" -W ignore::UserWarning -m tools.compile_check --target cuda:90 --target hip:gfx942
mark "the known-bad gate"
# Left to the nightly gate, as .ci/run is near its 12-minute budget (docs/PERFORMANCE.md):
# scale_chain_restarts_per_4096_chunk, whose kill needs a prefill of 8192 tokens under the
# interpreter (42 to 66 s of a gate job in clean-clone runs, the dearest of the 70), the two
# verify-kernel mutants whose kills need the engine-scale verify sweeps (scale_verify_*, 14
# and 19 s, the next dearest), and the correct variant correct_ring_claims_reversed (42 to 46 s
# of its listed tests)
# canary's whole-suite run, the longest of all, in two shards of about the same length, so that
# the two jobs end together (strength/shards.py)
"$py" -m strength.gate --jobs 2 --shards 2 --stop-at-kill --leave-out canary_torch \
    --leave-out strength.known_bad.scale_chain_restarts_per_4096_chunk \
    --leave-out strength.known_bad.scale_verify_one_persistent_lap \
    --leave-out strength.known_bad.scale_verify_stops_at_65536_entries \
    --leave-out strength.known_bad.correct_ring_claims_reversed --json "$work/gate.json"
mark "waiting for the SGLang leg"
status=0
wait "$sglang" || status=$?
tail -n 40 "$work/sglang.log"
[ "$status" -eq 0 ] || exit "$status"
mark "waiting for the installed-package check"
wait "$installed" || status=$?
cat "$work/installed.log"
[ "$status" -eq 0 ] || exit "$status"
# the second half: the same counts outside the repository as inside it (the gate's run on
# canary, the sglang leg's)
mark "the installed-package check's counts"
"$py" -m tests.installed compare --workdir "$work/installed" --inside "$work"
# the self-tests, one pytest-xdist worker per core, each test module on one worker (its
# module-scoped fixtures, such as every kernel compiled, are built once)
mark "the self-tests"
run_pytest tests -n auto --dist loadfile "$@"
mark "done"
