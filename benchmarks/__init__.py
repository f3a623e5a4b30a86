"""pytest-benchmark benchmarks of the canary, its torch backend and the reference (see README.md).

Run them explicitly (``pytest benchmarks``); ``pytest`` alone runs the self-tests only.
"""
