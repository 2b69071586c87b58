"""`python -m threadrun`: the `threadrun` command."""

import sys

from threadrun.cli import main

sys.exit(main())
