"""Worked examples of pointing the conformance suite at an implementation."""
