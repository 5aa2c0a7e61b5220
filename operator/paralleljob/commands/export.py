"""`paralleljob export CHECKPOINT --output DIR`: a checkpoint of any layout as one Hugging Face folder.

The merge is the trainer's own (`paralleljob_trainer.export`, which the operator package does not import): it
runs in a child interpreter of this one, as `paralleljob run` starts the trainer. It verifies the checkpoint's
manifest checksums first, then writes config.json, model.safetensors and generation_config.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

TRAINER_EXPORT = "paralleljob_trainer.export"


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "export",
        help="merge a checkpoint (any PP x TP layout) into one Hugging Face folder that transformers loads",
    )
    parser.add_argument(
        "checkpoint", type=Path, help="a global_stepN folder, or a job's checkpoint folder (its latest)"
    )
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = [sys.executable, "-m", TRAINER_EXPORT, str(args.checkpoint), "--output", str(args.output)]
    return subprocess.run(command, check=False).returncode
