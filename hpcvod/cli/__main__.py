"""``python -m hpcvod.cli ARGS...``: the ``hpcvod`` command."""

import sys

from hpcvod.cli import main

sys.exit(main())
