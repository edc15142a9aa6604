"""Horovod's ``horovod.torch.mpi_ops`` (``from horovod.torch.mpi_ops import synchronize``): the collectives and the
runtime basics, the same objects as ``hpcvod.torch`` (whose names are a superset of Horovod's mpi_ops)."""

from hpcvod.common.basics import HorovodBasics as _HorovodBasics
from hpcvod.torch import *  # noqa: F401,F403
from hpcvod.torch import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)

_basics = _HorovodBasics()
