"""The SGLang legs: SGLang's own canary runtime, from the installed wheel, over the engine
model's histories (``python -m conformance.sglang_runtime`` and ``python -m
conformance.sglang_manager``, whose docstrings say what each runs and what stands in).

One module a concern, each importing only those above it in this list:

- ``loading``: SGLang's modules, loaded without its serving stack, and the stand-ins of its
  modules (``sglang.srt.utils``, the radix-cache walker, torch's pinned memory on a CPU build);
- ``histories``: the engine histories, their engines and every seed (``SEEDS``), and how a run
  counts a step (a step label);
- ``standins``: the stand-ins of SGLang's classes (``ForwardBatch``, the radix cache, the token
  oracle), each filled from the engine model;
- ``compare``: SGLang's ``PlanInput``, expected inputs and sweep plan against the engine
  model's;
- ``splice``: a PD transfer over SGLang's spliced buffer list;
- ``graphs``: a forward SGLang runs as a CUDA graph replay, captured and replayed as its
  decode graph runner does (over ``conformance.graph_capture``);
- ``manager_run``: SGLang's per-forward runtime beside the reference, step by step;
- ``trials``: faults made after a warm-up, by SGLang's perturbations or the engine model's
  fault classes, and the one judge of them all;
- ``fired``: the table of the checks SGLang's runtime fired, and the README's held to it.
"""
