"""Tests of the conformance suite itself: plugin, reports, expectations, golden vectors, bounds, coverage."""
