"""`python -m microbench` is the `infercomm` command."""

import sys

from microbench.cli import main

sys.exit(main())
