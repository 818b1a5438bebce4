"""Ratchet's benchmarks: every figure a ratio against a floor measured in the same run.

`python -m bench` (or `make bench`) writes `bench/RESULTS.md` and `bench/results.json`;
`--quick` is a version of a few minutes, `--smoke` the smallest run that writes every figure (the
tests'). See `bench/README.md` for how to read them.
"""
