"""The `paralleljob` command line (also installed as the kubectl plugin `kubectl-paralleljob`).

A thin dispatcher: each subcommand lives in `paralleljob.commands.<name>` and registers its own arguments.
Exit codes are shared by all of them: 0 success, 1 invalid input or failure, 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from paralleljob.commands import SUBCOMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paralleljob",
        description="Validate, plan, run and operate 3D-parallel (pipeline x tensor x data) DeepSpeed jobs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in SUBCOMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
