"""Loaded by every Python process of an ``hpcvod run --as-horovod`` run (hpcvod/as_horovod): ``import horovod.X``
loads ``hpcvod.X``; then the sitecustomize this folder hides runs."""

from hpcvod import as_horovod

as_horovod.install()
as_horovod.run_hidden_sitecustomize()
