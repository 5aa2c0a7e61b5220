"""`python -m paralleljob_trainer`: the entry point a rank runs (the in-pod supervisor forks `cli:main` instead)."""

from paralleljob_contract.ranks import exit_without_teardown
from paralleljob_trainer.cli import main

exit_without_teardown(main())
