"""Tests of reference, the numpy oracle, against the contract's vectors and its own laws."""
