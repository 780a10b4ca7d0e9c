"""Suites on the real Slurm and Grid Engine started by tests/setup, and psij-python's own tests
run against this package; each skips when its scheduler is not there."""
