"""Tests of the tools: the compile check, the GPU-type table and the benchmarks' helpers."""
