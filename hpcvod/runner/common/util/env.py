"""``get_env_rank_and_size()``: this process's rank and the world size as its MPI launcher set them, before
``init()`` (Horovod's ``horovod.runner.common.util.env`` helper, which its tf.data service example uses)."""

from __future__ import annotations

import os


def get_env_rank_and_size() -> tuple[int, int]:
    """(rank, size) from the launcher's variables (Open MPI, PMI/Hydra, PMIx, Slurm's srun, or hpcvod's job
    script); (0, 1) outside a launch, as Horovod returns."""
    from hpcvod.launchers.label import rank_of
    from hpcvod.runtime.world import launcher_promises

    rank, promises = rank_of(os.environ), launcher_promises(os.environ)
    if rank.isdigit() and promises:
        return int(rank), promises[0].value
    return 0, 1
