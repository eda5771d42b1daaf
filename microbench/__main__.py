"""`python -m microbench` is the `infercomm` command."""

import sys

from microbench.ranks.rank_stop import at_start

at_start()  # a rank of a --nproc launcher ends by a stop signal from here on

from microbench.cli import main  # noqa: E402

sys.exit(main())
