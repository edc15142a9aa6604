"""The kubernetes scheduler (Kubeflow MPI Operator, MPIJob kubeflow.org/v2beta1), without a cluster.

No Kubernetes cluster runs where these tests run: they check the manifests hpcvod writes (golden files, and every
field against the MPIJob v2beta1 API as tests/submission/mpijob_schema.py records it from the operator's types,
CRD and admission rules), that kubectl itself reads each manifest as PyYAML does (``kubectl annotate --local``,
offline: kubectl's create/apply --dry-run=client need an API server even with --validate=false), and the kubectl
command lines submit/status/logs/cancel run, through a stand-in kubectl on PATH that records its argv and answers
as kubectl does (the only way to see them without a cluster).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mpijob_schema import mpijob_problems
from submission_helpers import GOLDEN, NO_USER_CONFIG, golden_host, load_site
from hpcvod.jobs.spec import JobSpec
from hpcvod.jobs.submission import prepare
from hpcvod.schedulers.base import CANCELLED, COMPLETED, FAILED, PENDING, RUNNING, TIMEOUT
from hpcvod.schedulers.kubernetes import JOB_DIR, mpijob_name, mpijob_state

K8S_GOLDEN = GOLDEN / "kubernetes"
REGEN = os.environ.get("HPCVOD_REGEN_GOLDEN") == "1"
# what YAML or a shell could misread; the golden files keep to ASCII (PyYAML writes any other script as one
# double-quoted line of escapes, which the round-trip tests read back)
GOLDEN_ARGS = ("--note", "it's a $(test); `x` \"y\"", "--yaml", "key: [1, {a: b}] # not a comment", "--bool", "on",
               "--octal", "0777", "--tab", "a\tb")
HOSTILE_ARGS = (*GOLDEN_ARGS, "--odd", "line\u2028separator \u0085 next-line \u00e9 \u202e rtl", "--nl", "two\nlines")
# the same site with the other MPI flavours of the operator's mpiImplementation (Hydra's mpiexec in the image)
FLAVOUR_PROFILES = {
    "intelmpi": "extends: k8s\nmpi:\n  flavour: intelmpi\nlauncher:\n  kind: mpiexec\n  executable: mpiexec\n",
    "mpich": "extends: k8s\nmpi:\n  flavour: mpich\nlauncher:\n  kind: mpiexec\n  executable: mpiexec\n"
             "scheduler_options:\n  ssh_auth_mount_path: /home/mpiuser/.ssh\n  launcher_creation_policy: null\n"
             "  ttl_seconds_after_finished: null\n",
}


def _site(tmp_path: Path, flavour: str = "openmpi"):
    if flavour == "openmpi":
        return load_site("k8s", environ=NO_USER_CONFIG)
    path = tmp_path / f"k8s-{flavour}.yaml"
    path.write_text(FLAVOUR_PROFILES[flavour])
    return load_site(str(path), environ=NO_USER_CONFIG)


def manifest_text(tmp_path: Path, nodes: int, gpus: int, flavour: str = "openmpi", args: tuple[str, ...] = (),
                  **spec: object) -> str:
    site = _site(tmp_path, flavour)
    job = JobSpec(program="train.py", args=("--epochs", "3", *args), nodes=nodes, gpus_per_node=gpus,
                  env=(("MY_SETTING", "a b;c"),), **spec)
    command = ["hpcvod", "submit", "--site", "k8s", "--nodes", str(nodes), "--gpus-per-node", str(gpus), "train.py"]
    return prepare(job, site, golden_host("mpich", gpus=gpus), command).script


CASES = [(4, 4, "openmpi"), (1, 0, "openmpi"), (2, 8, "intelmpi"), (2, 0, "mpich")]


@pytest.mark.parametrize("nodes,gpus,flavour", CASES, ids=lambda v: str(v))
def test_golden_manifest(golden_workdir, tmp_path, nodes, gpus, flavour):
    """The manifest, byte for byte (new on purpose: review a change of these files like code)."""
    text = manifest_text(tmp_path, nodes, gpus, flavour, GOLDEN_ARGS)
    path = K8S_GOLDEN / f"k8s-{flavour}-{nodes}n{gpus}g.yaml"
    if REGEN:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with HPCVOD_REGEN_GOLDEN=1"
    assert text == path.read_text(), f"{path.name} changed; if intended, regenerate with HPCVOD_REGEN_GOLDEN=1"


@pytest.mark.parametrize("nodes,gpus,flavour", CASES, ids=lambda v: str(v))
def test_manifest_is_an_mpijob_v2beta1(golden_workdir, tmp_path, nodes, gpus, flavour):
    manifest = yaml.safe_load(manifest_text(tmp_path, nodes, gpus, flavour, HOSTILE_ARGS))
    assert mpijob_problems(manifest) == []
    spec = manifest["spec"]
    assert spec["mpiImplementation"] == {"openmpi": "OpenMPI", "intelmpi": "Intel", "mpich": "MPICH"}[flavour]
    assert spec["slotsPerWorker"] == (gpus or 96)  # tasks per node: one per GPU, else one per core
    assert spec["runPolicy"]["activeDeadlineSeconds"] == 3600  # the partition's default --time
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running" and spec["runPolicy"]["backoffLimit"] == 0
    workers = spec["mpiReplicaSpecs"]["Worker"]
    assert workers["replicas"] == nodes
    worker = workers["template"]["spec"]["containers"][0]
    assert "command" not in worker  # the operator starts the image's sshd
    assert worker.get("resources", {}).get("limits") == ({"nvidia.com/gpu": gpus} if gpus else None)
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
    assert launcher["containers"][0]["command"][:2] == ["/bin/bash", "-c"]
    assert "limits" not in launcher["containers"][0].get("resources", {})  # no GPU for mpirun's pod
    assert launcher["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert launcher["nodeSelector"] == {"nvidia.com/gpu.present": "true"}  # a string, quoted in the YAML
    assert launcher["serviceAccountName"] == "mpi-jobs"


def test_mpijob_time_from_time_flag(golden_workdir, tmp_path):
    manifest = yaml.safe_load(manifest_text(tmp_path, 2, 4, time="02:30:00"))
    assert manifest["spec"]["runPolicy"]["activeDeadlineSeconds"] == 9000


@pytest.mark.parametrize("flavour", ["openmpi", "intelmpi", "mpich"])
def test_launcher_runs_the_rendered_script_with_the_launch_line(golden_workdir, tmp_path, flavour):
    """The launcher's bash -c script is the rendered script itself (every hostile argument intact through YAML),
    it is valid bash, and its launch line is the one mpirun/mpiexec get on a batch system, with the operator's
    host list."""
    from hpcvod.jobs.plan import resolve
    from hpcvod.jobs.render import render
    from hpcvod.schedulers import scheduler_for

    site = _site(tmp_path, flavour)
    spec = JobSpec(program="train.py", args=HOSTILE_ARGS, nodes=2, gpus_per_node=4)
    plan = resolve(spec, site, golden_host(gpus=4))
    script = render(plan, scheduler_for(site).template)
    manifest = yaml.safe_load(prepare(spec, site, golden_host(gpus=4)).script)
    assert manifest["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"][2] == script
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"export HPCVOD_JOB_DIR={JOB_DIR}" in script and "\ncd /workspace\n" in script
    launch = plan.launch_argv
    if flavour == "openmpi":
        assert launch[:7] == ("mpirun", "-n", "8", "--map-by", "ppr:4:node", "--hostfile", "/etc/mpi/hostfile")
    else:
        assert launch[:7] == ("mpiexec", "-n", "8", "-ppn", "4", "-f", "/etc/mpi/hostfile")
    assert plan.program_argv == ("python3", "train.py", *HOSTILE_ARGS)


def _kubectl_reads(path: Path) -> object:
    """The manifest as kubectl itself parses it (sigs.k8s.io/yaml), offline: annotate --local touches no server."""
    done = subprocess.run(["kubectl", "annotate", "--local", "-f", str(path), "hpcvod.invalid/checked=yes",
                           "-o", "json"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    parsed = json.loads(done.stdout)
    del parsed["metadata"]["annotations"]["hpcvod.invalid/checked"]
    return parsed


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl client here")
@pytest.mark.parametrize("nodes,gpus,flavour", CASES, ids=lambda v: str(v))
def test_kubectl_reads_what_pyyaml_reads(golden_workdir, tmp_path, nodes, gpus, flavour):
    """kubectl's YAML reader (YAML 1.1 rules of its own: yes/on, octal, dates) gives the same object, so no string
    becomes a boolean or a number on the way to the API server."""
    path = tmp_path / "job.yaml"
    path.write_text(manifest_text(tmp_path, nodes, gpus, flavour, HOSTILE_ARGS))
    assert _kubectl_reads(path) == yaml.safe_load(path.read_text())


def test_names_are_dns_labels_the_operator_accepts():
    assert mpijob_name("train", 4) == "train"
    assert mpijob_name("My Job!_v2", 4) == "my-job-v2"
    assert mpijob_name("2nd-run", 1) == "nd-run"  # a DNS-1035 label starts with a letter
    assert mpijob_name("___", 1) == "job"
    long = mpijob_name("x" * 100, 1000)
    assert len(long + "-worker-999") <= 63 and len(long + "-launcher") <= 63


def test_long_job_name_still_valid_with_many_workers(golden_workdir, tmp_path):
    manifest = yaml.safe_load(manifest_text(tmp_path, 16, 8, job_name="A" * 80 + " résumé"))
    assert mpijob_problems(manifest) == []
    assert manifest["metadata"]["annotations"]["hpcvod/job-name"] == "A" * 80 + " résumé"  # kept whole here


@pytest.mark.parametrize("conditions,state", [
    ([], PENDING),
    ([("Created", "True", "MPIJobCreated")], PENDING),
    ([("Created", "True", ""), ("Running", "True", "MPIJobRunning")], RUNNING),
    ([("Created", "True", ""), ("Running", "False", ""), ("Succeeded", "True", "MPIJobSucceeded")], COMPLETED),
    ([("Created", "True", ""), ("Failed", "True", "BackoffLimitExceeded/Error")], FAILED),
    ([("Created", "True", ""), ("Failed", "True", "DeadlineExceeded")], TIMEOUT),
    ([("Suspended", "True", "MPIJobSuspended")], PENDING),
])
def test_mpijob_conditions_to_states(conditions, state):
    job = {"status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions],
                      "startTime": "2026-11-25T10:00:00Z"}}
    status = mpijob_state(job)
    assert status.state == state
    assert status.exit_code == (0 if state == COMPLETED else None)
    assert status.start_time == 1795600800.0


# ---- kubectl's command lines, through a stand-in kubectl ----------------------------------------------------

FAKE_KUBECTL = r'''#!PYTHON
"""Stand-in kubectl: records argv and cwd, answers from $FAKE_KUBECTL_DIR/<subcommand>.{out,err,rc}."""
import json, os, sys
folder = os.environ["FAKE_KUBECTL_DIR"]
with open(os.path.join(folder, "calls.jsonl"), "a") as f:
    f.write(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd()}) + "\n")
words = [w for w in sys.argv[1:] if not w.startswith("-")]
command = next((w for w in words if w in ("create", "get", "logs", "delete")), "other")
def read(ext, default=""):
    path = os.path.join(folder, command + ext)
    return open(path).read() if os.path.exists(path) else default
sys.stdout.write(read(".out"))
sys.stderr.write(read(".err"))
sys.exit(int(read(".rc", "0")))
'''


@pytest.fixture
def kubectl(tmp_path, monkeypatch):
    """A stand-in kubectl first on PATH; returns (its answers' folder, a function giving the calls so far)."""
    folder = tmp_path / "fake-kubectl"
    folder.mkdir()
    exe = folder / "kubectl"
    exe.write_text(FAKE_KUBECTL.replace("PYTHON", sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KUBECTL_DIR", str(folder))

    def calls() -> list[dict]:
        log = folder / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    return folder, calls


def _answer(folder: Path, command: str, out: str = "", err: str = "", rc: int = 0) -> None:
    (folder / f"{command}.out").write_text(out)
    (folder / f"{command}.err").write_text(err)
    (folder / f"{command}.rc").write_text(str(rc))


def test_submit_status_logs_cancel_run_kubectl(cli, kubectl, tmp_path):
    folder, calls = kubectl
    (tmp_path / "train.py").write_text("print('train')\n")
    _answer(folder, "create", out="mpijob.kubeflow.org/train\n")
    code, out, err = cli("submit", "--json", "--site", "k8s", "--nodes", "4", "--gpus-per-node", "4", "train.py")
    assert code == 0, err
    submitted = json.loads(out)
    job_dir = Path(submitted["job_dir"])
    assert submitted["job_id"] == "train"
    assert calls() == [{"argv": ["create", "--filename", "job.yaml", "--output", "name"], "cwd": str(job_dir)}]
    manifest = yaml.safe_load((job_dir / "job.yaml").read_text())
    assert mpijob_problems(manifest) == [] and manifest["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 4
    assert json.loads((job_dir / "job.json").read_text())["namespace"] == "ml-training"

    _answer(folder, "get", out=json.dumps({"status": {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Running", "status": "True", "reason": "MPIJobRunning"}]}}))
    code, out, err = cli("status", "--json", str(job_dir))
    assert code == 0, err
    assert json.loads(out)["state"] == RUNNING
    assert calls()[-1]["argv"] == ["get", "mpijob", "train", "--namespace", "ml-training", "--output", "json"]

    _answer(folder, "logs", out="[0]<stdout>: epoch 1\n[1]<stderr>: warning\n")
    code, out, err = cli("logs", "--rank", "0", str(job_dir))
    assert code == 0, err
    assert out == "[0]<stdout>: epoch 1\n"
    assert calls()[-1]["argv"] == ["logs", "--namespace", "ml-training", "job/train-launcher"]
    assert (job_dir / "output.log").stat().st_mode & 0o077 == 0  # the copy is the owner's only

    code, out, err = cli("cancel", str(job_dir))
    assert code == 0, err
    assert calls()[-1]["argv"] == ["delete", "mpijob", "train", "--namespace", "ml-training", "--wait=false"]
    _answer(folder, "get", err='Error from server (NotFound): mpijobs.kubeflow.org "train" not found', rc=1)
    code, out, err = cli("status", "--json", str(job_dir))
    assert json.loads(out)["state"] == CANCELLED


def test_submit_wait_show_output_prints_the_launcher_log(cli, kubectl, tmp_path):
    """submit --wait --show-output: the job's end from the MPIJob's conditions, its output from kubectl logs."""
    folder, calls = kubectl
    (tmp_path / "train.py").write_text("")
    _answer(folder, "create", out="mpijob.kubeflow.org/train\n")
    _answer(folder, "get", out=json.dumps({"status": {"conditions": [
        {"type": "Created", "status": "True"}, {"type": "Succeeded", "status": "True", "reason": "MPIJobSucceeded"}],
        "startTime": "2026-11-25T10:00:00Z", "completionTime": "2026-11-25T10:05:00Z"}}))
    _answer(folder, "logs", out="[0]<stdout>: done\n")
    code, out, err = cli("submit", "--wait", "--show-output", "--site", "k8s", "-N", "2", "train.py")
    assert code == 0, err
    assert out.splitlines()[-1] == "[0]<stdout>: done"
    assert [c["argv"][0] for c in calls()] == ["create", "get", "logs"]


def test_status_of_a_bare_id_asks_the_sites_namespace_and_context(cli, kubectl, tmp_path):
    folder, calls = kubectl
    site = tmp_path / "k8s-ctx.yaml"
    site.write_text("extends: k8s\nscheduler_options:\n  context: prod-cluster\n  namespace: team-a\n")
    _answer(folder, "get", out=json.dumps({"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active longer"}]}}))
    code, out, err = cli("status", "--json", "--site", str(site), "resnet-7")
    assert code == 0, err
    assert json.loads(out)["state"] == TIMEOUT
    assert calls() == [{"argv": ["--context", "prod-cluster", "get", "mpijob", "resnet-7", "--namespace", "team-a",
                                 "--output", "json"], "cwd": str(tmp_path)}]


def test_an_existing_mpijob_of_the_same_name_is_one_line_and_no_folder(cli, kubectl, tmp_path):
    folder, _ = kubectl
    (tmp_path / "train.py").write_text("")
    _answer(folder, "create", rc=1,
            err='Error from server (AlreadyExists): error when creating "job.yaml": mpijobs.kubeflow.org "train" '
                'already exists\n')
    code, out, err = cli("submit", "--site", "k8s", "--nodes", "1", "train.py")
    assert code == 1
    assert len(err.strip().splitlines()) == 1 and "exists in namespace 'ml-training' already" in err
    assert "--job-name" in err
    assert not list((tmp_path / "hpcvod-jobs").glob("*/job.yaml"))


def test_render_o_writes_the_manifest_and_rewrites_its_own(cli, tmp_path):
    (tmp_path / "train.py").write_text("")
    assert cli("render", "--site", "k8s", "-N", "2", "-o", "job.yaml", "train.py")[0] == 0
    first = (tmp_path / "job.yaml").read_text()
    assert first.startswith("# Generated by hpcvod ") and mpijob_problems(yaml.safe_load(first)) == []
    code, _, err = cli("render", "--site", "k8s", "-N", "3", "-o", "job.yaml", "train.py")  # its own: no --force
    assert code == 0, err
    assert yaml.safe_load((tmp_path / "job.yaml").read_text())["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3


BAD_PROFILES = [
    ("namespace: ML_Training", "scheduler_options.namespace: expected a DNS-1123 label"),
    ("namespace: " + "a" * 64, "scheduler_options.namespace: expected a DNS-1123 label"),
    ("image: null", "scheduler_options.image: expected a container image reference"),
    ("service_account: Jobs!", "scheduler_options.service_account: expected a DNS-1123 subdomain"),
    ("node_selector: {'-bad': x}", "scheduler_options.node_selector"),
    ("node_selector: {gpu: 'a b'}", "scheduler_options.node_selector.gpu: expected a Kubernetes label value"),
    ("tolerations: [{key: gpu, effect: NoSchedul}]", "scheduler_options.tolerations[0].effect: expected one of"),
    ("tolerations: [{key: gpu, seconds: 5}]", "scheduler_options.tolerations[0].seconds: unknown key"),
    ("clean_pod_policy: Always", "scheduler_options.clean_pod_policy: expected one of 'Running', 'All', 'None'"),
    ("backoff_limit: -1", "scheduler_options.backoff_limit: expected an integer >= 0"),
    ("workdir: workspace", "scheduler_options.workdir: expected an absolute path"),
    ("gpu_resource: 'nvidia gpu'", "scheduler_options.gpu_resource: expected an extended resource name"),
]
# the image's MPI and Python cannot be found on the submitting machine: 'auto' and a missing python are refused
IMAGE_PROFILES = [
    ("mpi:\n  flavour: auto\n", "mpi.flavour: 'auto' finds the MPI of this machine"),
    ("launcher:\n  kind: mpirun\n  executable: auto\n", "launcher.executable: 'auto' finds this machine's launcher"),
    ("python: null\n", "python: missing: scheduler 'kubernetes' runs the program in its image"),
]


@pytest.mark.parametrize("line,message", BAD_PROFILES, ids=[b[0][:30] for b in BAD_PROFILES])
def test_bad_profile_is_one_line_exit_2(cli, kubectl, tmp_path, line, message):
    _, calls = kubectl
    (tmp_path / "train.py").write_text("")
    (tmp_path / "bad.yaml").write_text(f"extends: k8s\nscheduler_options:\n  {line}\n")
    code, out, err = cli("submit", "--site", "bad.yaml", "train.py")
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert calls() == [] and not (tmp_path / "hpcvod-jobs").exists()


@pytest.mark.parametrize("keys,message", IMAGE_PROFILES, ids=["flavour", "executable", "python"])
def test_what_only_the_image_knows_must_be_named(cli, kubectl, tmp_path, keys, message):
    _, calls = kubectl
    (tmp_path / "train.py").write_text("")
    (tmp_path / "bad.yaml").write_text(f"extends: k8s\n{keys}")
    code, out, err = cli("submit", "--site", "bad.yaml", "train.py")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert calls() == []


@pytest.mark.parametrize("args,message", [
    (["--env", "MY_TOKEN"], "--env MY_TOKEN: a secret value cannot reach an MPIJob"),
    (["--exclusive"], "--exclusive: kubernetes has no such request"),
    (["--account", "proj1"], "--account 'proj1': an MPIJob charges no account"),
    (["--array", "0-3"], "--array '0-3': kubernetes has no such request"),
    (["--data-service-nodes", "1"], "--data-service-nodes 1: kubernetes has no such request"),
])
def test_what_an_mpijob_cannot_hold_is_refused(cli, kubectl, tmp_path, monkeypatch, args, message):
    _, calls = kubectl
    monkeypatch.setenv("MY_TOKEN", "s3cret")
    (tmp_path / "train.py").write_text("")
    code, out, err = cli("submit", "--site", "k8s", *args, "train.py")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert "s3cret" not in err and calls() == []


def test_an_edited_namespace_in_job_json_never_reaches_kubectl(cli, kubectl, tmp_path):
    folder, calls = kubectl
    (tmp_path / "train.py").write_text("")
    _answer(folder, "create", out="mpijob.kubeflow.org/train\n")
    code, out, err = cli("submit", "--json", "--site", "k8s", "train.py")
    job_dir = Path(json.loads(out)["job_dir"])
    record = json.loads((job_dir / "job.json").read_text())
    (job_dir / "job.json").write_text(json.dumps({**record, "namespace": "--all-namespaces"}))
    for command in ("status", "logs", "cancel"):
        code, out, err = cli(command, str(job_dir))
        assert code == 2 and len(err.strip().splitlines()) == 1, (command, err)
        assert "namespace: expected a DNS-1123 label" in err
    assert [c["argv"][0] for c in calls()] == ["create"]


def test_option_shaped_job_id_never_reaches_kubectl(cli, kubectl):
    _, calls = kubectl
    code, _, err = cli("cancel", "--site", "k8s", "--all")
    assert code == 2 and calls() == []
    code, _, err = cli("status", "--site", "k8s", "Train_1")
    assert code == 2 and "expected a kubernetes job id" in err and calls() == []


def test_schema_catches_what_the_api_would_refuse(golden_workdir, tmp_path):
    """The recorded schema is no rubber stamp: each field hpcvod could get wrong is caught."""
    good = yaml.safe_load(manifest_text(tmp_path, 2, 4))
    broken = {
        "apiVersion": lambda m: m.update(apiVersion="kubeflow.org/v1"),
        "slotsPerWorker": lambda m: m["spec"].update(slotsPerWorker="4"),
        "mpiImplementation": lambda m: m["spec"].update(mpiImplementation="openmpi"),
        "cleanPodPolicy": lambda m: m["spec"]["runPolicy"].update(cleanPodPolicy="Always"),
        "backoffLimit": lambda m: m["spec"]["runPolicy"].update(backoffLimit=-1),
        "restartPolicy": lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"].update(restartPolicy="Always"),
        "Launcher replicas": lambda m: m["spec"]["mpiReplicaSpecs"]["Launcher"].update(replicas=2),
        "replica type": lambda m: m["spec"]["mpiReplicaSpecs"].update(Workers=m["spec"]["mpiReplicaSpecs"]["Worker"]),
        "name": lambda m: m["metadata"].update(name="Train"),
        "gpu limit": lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
        ["resources"]["limits"].update({"nvidia.com/gpu": "four"}),
        "toleration": lambda m: m["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["tolerations"][0]
        .update(tolerationSeconds="60"),
        "misspelt": lambda m: m["spec"]["runPolicy"].update(ttlSecondAfterFinished=5),
    }
    assert mpijob_problems(good) == []
    for what, breaking in broken.items():
        manifest = json.loads(json.dumps(good))
        breaking(manifest)
        assert mpijob_problems(manifest), what
