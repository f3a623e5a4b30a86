"""Tests of canary, the Triton implementation: binding, constants, hashing, launch checks, layouts, compiled code, GPU runs."""
