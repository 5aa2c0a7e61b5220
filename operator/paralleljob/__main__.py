"""`python -m paralleljob` is the `paralleljob` command."""

import sys

from paralleljob.cli import main

sys.exit(main())
