"""The benchmarks: each module runs with ``python -m benchmarks.<name>`` from the
project root and writes a JSON of its figures (see benchmarks/README.md)."""
