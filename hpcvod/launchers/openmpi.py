"""Open MPI's mpirun/mpiexec (PRRTE in Open MPI 5)."""

from __future__ import annotations

from hpcvod.launchers.base import LaunchLine, Launcher, LaunchRequest, register


@register
class OpenMpiLauncher(Launcher):
    name = "openmpi"
    kinds = ("mpirun", "mpiexec")
    flavours = frozenset({"openmpi"})

    def line(self, req: LaunchRequest) -> LaunchLine:
        argv = [req.executable or "mpirun", "-n", str(req.world_size)]
        env: dict[str, str] = {}
        if req.is_root:
            # Open MPI refuses to run as root without both of these (containers and CI often are root)
            env = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
        if req.single_host:
            argv.append("--oversubscribe")  # more ranks than cores is fine on a workstation
        else:
            if req.tasks_per_node:
                argv += ["--map-by", f"ppr:{req.tasks_per_node}:node"]
            else:  # fill the host list's slots in order, as horovodrun does; slots may exceed cores
                argv += ["--map-by", "slot", "--bind-to", "none"]
            if req.hostfile:
                argv += ["--hostfile", req.hostfile]
            if req.hosts:
                argv += ["--host", req.hosts]
            # remote daemons do not pass the environment on: name every variable the ranks need
            for name in req.forward_env:
                argv += ["-x", name]
        argv += list(req.extra_args)
        return LaunchLine(argv, env)
