"""Efficiency figures written once in the contract: the peak of a GPU product, TFLOP/s per GPU, MFU only where
the peak is known, and the planner's table agreeing with the trainer's."""

from __future__ import annotations

import pytest

from paralleljob.planning.costmodel import GPU_PROFILES, CostModel
from paralleljob_contract import efficiency


@pytest.mark.parametrize(
    ("device", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA-GB200", 2500.0),
        ("NVIDIA B200", 2250.0),
        ("nvidia-a100-sxm4-80gb", 312.0),
        ("cpu", None),
        ("", None),
    ],
)
def test_the_peak_comes_from_the_product_and_is_unknown_elsewhere(device: str, peak: float | None) -> None:
    assert efficiency.peak_tflops_for(device) == peak


def test_mfu_is_absent_where_the_peak_is_unknown_and_tflops_are_still_reported() -> None:
    flops, seconds, devices = 8e12, 2.0, 4
    assert efficiency.tflops_per_gpu(flops, seconds, devices) == pytest.approx(1.0)
    assert efficiency.mfu(flops, seconds, devices, None) is None
    assert efficiency.mfu(flops, seconds, devices, 10.0) == pytest.approx(0.1)


def test_the_planners_peaks_are_the_contracts_table() -> None:
    for profile in GPU_PROFILES:
        assert CostModel().peak_flops(profile.match) == efficiency.PEAK_BF16_TFLOPS[profile.match] * 1e12


def test_the_median_step_ignores_one_slow_step() -> None:
    assert efficiency.median_seconds([1.0, 1.1, 9.0]) == 1.1
    assert efficiency.median_seconds([]) is None
