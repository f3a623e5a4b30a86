#!/usr/bin/env bash
# The project's own tests: lint (ruff, mypy); every kernel variant compiled for sm_90 and
# gfx942; the known-bad gate (the conformance suite must pass on canary and canary_torch and
# fail on every known-bad module); the SGLang leg; then the self-tests of canary, reference,
# strategies, the suite and the benchmarks' helpers. Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
# types of canary, canary_torch, reference and strategies ([tool.mypy] in pyproject.toml)
"$venv/bin/mypy"
# every kernel variant compiled for an NVIDIA and an AMD target, no GPU needed (tox -m compile
# covers the whole matrix): the interpreter runs code that the compiler rejects
"$py" -W ignore::UserWarning -m tools.compile_check --target cuda:90 --target hip:gfx942
"$py" -m strength.gate --jobs 2
# the sglang leg of the installed release (the newest; CANARY_SGLANG picks another): SGLang's
# own kv_canary, which must fail exactly as that release's expectations file says; every release
# runs in `tox -m upstream`
"$py" -m conformance.upstream run
# the self-tests, one pytest-xdist worker per core, each test module on one worker (its
# module-scoped fixtures, such as every kernel compiled, are built once)
run_pytest tests -n auto --dist loadfile "$@"
