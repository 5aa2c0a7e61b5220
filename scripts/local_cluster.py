"""A Kubernetes cluster on this machine, from any folder: `python -m testcluster` (testcluster/__main__.py), whose
docstring says how to start one, fault it and stop it.

    python scripts/local_cluster.py up DIR [--nodes 2] [--gpus-per-node 4]   # prints the kubeconfig's path
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's root, where testcluster is

from testcluster.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
