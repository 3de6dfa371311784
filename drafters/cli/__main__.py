"""`python -m drafters.cli COMMAND ARGS`."""

import sys

from drafters.cli import main

sys.exit(main())
