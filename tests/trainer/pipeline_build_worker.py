"""Builds the one stage of a PP1 x TP1 x DP1 pipeline in a gloo group of one process, with or without the job's
pretrained folder, counting the random draws torch makes meanwhile (tests/trainer/test_pretrained_mapping.py).

argv: the job.json, the output file, `pretrained` or `random`. Writes {"draws": [names], "state": state dict}.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import deepspeed
import torch
from deepspeed.runtime.pipe.topology import ProcessTopology
from torch.overrides import TorchFunctionMode

from paralleljob_contract.jobfile import parse_job_config
from paralleljob_trainer import model

# torch's functions and tensor methods that draw random numbers (nn.init's draw through the tensor methods).
RANDOM = {"rand", "randn", "randint", "randperm", "normal", "normal_", "uniform_", "bernoulli", "bernoulli_"}
RANDOM |= {"random_", "exponential_", "cauchy_", "log_normal_", "geometric_", "multinomial", "trunc_normal_"}


class Draws(TorchFunctionMode):
    """Records the name of every random draw made through torch while it is entered."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(
        self, func: Callable[..., Any], types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        if name in RANDOM:
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def main() -> None:
    job = parse_job_config(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8")))
    folder = job.pretrained if sys.argv[3] == "pretrained" else None
    deepspeed.init_distributed(dist_backend="gloo")
    topology = ProcessTopology(axes=["pipe", "data", "model"], dims=[1, 1, 1])
    with Draws() as draws:
        module = model.build_pipeline(job.model, job.training.seed, topology, pretrained=folder)
    torch.save({"draws": draws.names, "state": module.state_dict()}, sys.argv[2])


if __name__ == "__main__":
    main()
