"""Ratchet's benchmarks: every figure a ratio against a floor measured in the same run.

`python -m bench` (or `make bench`) writes `bench/RESULTS.md` and `bench/results.json`;
`--quick` is a one-minute version for smoke tests. See `bench/README.md` for how to read them.
"""
