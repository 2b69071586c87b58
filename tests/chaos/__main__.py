"""`python -m tests.chaos`: one chaos run (see tests/chaos/harness.py)."""

import sys

from tests.chaos.harness import main

sys.exit(main())
