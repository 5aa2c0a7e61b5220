"""paralleljob's bundled DeepSpeed 3D trainer: a GPT trained with pipeline x tensor x data parallelism.

Run once per process by torchrun as `python -m paralleljob_trainer`; see `cli` for the options and
docs/trainer.md for the design.
"""

__version__ = "0.1.0"
