"""One short fingerprint / write / verify run on the GPU, for ``compute-sanitizer``.

    compute-sanitizer --tool memcheck --error-exitcode 1 python tools/sanitizer_run.py

Runs the same small scenario as tests/canary/test_gpu.py (every mode, two writes with
skipped entries and padding, a corrupted verify) on cuda:0 and prints what it ran; the
sanitizer reports any read or write outside an allocation.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root)]
test_canary_gpu = importlib.import_module("tests.canary.test_gpu")
if not torch.cuda.is_available():
    sys.exit("sanitizer_run: no GPU")
results = test_canary_gpu.run_everything("cuda:0")
torch.cuda.synchronize()
print(f"sanitizer_run: {len(results)} results on {torch.cuda.get_device_name(0)}")
