"""`submit --min-nodes M` (issue 28 item 3, docs/elastic.md "Batch jobs"): the rendered scripts (golden files: a
Slurm job started by Open MPI's mpirun with --no-kill, a PBS job with tolerate_node_failures), and the refusals
(one line, exit status 2, nothing submitted), and an MPICH job under srun, whose script runs the elastic driver
that restarts the world. The jobs themselves losing a node run in tests/cluster/test_slurm_elastic.py (Open MPI)
and tests/cluster/test_slurm_elastic_restart.py (MPICH).

Regenerate these goldens after an intended change with
    HPCVOD_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/submission/test_elastic_submit.py
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from submission_helpers import GOLDEN, NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import JobSpec
from hpcvod.schedulers import scheduler_for

REGEN = os.environ.get("HPCVOD_REGEN_GOLDEN") == "1"
ARGS = ("--epochs", "3", "--note", "it's a $(test); `x` \"y\"")
# site -> (nodes, GPUs per node, tasks per node, --min-nodes)
CASES = {"slurm-sandbox-mpirun": (2, 0, 2, 1), "pbs-ib-openmpi": (4, 4, None, 3), "slurm-sandbox": (2, 0, 2, 1)}
RESTARTING = {"slurm-sandbox"}   # MPICH under srun: the script runs the elastic driver (launchers/elastic_batch.py)


@pytest.mark.parametrize("site", ["slurm-sandbox-intelmpi", "slurm-sandbox-openmpi"])
def test_every_flavour_started_by_srun_restarts_its_world(site: str) -> None:
    """Intel MPI (no ULFM) and Open MPI under srun (whose pmix plugin ends the step at a failure) restart too."""
    site_ = load_site(site, environ=NO_USER_CONFIG)
    spec = JobSpec(program="train.py", args=(), nodes=2, gpus_per_node=0, tasks_per_node=2, min_nodes=1)
    plan = resolve(spec, site_, golden_host("openmpi", gpus=0), ["hpcvod", "submit"])
    assert plan.elastic_restart and plan.launch_argv[1:4] == ("-m", "hpcvod.launchers.elastic_batch", "--nodes")
    assert "srun" in plan.launch_argv and "--with-ft" not in plan.launch_argv


def rendered(site_name: str) -> str:
    nodes, gpus, tasks, least = CASES[site_name]
    site = load_site(site_name, environ=NO_USER_CONFIG)
    spec = JobSpec(program="train.py", args=ARGS, nodes=nodes, gpus_per_node=gpus, tasks_per_node=tasks,
                   min_nodes=least)
    command = ["hpcvod", "submit", "--site", site_name, "--nodes", str(nodes), "--min-nodes", str(least),
               "train.py", *ARGS]
    plan = resolve(spec, site, golden_host("openmpi", gpus=gpus), command)
    return render(plan, scheduler_for(site).template)


@pytest.mark.parametrize("site", sorted(CASES))
def test_golden_elastic_scripts(golden_workdir: Path, site: str) -> None:
    nodes, gpus, *_ = CASES[site]
    text = rendered(site)
    path = GOLDEN / "elastic" / f"{site}-{nodes}n{gpus}g.sh"  # a folder of their own: test_golden.py owns *.sh
    if REGEN:
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with HPCVOD_REGEN_GOLDEN=1"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    # what makes it elastic, once each: the scheduler keeps the job, mpirun runs the ranks under ULFM, and the
    # ranks get the minimum and the events file (forwarded by mpirun to every node)
    keep = "#SBATCH --no-kill" if site.startswith("slurm") else "#PBS -W tolerate_node_failures=all"
    assert text.count(keep) == 1
    assert f"export HPCVOD_ELASTIC_MIN_NODES={CASES[site][3]}\n" in text
    if site in RESTARTING:   # the driver runs the srun line once per world; no mpirun, no exit-record check
        launch = next(line for line in text.splitlines() if "-m hpcvod.launchers.elastic_batch " in line)
        assert launch.split(" -- ")[0].endswith(f"--nodes {nodes} --min-nodes {CASES[site][3]} --tasks-per-node 2")
        assert " -- srun --mpi=pmi2 " in launch and "--with-ft" not in text
        assert "mpirun ended the elastic job" not in text
        return
    launch = next(line for line in text.splitlines() if " --with-ft ulfm " in line)
    for name in ("OMPI_MCA_async_mpi_finalize", "HPCVOD_ELASTIC_MIN_NODES", "HPCVOD_ELASTIC_EVENTS"):
        assert f"-x {name} " in launch
    assert 'export HPCVOD_ELASTIC_EVENTS="$HPCVOD_JOB_DIR/elastic-events.jsonl"\n' in text


@pytest.mark.parametrize("args,message", [
    (("--site", "slurm-sandbox-mpirun", "--nodes", "2", "--min-nodes", "3"),
     "--min-nodes 3: more than the job's --nodes 2; expected 1 to 2"),
    (("--site", "slurm-sandbox-mpirun", "--nodes", "2", "--min-nodes", "0"),
     "--min-nodes 0: expected a whole number of nodes from 1 to --nodes (2)"),
    (("--site", "slurm-sandbox-mpirun", "--nodes", "2", "--min-nodes", "-1"),
     "--min-nodes -1: expected a whole number of nodes from 1 to --nodes (2)"),
    (("--site", "slurm-sandbox-mpirun", "--nodes", "2", "--min-nodes", "two"),
     "argument --min-nodes: invalid int value: 'two'"),
    (("--site", "pbs-roce-intelmpi", "--nodes", "2", "--min-nodes", "1"),
     "--min-nodes 1: site 'pbs-roce-intelmpi' runs intelmpi, which has no ULFM; its elastic batch jobs restart the "
     "world with srun inside a Slurm allocation, and this site uses pbs"),
    (("--site", "sge-sandbox", "--min-nodes", "1"),
     "--min-nodes 1: site 'sge-sandbox': Grid Engine ends a parallel job when one of its hosts goes down"),
    (("--site", "local", "--min-nodes", "1"),
     "--min-nodes 1: site 'local': the local site runs every rank on this machine: there is no node to lose"),
    (("--site", "pbs-ib-openmpi", "--nodes", "2", "--min-nodes", "1", "--data-service-nodes", "1"),
     "--min-nodes 1: not with --data-service-nodes"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_submitted(cli, tmp_path: Path, args: tuple[str, ...],
                                                            message: str) -> None:
    (tmp_path / "train.py").write_text("")
    # a dry run: a refusal that stopped working must not queue jobs on the test cluster
    code, out, err = cli("submit", *args, "--dry-run", "train.py")
    assert code == 2, out + err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "hpcvod-jobs").exists()


def test_the_elastic_variables_cannot_be_set_with_env(cli, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    for name in ("HPCVOD_ELASTIC_MIN_NODES", "HPCVOD_ELASTIC_EVENTS"):
        code, _, err = cli("submit", "--site", "slurm-sandbox", "--env", f"{name}=1", "--dry-run", "train.py")
        assert code == 2 and f"--env {name}: set by hpcvod itself" in err, err


def test_the_python_api_takes_min_nodes() -> None:
    from hpcvod.jobs.python_api import HpcvodExecutor
    from hpcvod.sites import UserError

    script = HpcvodExecutor(site="pbs-ib-openmpi", nodes=2, gpus_per_node=4,
                            min_nodes=1)._make_submission_file_text("", "")
    assert "#PBS -W tolerate_node_failures=all" in script and " --with-ft ulfm " in script
    with pytest.raises(UserError, match=r"^--min-nodes 3: more than the job's --nodes 2; expected 1 to 2$"):
        HpcvodExecutor(site="pbs-ib-openmpi", nodes=2, gpus_per_node=4, min_nodes=3)._make_submission_file_text("", "")


@pytest.mark.parametrize("name,value,line", [
    ("HOROVOD_ELASTIC_TIMEOUT", "soon", "HOROVOD_ELASTIC_TIMEOUT='soon': expected a time in seconds"),
    ("HPCVOD_ELASTIC_COOLDOWN_RANGE", "60", "HPCVOD_ELASTIC_COOLDOWN_RANGE='60': expected two numbers of seconds, "
                                            "`MIN MAX`"),
])
def test_the_elastic_batch_driver_refuses_bad_settings_in_one_line(monkeypatch, capsys, name: str, value: str,
                                                                    line: str) -> None:
    """Before any world starts (and before Slurm is asked for hosts): exit 2, one line."""
    from hpcvod.launchers import elastic_batch

    for unset in ("HOROVOD_ELASTIC_TIMEOUT", "HPCVOD_ELASTIC_COOLDOWN_RANGE"):
        monkeypatch.delenv(unset, raising=False)
    monkeypatch.setenv(name, value)
    code = elastic_batch.main(["--nodes", "2", "--min-nodes", "1", "--tasks-per-node", "1", "--", "srun", "--",
                               "python", "train.py"])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"hpcvod: {line}"
