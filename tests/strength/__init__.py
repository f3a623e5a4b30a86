"""Tests of the strength machinery: the known-bad gate and the mutation tools."""
