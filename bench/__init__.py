"""Benchmarks: `make bench` (`python -m bench`). Figures go to BENCHMARKS.md; tests never time."""
