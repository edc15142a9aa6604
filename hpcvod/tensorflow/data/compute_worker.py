"""``python -m hpcvod.tensorflow.data.compute_worker [--dispatchers N] [--dispatcher-side compute|training]
[--timeout S] CONFIG.json``, on every rank of the compute job (``hpcvod run -np 4 ...``, ``srun``, ``mpirun``)."""

import sys

from hpcvod.frameworks.tensorflow.data_service import main

if __name__ == "__main__":
    sys.exit(main())
