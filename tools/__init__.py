"""Tools around the implementations: the GPU-type table, the compile check for every GPU
target, and the scripts a GPU host runs (``gpu_check.sh``, ``check_gpu_type.py``,
``sanitizer_run.py``). Not part of either implementation, and not of the suite."""
