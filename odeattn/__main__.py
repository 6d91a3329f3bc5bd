"""`python -m odeattn`: the odeattn command."""

import sys

from odeattn.cli import main

sys.exit(main())
