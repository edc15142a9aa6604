"""The Hydra process manager's mpiexec, shared by MPICH and Intel MPI (it passes the whole environment on)."""

from __future__ import annotations

from hpcvod.launchers.base import LaunchLine, Launcher, LaunchRequest, register


@register
class HydraLauncher(Launcher):
    name = "hydra"
    kinds = ("mpirun", "mpiexec")
    flavours = frozenset({"mpich", "intelmpi"})

    def line(self, req: LaunchRequest) -> LaunchLine:
        argv = [req.executable or "mpiexec", "-n", str(req.world_size)]
        if not req.single_host:
            if req.tasks_per_node:
                argv += ["-ppn", str(req.tasks_per_node)]
            if req.hostfile:
                argv += ["-f", req.hostfile]
            if req.hosts:
                argv += ["-hosts", req.hosts]
        argv += list(req.extra_args)
        return LaunchLine(argv)
