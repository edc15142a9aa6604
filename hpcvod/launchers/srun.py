"""srun: Slurm starts the ranks itself; the --mpi= plugin must match the MPI (a wrong one starts N one-rank worlds without a word: docs/sites.md)."""

from __future__ import annotations

from hpcvod.launchers.base import LaunchLine, Launcher, LaunchRequest, register


@register
class SrunLauncher(Launcher):
    name = "srun"
    kinds = ("srun",)
    local_mpi = False  # Slurm starts the ranks: the site names the flavour
    scheduler_own = True
    het_groups = True

    def line(self, req: LaunchRequest) -> LaunchLine:
        argv = [req.executable or "srun"]
        if req.het_group is not None:
            argv.append(f"--het-group={req.het_group}")
        if req.mpi_plugin:
            argv.append(f"--mpi={req.mpi_plugin}")
        argv += [f"--nodes={req.nodes}", f"--ntasks={req.world_size}", f"--ntasks-per-node={req.tasks_per_node}",
                 # since Slurm 22.05 srun no longer inherits --cpus-per-task from sbatch
                 f"--cpus-per-task={req.cpus_per_task}",
                 "--kill-on-bad-exit=1"]
        argv += list(req.srun_container_args) + list(req.extra_args)
        env = {}
        if self.flavour == "intelmpi" and req.pmi_library:
            env["I_MPI_PMI_LIBRARY"] = req.pmi_library  # Intel MPI talks PMI-2 to srun through this library
        return LaunchLine(argv, env)
