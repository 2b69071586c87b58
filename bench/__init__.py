"""Benchmarks of threadrun's internals (`make bench`); see bench/README.md."""
