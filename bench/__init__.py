"""The benchmarks: each prints its figures; bench/README.md lists them. Run one as `python -m bench.NAME`."""
