"""Horovod's ``horovod.mxnet.mpi_ops``: the collectives and the runtime basics, the same objects as
``hpcvod.mxnet`` (whose names are a superset of Horovod's mpi_ops)."""

from hpcvod.common.basics import HorovodBasics as _HorovodBasics
from hpcvod.mxnet import *  # noqa: F401,F403
from hpcvod.mxnet import __all__, __getattr__  # noqa: F401  (reduction ops, lazily)

_basics = _HorovodBasics()
