"""Benchmarks: the strategy-quality regression suite (``python -m benchmarks.run``) and search-speed scripts."""
