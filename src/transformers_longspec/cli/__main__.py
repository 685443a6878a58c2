"""`python -m transformers_longspec.cli ...`: the `longspec` command (e.g. under `accelerate launch -m`)."""

import sys

from . import main

sys.exit(main())
