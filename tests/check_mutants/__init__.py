"""Mutated copies of the shipped machines, written on demand into a test's tmp_path."""
