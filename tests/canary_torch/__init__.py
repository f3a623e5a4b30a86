"""Tests of canary_torch, the second implementation, and of its independence from canary."""
