"""`python -m gate_service.cli ...` is the `gate` command."""

import sys

from . import main

sys.exit(main())
