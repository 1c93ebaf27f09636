"""Mutated copies of the tests' own machines, written on demand into a test's tmp_path."""
