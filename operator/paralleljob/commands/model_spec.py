"""`paralleljob model-spec DIR`: print the spec.model section of a Hugging Face folder, so nobody types a shape.

The section comes from the folder's config.json (LlamaForCausalLM or GPT2LMHeadModel,
`paralleljob_contract.hf_config`), with `pretrained.path` set to DIR; precision and sequenceLength are the
job's own choice (sequenceLength printed as the model's context length).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from paralleljob_contract import hf_config
from paralleljob_contract.errors import ContractError


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "model-spec",
        help="print the spec.model section of a Hugging Face folder",
        description="Print the spec.model section (YAML) of a LlamaForCausalLM or GPT2LMHeadModel folder, with "
        "pretrained.path set to it. Exit 1 when the folder cannot be mapped.",
    )
    parser.add_argument("folder", type=Path, metavar="DIR", help="folder with config.json and *.safetensors")
    parser.set_defaults(run=run)


def section(folder: Path) -> dict[str, Any]:
    """The `model:` mapping of a ParallelJob's spec for `folder`; ContractError when it cannot be mapped."""
    config = hf_config.read(folder)
    hf_config.extras(config)  # refuses settings the trainer cannot reproduce, as the trainer would
    return {**hf_config.spec_model(config), "pretrained": {"path": str(folder.resolve())}}


def run(args: argparse.Namespace) -> int:
    try:
        model = section(args.folder)
    except (ContractError, KeyError, ValueError) as error:
        print(f"paralleljob model-spec: error: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump({"model": model}, sort_keys=False))
    return 0
