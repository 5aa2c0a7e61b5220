"""Efficiency of a training step, written once for the planner, the trainer and the operator: the dense bf16
peak of each GPU product the planner knows, TFLOP/s per GPU, MFU, the median step time of a window, and the
planner's promise for a job (`Modeled`: the peak and the modeled step time), which travels to the trainer in
job.json's `modeled` object so that a run reports its measured step time beside the modeled one.

Standard library only. The FLOPs themselves are `paralleljob_contract.model.training_flops`.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from paralleljob_contract.errors import ContractError

# Dense bf16 peak per GPU, TFLOP/s (vendor datasheets). A product is matched by the longest name it contains
# (GB200 before B200), case-insensitively; any other device, a CPU among them, has no known peak.
PEAK_BF16_TFLOPS: Mapping[str, float] = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "H200": 989.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
}


def peak_tflops_for(product: str) -> float | None:
    """The bf16 peak of the GPU product named in `product` (a node label or a CUDA device name), else None."""
    upper = product.upper()
    for name in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if name in upper:
            return PEAK_BF16_TFLOPS[name]
    return None


def tflops_per_gpu(model_flops: float, seconds: float, devices: int) -> float | None:
    """Achieved model TFLOP/s of one device: a step's model FLOPs (no recomputation) over its time and devices."""
    if seconds <= 0 or devices < 1:
        return None
    return model_flops / seconds / devices / 1e12


def mfu(model_flops: float, seconds: float, devices: int, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak; None where the peak is unknown."""
    achieved = tflops_per_gpu(model_flops, seconds, devices)
    if achieved is None or not peak_tflops:
        return None
    return achieved / peak_tflops


def median_seconds(seconds: Iterable[float]) -> float | None:
    """The median of a window of step times (robust to the one slow step a checkpoint or a log line makes)."""
    window = [value for value in seconds if math.isfinite(value)]
    return statistics.median(window) if window else None


@dataclasses.dataclass(frozen=True)
class Modeled:
    """The planner's figures for a job, for the run to report beside its own: the peak of the planned GPU
    product (None when the planner does not know it) and the modeled seconds of one step."""

    step_seconds: float
    peak_tflops: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """job.json's `modeled` object."""
        return {"stepSeconds": self.step_seconds, **({"peakTflops": self.peak_tflops} if self.peak_tflops else {})}


def parse_modeled(section: Any) -> Modeled | None:
    """job.json's optional `modeled` object, validated; None when absent."""
    if section is None:
        return None
    if not isinstance(section, Mapping):
        raise ContractError("modeled: must be an object with stepSeconds and optionally peakTflops")
    step: Any = section.get("stepSeconds")
    peak: Any = section.get("peakTflops")
    if not _positive(step):
        raise ContractError(f"modeled.stepSeconds: must be a positive number, got {step!r}")
    if peak is not None and not _positive(peak):
        raise ContractError(f"modeled.peakTflops: must be a positive number, got {peak!r}")
    return Modeled(float(step), None if peak is None else float(peak))


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
