"""`paralleljob docs`: print the API reference generated from the CRD descriptions (docs/api-reference.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from paralleljob.api import reference


def register(sub: Any) -> None:
    parser = sub.add_parser("docs", help="print the ParallelJob API reference (Markdown) from the CRD descriptions")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    sys.stdout.write(reference.render_reference())
    return 0
