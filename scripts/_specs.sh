# Sourced by _env.sh and tests.sh: the Python that makes the virtual environment, and what the
# environment installs beside the project (CANARY_TORCH, CANARY_SGLANG: another torch or
# SGLang release).
python="${PYTHON:-python3}"
# the CPU build, so that the project's own `torch>=...` requirement never pulls a CUDA build
torch_spec="${CANARY_TORCH:-torch==2.13.0}"
# SGLang, whose own kv_canary the sglang leg runs, without its serving stack's dependencies
sglang_spec="${CANARY_SGLANG:-sglang==0.5.23}"
