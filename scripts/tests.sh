#!/usr/bin/env bash
# The project's own tests: lint, then the self-tests of canary, reference, strategies and
# the suite itself (which includes running the suite on canary). Extra arguments go to pytest.
source "$(dirname "${BASH_SOURCE[0]}")/_env.sh"
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
run_pytest tests "$@"
