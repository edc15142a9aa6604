"""Habits of sbatch users that must not turn into a silent wrong job (issue 25 items 1 and 2).

One CLI case per trap, through hpcvod.cli.main in this process: what the plan becomes (render --json) or the one
line that refuses it. The profiles are the shipped ones: slurm-ib-openmpi's `gpu` partition has 4 A100s and 64
cores per node, its `cpu` partition 128 cores and no GPU; pbs-ib-openmpi has queues `gpu` and `cpu`.
"""

from __future__ import annotations

import json

import pytest

from submission_helpers import hpcvod, one_error_line

SLURM = ("--site", "slurm-ib-openmpi")
PBS = ("--site", "pbs-ib-openmpi")


@pytest.fixture
def plan(cli, tmp_path):
    """The plan `hpcvod render --json ARGS train.py` resolves."""
    (tmp_path / "train.py").write_text("")

    def resolve(*args: str) -> dict:
        code, out, err = cli("render", "--json", *args, "train.py")
        assert code == 0, err
        return json.loads(out)["plan"]

    return resolve


@pytest.fixture
def refused(cli, tmp_path):
    """The one error line `hpcvod submit --dry-run ARGS train.py` ends with (exit 2)."""
    (tmp_path / "train.py").write_text("")

    def refuse(*args: str) -> str:
        code, _, err = cli("submit", "--dry-run", *args, "train.py")
        return one_error_line(code, err)

    return refuse


def test_gpus_is_a_total_not_an_abbreviation_of_gpus_per_node(plan):
    p = plan(*SLURM, "--gpus=8", "-N", "2")  # was --gpus-per-node=8 by argparse's abbreviation: 16 GPUs
    assert (p["nodes"], p["gpus_per_node"], p["tasks_per_node"], p["world_size"]) == (2, 4, 4, 8)


def test_gpus_total_that_does_not_divide_is_refused(refused):
    line = refused(*SLURM, "--gpus", "6", "-N", "4")
    assert "--gpus 6" in line and "4 nodes" in line and "--gpus-per-node" in line


@pytest.mark.parametrize("abbreviation", ["--gpus-per=4", "--tasks-per=2", "--cpus-per-t=2", "--part=gpu",
                                          "--acc=x", "--job-n=x", "--dry"])
def test_no_option_is_abbreviated(refused, abbreviation):
    assert "unrecognized arguments" in refused(*SLURM, abbreviation)


def test_ntasks_is_the_total_of_ranks(plan, refused):
    p = plan(*SLURM, "-n", "8", "-N", "2")
    assert (p["tasks_per_node"], p["world_size"]) == (4, 8)
    assert plan(*SLURM, "--ntasks=8", "--nodes=2")["tasks_per_node"] == 4
    assert "--ntasks 7" in refused(*SLURM, "-n", "7", "-N", "2")
    assert "--ntasks 0: expected an integer >= 1" in refused(*SLURM, "-n", "0")
    assert "two ways to ask for ranks" in refused(*SLURM, "-n", "8", "--tasks-per-node", "4")


def test_sbatch_per_node_and_per_task_spellings(plan):
    assert plan(*SLURM, "--ntasks-per-node", "2")["tasks_per_node"] == 2
    assert plan(*SLURM, "-c", "8")["cpus_per_task"] == 8


def test_gres_gpus_per_node(plan, refused):
    assert plan(*SLURM, "--gres=gpu:2")["gpus_per_node"] == 2
    p = plan(*SLURM, "-N", "2", "--gres", "gpu:a100:2")
    assert (p["gpus_per_node"], p["world_size"]) == (2, 4)
    line = refused(*SLURM, "--gres=gpu:h100:2")
    assert "--gres gpu:h100:2" in line and "a100" in line
    assert "expected gpu:N or gpu:TYPE:N" in refused(*SLURM, "--gres=mps:100")
    assert "two ways to ask for GPUs" in refused(*SLURM, "--gres=gpu:2", "-G", "2")


def test_q_is_the_qos_on_slurm_and_the_queue_on_pbs(plan, refused):
    p = plan(*SLURM, "-q", "high")
    assert p["options"]["qos"] == "high" and p["partition"] == "gpu"
    assert "--qos=high" in "\n".join(p["directives"])
    assert plan(*PBS, "-q", "cpu")["partition"] == "cpu"
    assert "-q is the QoS" in refused(*SLURM, "-q", "high", "--qos", "low")
    assert "-q is the queue" in refused(*PBS, "-q", "cpu", "--partition", "gpu")


@pytest.mark.parametrize("spelling,hint", [("--gpus-per-task=1", "--gpus-per-node"),
                                           ("--ntasks-per-gpu=1", "--gpus-per-node"),
                                           ("--cpus-per-gpu=8", "--cpus-per-task"),
                                           ("--mem-per-cpu=4G", "--mem")])
def test_sbatch_options_hpcvod_words_otherwise_are_refused(refused, spelling, hint):
    line = refused(*SLURM, spelling)
    assert "not an hpcvod option" in line and hint in line


def test_help_says_g_is_per_node(tmp_path):
    proc = hpcvod("submit", "--help", cwd=tmp_path)
    assert proc.returncode == 0 and "GPUs PER NODE" in proc.stdout and "GPUs IN TOTAL" in proc.stdout


def test_a_gpu_partition_without_g_gets_one_rank_per_gpu(plan):
    p = plan(*SLURM, "-N", "2")  # was 2 x 64 CPU ranks, no GPU, without a word
    assert (p["gpus_per_node"], p["tasks_per_node"], p["world_size"]) == (4, 4, 8)
    cpu = plan(*SLURM, "-N", "2", "-G", "0")  # CPU ranks there: asked for explicitly
    assert (cpu["gpus_per_node"], cpu["tasks_per_node"]) == (0, 64)
    assert plan(*SLURM, "-p", "cpu", "-N", "2")["tasks_per_node"] == 128  # a CPU partition: one rank per core


def test_every_submit_says_the_world_on_stderr(cli, tmp_path):
    (tmp_path / "train.py").write_text("")
    code, out, err = cli("submit", "--dry-run", *SLURM, "-N", "2", "train.py")
    assert code == 0 and out.startswith("#!/bin/bash")
    assert err.splitlines() == ["world: 2 nodes x 4 ranks = 8 ranks, 4 GPUs per node"]
    code, _, err = cli("submit", "--dry-run", *SLURM, "-N", "1", "-G", "0", "-p", "cpu", "train.py")
    assert err.splitlines() == ["world: 1 node x 128 ranks = 128 ranks, no GPU, 1 CPU per rank"]
    code, _, err = cli("render", *SLURM, "train.py")
    assert code == 0 and "world:" not in err  # render prints the script only
