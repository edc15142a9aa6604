"""``python -m hpcvod.runner FOLDER``: one rank of ``hpcvod.run`` (hpcvod/runner/__init__.py)."""

import sys

from hpcvod.runner import rank_main

sys.exit(rank_main(sys.argv[1]))
