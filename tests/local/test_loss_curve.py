"""loss.png: the validation curve is drawn beside the training curve when the run evaluated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import image

from paralleljob.local.report import write_loss_curve

TRAINING = [(1, 5.0), (2, 4.0), (3, 3.5), (4, 3.2)]
VALIDATION = [(2, 4.4), (4, 3.9)]
# The validation curve's colour in report._plot.
VALIDATION_RGB = np.array([0xD0, 0x69, 0x4A]) / 255


def _pixels_of_validation_colour(path: Path) -> int:
    pixels = image.imread(path)[..., :3]
    return int(np.sum(np.all(np.abs(pixels - VALIDATION_RGB) < 0.02, axis=-1)))


def test_loss_png_shows_the_validation_curve_beside_the_training_curve(tmp_path: Path) -> None:
    both = write_loss_curve(TRAINING, tmp_path / "both.png", "run", VALIDATION)
    training_only = write_loss_curve(TRAINING, tmp_path / "training.png", "run")
    assert both is not None and training_only is not None
    assert _pixels_of_validation_colour(training_only) == 0
    assert _pixels_of_validation_colour(both) > 100
