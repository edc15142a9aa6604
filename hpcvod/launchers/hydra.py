"""The Hydra process manager's mpiexec, shared by MPICH and Intel MPI (it passes the whole environment on)."""

from __future__ import annotations

from hpcvod.launchers import LaunchLine, Launcher, LaunchRequest


class HydraLauncher(Launcher):
    name = "hydra"

    def __init__(self, flavour: str) -> None:
        self.flavour = flavour

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
