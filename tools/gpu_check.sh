#!/usr/bin/env bash
# One pass over a GPU host, in under 9 minutes:
#
#   1. environment: nvidia-smi, Python package versions, the GPU torch sees
#   2. gpu-label:   tools/check_gpu_type.py $GPU_LABEL (default cuda-h200)
#   3. compile:     every kernel variant compiled for this GPU's own target
#                   (python -m tools.compile_check --target local)
#   4. conformance: the conformance suite on cuda, ci profile without shrinking (JSON report saved)
#   5. gpu-tests:   tests/canary/test_gpu.py: compiled kernels equal interpreted ones, bit for bit
#   6. sanitizer:   one short fingerprint/write/verify run under compute-sanitizer memcheck
#                   (skipped, and said so, when compute-sanitizer is not on PATH)
#   7. benchmarks:  the GPU benchmarks, short rounds (pytest-benchmark JSON saved), then a
#                   compact GB/s table
#
# The host needs torch, Triton, Hypothesis, pytest and pytest-benchmark already installed
# (it may have no network): nothing is installed; its Python runs from the repository root
# with PYTHONPATH at the root (the suite's conftest.py loads its plugin). Results and full
# logs go to the folder given as the first argument (default: gpu_check_results/ in the
# repository, which git ignores). Every
# stage has its own time limit and a failing stage does not stop the next; the exit status
# is the number of failed stages (0: all passed).
#
#   bash tools/gpu_check.sh [RESULTS_DIR]
#
# Environment: GPU_LABEL, PYTHON (default: python, else python3), GPU_CHECK_BUDGET_S
# (default 540: the whole run stays below that many seconds).
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
results="${1:-gpu_check_results}"
mkdir -p "$results"
py="${PYTHON:-$(command -v python || command -v python3)}"
# the repository root, absolute, so that subprocesses started elsewhere import it too
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# no .pyc and no pytest cache left in the working tree
export PYTHONDONTWRITEBYTECODE=1
budget_end=$((SECONDS + ${GPU_CHECK_BUDGET_S:-540}))
kill_after=10
tail_lines=25
failures=0
summary=()

# run_stage NAME LIMIT_S COMMAND...: run with a time limit (SIGINT first, so pytest still
# writes its reports), full output to $results/NAME.log, its tail to the terminal.
run_stage() {
    local name=$1 limit=$2
    shift 2
    local left=$((budget_end - SECONDS - kill_after))
    if [ "$left" -lt "$limit" ]; then limit=$left; fi
    if [ "$limit" -lt 5 ]; then
        echo "=== $name: SKIPPED, no time left in the budget"
        summary+=("$(printf '%-12s %-10s %5s' "$name" "skipped" "-")")
        failures=$((failures + 1))
        return
    fi
    local log="$results/$name.log" start=$SECONDS status=0
    echo "=== $name (limit ${limit}s): $*"
    timeout --signal=INT --kill-after="$kill_after" "$limit" "$@" >"$log" 2>&1 || status=$?
    tail -n "$tail_lines" "$log" | cut -c1-200
    local verdict="passed"
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
        verdict="TIMEOUT"
    elif [ "$status" -ne 0 ]; then
        verdict="FAILED($status)"
    fi
    [ "$status" -eq 0 ] || failures=$((failures + 1))
    summary+=("$(printf '%-12s %-10s %4ss' "$name" "$verdict" "$((SECONDS - start))")")
    echo "=== $name: $verdict after $((SECONDS - start))s (log: $log)"
}

environment() {
    if command -v nvidia-smi >/dev/null; then
        nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.memory \
            --format=csv
    elif command -v rocm-smi >/dev/null; then
        rocm-smi --showproductname --showdriverversion
    else
        echo "no nvidia-smi or rocm-smi on PATH"
    fi
    "$py" - <<'EOF'
import importlib.metadata as metadata
import platform

for name in ("torch", "triton", "numpy", "hypothesis", "pytest", "pytest-benchmark",
             "pytest-xdist"):
    try:
        version = metadata.version(name)
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    print(f"{name:18} {version}")
print(f"{'python':18} {platform.python_version()}")
import torch

print(f"torch.version.cuda {torch.version.cuda}  hip {getattr(torch.version, 'hip', None)}")
print(f"cuda available     {torch.cuda.is_available()}, {torch.cuda.device_count()} device(s)")
for index in range(torch.cuda.device_count()):
    props = torch.cuda.get_device_properties(index)
    print(f"cuda:{index}             {props.name}, sm {props.major}.{props.minor}, "
          f"{props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} SMs")
EOF
}

export py
export -f environment
run_stage environment 20 bash -c environment
run_stage gpu-label 15 "$py" tools/check_gpu_type.py "${GPU_LABEL:-cuda-h200}"
run_stage compile 60 "$py" -W ignore::UserWarning -m tools.compile_check --target local \
    --asm-dir "$results/asm"
# no shrinking: on a GPU the suite runs `ci` at full size, and a failure shrinking for 20 s
# cost the H200 runs of 2026-12-04 the end of the suite; each failure still shows its example
run_stage conformance 240 "$py" -m pytest conformance -p no:cacheprovider -q \
    --canary-device cuda --hypothesis-profile ci --canary-no-shrink \
    --canary-report "$results/conformance-report.json"
run_stage gpu-tests 45 "$py" -m pytest tests/canary/test_gpu.py -p no:cacheprovider -q
if command -v compute-sanitizer >/dev/null; then
    run_stage sanitizer 60 compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$py" tools/sanitizer_run.py
else
    echo "=== sanitizer: compute-sanitizer is not on PATH; no memcheck run"
    summary+=("$(printf '%-12s %-10s %5s' sanitizer "absent" "-")")
fi
run_stage benchmarks 120 "$py" -m pytest benchmarks -p no:cacheprovider -m gpu \
    --bench-quick --benchmark-json "$results/gpu-bench.json" \
    --benchmark-columns=min,median,max,rounds

echo
echo "=== GPU throughput ($results/gpu-bench.json)"
if [ -s "$results/gpu-bench.json" ]; then
    "$py" -m benchmarks.report "$results/gpu-bench.json" | cut -c1-160
else
    # on a GPU machine every GPU benchmark runs: none at all is a failure, not a pass
    echo "no benchmark results were written"
    failures=$((failures + 1))
fi
echo
echo "=== summary (results and logs in $results)"
printf '%s\n' "${summary[@]}"
echo "failed stages: $failures"
exit "$failures"
