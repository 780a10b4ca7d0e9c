"""``python -m psij``: the same command as the ``psij`` console script (see :mod:`psij.cli`)."""

import sys

from psij.cli import main

sys.exit(main())
