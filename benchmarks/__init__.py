"""The benchmarks: each module runs with ``python -m benchmarks.<name> --json PATH`` from the
project root and writes its figures there; ``python -m benchmarks`` runs them all, keeps one
record per benchmark in ``benchmarks/results/`` and renders benchmarks/README.md from them."""
