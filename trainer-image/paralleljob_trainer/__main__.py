"""`python -m paralleljob_trainer`: the entry point torchrun starts on every rank."""

from paralleljob_trainer.cli import exit_without_teardown, main

exit_without_teardown(main())
