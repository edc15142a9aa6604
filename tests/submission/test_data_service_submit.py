"""`submit --data-service-nodes N` (issue 14): the rendered scripts (golden files: a Slurm heterogeneous job, a PBS
job with two chunk kinds, the local site's two launches), the refusals (one line, exit status 2, nothing left
behind), and the PBS script's body run as PBS's MOM would (tests/pbs/test_pbs_data_service.py); the real
heterogeneous job runs in tests/cluster/test_slurm_data_service.py.

Regenerate these goldens after an intended change with
    HPCVOD_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/submission/test_data_service_submit.py
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest

from submission_helpers import GOLDEN, NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.plan import resolve
from hpcvod.jobs.render import render
from hpcvod.jobs.spec import DataServiceSpec, JobSpec
from hpcvod.schedulers import scheduler_for
from hpcvod.sites.joboptions import job_options

REGEN = os.environ.get("HPCVOD_REGEN_GOLDEN") == "1"
ARGS = ("--epochs", "3", "--note", "it's a $(test); `x` \"y\"")

# site -> (training nodes, GPUs per node, data service, job options, the command line that asks for it)
CASES = {
    "slurm-ib-openmpi": (2, 4, DataServiceSpec(nodes=2, partition="cpu", tasks_per_node=2),
                         dict(exclusive=True, mem="64G", dependency="afterok:123", mail_type="END",
                              sched_opt=["gres-flags=enforce-binding"]),
                         "--nodes 2 --gpus-per-node 4 --exclusive --mem 64G --dependency afterok:123 --mail-type END "
                         "--sched-opt gres-flags=enforce-binding --data-service-nodes 2 --data-service-partition cpu "
                         "--data-service-tasks-per-node 2"),
    "pbs-ib-openmpi": (2, 4, DataServiceSpec(nodes=2, tasks_per_node=2), dict(mem="64G"),
                       "--nodes 2 --gpus-per-node 4 --mem 64G --data-service-nodes 2 --data-service-tasks-per-node 2"),
    "local": (1, 0, DataServiceSpec(nodes=1, tasks_per_node=2, dispatchers=2, dispatcher_side="training"), {},
              "--nodes 1 --data-service-nodes 1 --data-service-tasks-per-node 2 --data-service-dispatchers 2 "
              "--data-service-dispatcher-side training"),
}


def rendered(site_name: str) -> str:
    nodes, gpus, data_service, options, flags = CASES[site_name]
    site = load_site(site_name, environ=NO_USER_CONFIG)
    spec = JobSpec(program="train.py", args=ARGS, nodes=nodes, gpus_per_node=gpus, options=job_options(options),
                   data_service=data_service)
    if site_name == "local":  # every rank on this machine: the local golden asks for 2 training ranks
        spec = dataclasses.replace(spec, tasks_per_node=2)
    command = ["hpcvod", "submit", "--site", site_name, *flags.split(), "train.py", *ARGS]
    plan = resolve(spec, site, golden_host("openmpi", gpus=gpus), command)
    return render(plan, scheduler_for(site).template)


@pytest.mark.parametrize("site", sorted(CASES))
def test_golden_data_service_scripts(golden_workdir: Path, site: str) -> None:
    nodes, gpus, *_ = CASES[site]
    text = rendered(site)
    path = GOLDEN / "data-service" / f"{site}-{nodes}n{gpus}g.sh"  # a folder of their own: test_golden.py owns *.sh
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with HPCVOD_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with HPCVOD_REGEN_GOLDEN=1"
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert "export HPCVOD_DATA_SERVICE_CONFIG=\"$HPCVOD_JOB_DIR/data-service.json\"" in text
    assert "-m hpcvod.tensorflow.data.compute_worker" in text
    assert "'it'\"'\"'s a $(test); `x` \"y\"'" in text  # the program's arguments through the one quoting filter


def test_slurm_heterogeneous_job_layout(golden_workdir: Path) -> None:
    text = rendered("slurm-ib-openmpi")
    directives = [line.removeprefix("#SBATCH ") for line in text.splitlines() if line.startswith("#SBATCH")]
    compute, training = directives[:directives.index("hetjob")], directives[directives.index("hetjob") + 1:]
    # component 0: the CPU nodes of the compute job and the job-wide requests (the batch script runs there)
    assert {"--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--cpus-per-task=64", "--partition=cpu",
            "--dependency=afterok:123", "--mail-type=END", "--output=output.log"} <= set(compute)
    assert not any(d.startswith(("--gres", "--mem", "--exclusive")) for d in compute)
    # component 1: the GPU ranks, with the per-node requests and --sched-opt
    assert {"--nodes=2", "--ntasks=8", "--gres=gpu:a100:4", "--partition=gpu", "--exclusive", "--mem=64G",
            "--gres-flags=enforce-binding"} <= set(training)
    assert not any(d.startswith(("--job-name", "--output", "--dependency")) for d in training)
    assert "HPCVOD_WORLD_SIZE=4 srun --het-group=0 " in text and "\nsrun --het-group=1 " in text


def test_pbs_two_chunk_kinds_and_the_node_file_split(golden_workdir: Path) -> None:
    text = rendered("pbs-ib-openmpi")
    # both chunk kinds from the job's one queue (gpu: 64 cores a node); --mem is the training chunks'
    assert "#PBS -l select=2:ncpus=64:mpiprocs=2:ompthreads=32+2:ncpus=64:mpiprocs=4:ompthreads=16:ngpus=4:mem=64gb" \
        in text
    assert 'head -n 4 "$PBS_NODEFILE" > "$HPCVOD_JOB_DIR/hosts.data-service"' in text
    assert 'tail -n +5 "$PBS_NODEFILE" > "$HPCVOD_JOB_DIR/hosts.training"' in text


def test_docs_show_the_golden_heterogeneous_job(golden_workdir: Path) -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "data-service.md").read_text()
    shown = doc.split("<!-- hetjob:begin -->\n```bash\n", 1)[1].split("```\n<!-- hetjob:end -->", 1)[0]
    assert shown == rendered("slurm-ib-openmpi"), "docs/data-service.md: copy the golden file into its hetjob block"


def test_dry_run_prints_the_heterogeneous_job_and_submits_nothing(cli, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    code, out, err = cli("submit", "--site", "slurm-sandbox", "--data-service-nodes", "1", "--dry-run", "train.py")
    assert code == 0, err
    assert "#SBATCH hetjob" in out and "srun --het-group=1" in out
    assert "# Data service: 1 compute rank(s) = 1 node(s) x 1 task(s) per node in partition debug" in out
    assert not (tmp_path / "hpcvod-jobs").exists()


@pytest.mark.parametrize("args, message", [
    (("--data-service-nodes", "0"), "--data-service-nodes 0: expected a positive integer"),
    (("--data-service-nodes", "1", "--data-service-tasks-per-node", "0"),
     "--data-service-tasks-per-node 0: expected a positive integer"),
    (("--data-service-nodes", "1", "--data-service-partition", "gpu"),
     "--data-service-partition 'gpu': site 'slurm-sandbox' has no such partition (has: debug, urgent)"),
    (("--data-service-partition", "debug"), "--data-service-partition: goes with --data-service-nodes N"),
    (("--site", "slurm-ib-openmpi", "--data-service-nodes", "300", "--data-service-partition", "cpu"),
     "--data-service-nodes 300: partition 'cpu' of site 'slurm-ib-openmpi' allows at most 256 nodes"),
    (("--data-service-nodes", "1", "--data-service-tasks-per-node", "3"),
     "--data-service-tasks-per-node 3: partition 'debug' of site 'slurm-sandbox' has 2 CPUs per node"),
    (("--nodes", "1", "--tasks-per-node", "2", "--data-service-nodes", "1", "--data-service-dispatchers", "2"),
     "--data-service-tasks-per-node 1: 1 node(s) x 1 = 1 compute ranks cannot be split among 2 dispatchers: "
     "expected a multiple of --data-service-dispatchers"),
    (("--nodes", "1", "--tasks-per-node", "1", "--data-service-nodes", "1", "--data-service-tasks-per-node", "2",
      "--data-service-dispatchers", "2"), "--data-service-dispatchers 2: expected 1 (shared by every training rank) "
     "or 1 (one per training rank)"),
    (("--data-service-nodes", "1", "--data-service-dispatcher-side", "both"),
     "argument --data-service-dispatcher-side: invalid choice: 'both'"),
    (("--data-service-nodes", "1", "--array", "0-3"), "--array '0-3': not with --data-service-nodes"),
    (("--site", "slurm-sandbox-mpirun", "--data-service-nodes", "1"),
     "--data-service-nodes 1: site 'slurm-sandbox-mpirun' starts ranks with mpirun; the compute job's heterogeneous "
     "job component needs srun --het-group"),
    (("--site", "sge-sandbox", "--data-service-nodes", "1"),
     "--data-service-nodes 1: sge has no such request (a Grid Engine job has one parallel environment"),
    (("--site", "local", "--data-service-nodes", "2"),
     "--data-service-nodes 2: site 'local' runs every rank on this machine: expected 1"),
    (("--site", "pbs-ib-openmpi", "--data-service-nodes", "1", "--data-service-partition", "cpu"),
     "--data-service-partition 'cpu': a PBS job runs in one queue ('gpu'); both chunk kinds come from it"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_submitted(cli, tmp_path: Path, args: tuple[str, ...],
                                                            message: str) -> None:
    (tmp_path / "train.py").write_text("")
    site = () if "--site" in args else ("--site", "slurm-sandbox")
    # a real submit where a regression would run nothing harmful (local: this machine), else a dry run: a refusal
    # that stopped working must not queue jobs on the test cluster
    dry = () if "local" in args else ("--dry-run",)
    code, out, err = cli("submit", *site, *args, *dry, "train.py")
    assert code == 2, out + err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "hpcvod-jobs").exists()


def test_the_contract_variable_cannot_be_overridden(cli, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    code, _, err = cli("submit", "--site", "slurm-sandbox", "--env", "HPCVOD_DATA_SERVICE_CONFIG=/x",
                       "--data-service-nodes", "1", "--dry-run", "train.py")
    assert code == 2 and "--env HPCVOD_DATA_SERVICE_CONFIG: set by hpcvod itself" in err


@pytest.mark.mpi
@pytest.mark.frameworks
@pytest.mark.timeout(180)
def test_local_site_runs_the_compute_job_and_the_training_here(tmp_path: Path) -> None:
    """The local site has no scheduler: the script starts both launches on this machine and ends the compute job
    after the training."""
    import json

    from submission_helpers import clean_env, hpcvod

    pytest.importorskip("tensorflow")
    worker = Path(__file__).resolve().parents[1] / "cluster" / "workers" / "tf_data_service_train.py"
    (tmp_path / "train.py").write_text(worker.read_text())
    done = hpcvod("submit", "--site", "local", "--tasks-per-node", "2", "--data-service-nodes", "1", "--wait",
                  "train.py", "seen.json", cwd=tmp_path, env=clean_env(tmp_path), timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = json.loads((tmp_path / "seen.json").read_text())
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == [3 * i for i in range(300)]
    job_dir = next((tmp_path / "hpcvod-jobs").iterdir())
    assert "Shut down WorkerServer" in (job_dir / "data-service.log").read_text()
    assert (job_dir / "exitcode").read_text().strip() == "0"
