# Sourced by the run scripts: make (or reuse) the project's virtual environment in .venv.
#
# torch is installed first and on its own, from CANARY_TORCH (default: the CPU build
# torch==2.13.0), so that resolving the project's own `torch>=...` requirement never
# pulls a multi-GB CUDA build onto a machine that has no GPU. On a GPU machine set, e.g.,
# CANARY_TORCH="torch==2.11.0" or point CANARY_VENV at an environment that has torch.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${CANARY_VENV:-$root/.venv}"
source "$root/scripts/_specs.sh"

# what the first run installs takes minutes: each step says so as it starts (on stderr)
started=$SECONDS
step() { echo "kv-canary setup ($((SECONDS - started)) s): $*" >&2; }

if [ ! -x "$venv/bin/python" ]; then
    step "making the virtual environment $venv"
    "$python" -m venv "$venv"
fi
py="$venv/bin/python"

stamp="$venv/.canary-installed"
want="$(cat "$root/pyproject.toml"; echo "$torch_spec"; echo "$sglang_spec")"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    step "installing into $venv (once; later runs reuse it): 1/4 pip"
    "$py" -m pip install --quiet --upgrade pip
    if ! "$py" -c "import torch" 2>/dev/null; then
        step "2/4 $torch_spec (the largest step)"
        "$py" -m pip install --quiet "$torch_spec"
    else
        step "2/4 torch: already installed"
    fi
    step "3/4 the project and its tools (Triton, numpy, Hypothesis, pytest, ...)"
    "$py" -m pip install --quiet -e "$root[test]"
    step "4/4 $sglang_spec (without its dependencies, for the SGLang leg)"
    # not byte-compiled: the legs import some fifty of its thousands of files (a few tenths of a
    # second a process, where this machine writes no bytecode), and compiling them all takes
    # 18 s against 6 s (docs/PERFORMANCE.md)
    "$py" -m pip install --quiet --no-deps --no-compile "$sglang_spec"
    printf '%s' "$want" > "$stamp"
    step "installed"
fi

# pytest exits 5 when it collected no test: that is neither a pass nor a failure of the
# code, so the scripts report it and fail rather than let it pass silently.
run_pytest() {
    local status=0
    "$py" -m pytest "$@" || status=$?
    if [ "$status" -eq 5 ]; then
        echo "error: pytest collected no tests ($*)" >&2
        return 1
    fi
    return "$status"
}
