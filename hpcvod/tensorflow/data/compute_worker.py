"""``python -m hpcvod.tensorflow.data.compute_worker [--dispatchers N] [--dispatcher-side compute|training]
[--timeout S] CONFIG.json``, on every rank of the compute job (``hpcvod run -np 4 ...``, ``srun``, ``mpirun``).

``main(dispatchers, dispatcher_side, configfile, timeout)`` is Horovod's signature (e.g. in a thread of a training
process); it returns once ``config.compute_client().shutdown()`` was called. ``main(argv)`` is the command line."""

import sys

from hpcvod.frameworks.tensorflow.compute_job import main  # noqa: F401 - Horovod: compute_worker.main

if __name__ == "__main__":
    sys.exit(main())
