"""`python -m transformers_longspec ...`: the `longspec` command (`transformers_longspec.cli:main`), for environments
where the console script is not on PATH."""

import sys

from .cli import main

sys.exit(main())
