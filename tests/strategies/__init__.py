"""Tests of the Hypothesis strategies: their arguments, their draws and how they shrink."""
