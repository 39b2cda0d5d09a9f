"""Benchmarks run by `make bench` (bench/run.sh); importable so tests can use the generator."""
