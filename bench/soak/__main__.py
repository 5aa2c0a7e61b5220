"""`python -m bench.soak`: see bench/soak/run.py."""

from bench.soak.run import main

main()
