"""`python -m paralleljob_trainer`: the entry point torchrun starts on every rank."""

import sys

from paralleljob_trainer.cli import main

sys.exit(main())
