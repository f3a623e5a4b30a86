"""Tests of the engine model: its invariants over any history, and its fault classes."""
