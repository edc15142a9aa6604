"""Kubernetes through Kubeflow's MPI Operator: one MPIJob (kubeflow.org/v2beta1) per job, handed to ``kubectl``.

The rendered launcher script (hpcvod/templates/kubernetes.j2: the site's environment and the same launch line
mpirun/mpiexec get on a batch system) becomes the launcher container's ``bash -c`` command inside an MPIJob
manifest; the workers run the image's sshd (the operator's default) and the launcher's mpirun/mpiexec reaches them
through the host list the operator mounts at /etc/mpi/hostfile. The manifest is built as data and written by a
YAML dumper: no user string is pasted into YAML text.

``kubectl create -f job.yaml`` submits (create, not apply: an MPIJob of the same name that exists is refused, not
reconfigured), ``kubectl get mpijob NAME -o json`` reads the operator's conditions, ``kubectl logs
job/NAME-launcher`` is the job's output (copied into output.log), ``kubectl delete mpijob NAME`` cancels.
No Kubernetes cluster has run these manifests where hpcvod is developed (docs/containers.md).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Optional, Sequence

from hpcvod.schedulers.base import (CANCELLED, COMPLETED, FAILED, OUTPUT_FILE, PENDING, RUNNING, TIMEOUT, UNKNOWN,
                                    JobStatus, Scheduler, SchedulerError, Submitted, read_cancel_marker,
                                    run_command)
from hpcvod.schedulers.jobfiles import RECORD_FILE, read_json, write_job_file
from hpcvod.sites.joboptions import option_names
from hpcvod.sites.spec import Min, Pattern, doc
from hpcvod.support.errors import UserError

API_VERSION = "kubeflow.org/v2beta1"
KIND = "MPIJob"
HOSTFILE = "/etc/mpi/hostfile"  # where the operator mounts the host list in the launcher (configMountPath)
JOB_DIR = "/hpcvod-job"  # HPCVOD_JOB_DIR in every pod: an emptyDir of its own (the exit status, stop files)
JOB_DIR_VOLUME = "hpcvod-job"
ROOT_SSH = "/root/.ssh"  # the operator's default sshAuthMountPath: the pods run as root
# hpcvod's MPI flavours -> spec.mpiImplementation (the CRD's enum: OpenMPI, Intel, MPICH)
MPI_IMPLEMENTATIONS = {"openmpi": "OpenMPI", "intelmpi": "Intel", "mpich": "MPICH"}
# the operator names the launcher's batch Job and the workers' pods after the MPIJob: NAME-launcher, NAME-worker-I
LAUNCHER_SUFFIX = "-launcher"
DNS_LABEL_MAX = 63

DNS1123_LABEL = Pattern(r"(?=[a-z0-9-]{1,63}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                        "a DNS-1123 label: at most 63 of a-z, 0-9 and '-', starting and ending with a letter or digit")
DNS1123_SUBDOMAIN = Pattern(r"(?=[a-z0-9.-]{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
                            "a DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters")
_PREFIX = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"  # a DNS subdomain and '/', or none
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"  # letters, digits, - _ . with alphanumeric ends
LABEL_KEY = Pattern(_PREFIX + r"(?=[A-Za-z0-9_.-]{1,63}$)" + _NAME,
                    "a Kubernetes label key: [PREFIX/]NAME, NAME at most 63 of A-Z a-z 0-9 - _ . (alphanumeric ends)")
LABEL_VALUE = Pattern(r"(?=[A-Za-z0-9_.-]{0,63}$)(" + _NAME + ")?",
                      "a Kubernetes label value: at most 63 of A-Z a-z 0-9 - _ . with alphanumeric ends, or empty")
IMAGE = Pattern(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*", "a container image reference (REGISTRY/PATH:TAG or @sha256:...)")
ABSOLUTE_PATH = Pattern(r"/[A-Za-z0-9._/+@-]*", "an absolute path of letters, digits and . _ / + @ -")
RESOURCE_NAME = Pattern(_PREFIX + _NAME, "an extended resource name like nvidia.com/gpu or amd.com/gpu")
CONTEXT = Pattern(r"[A-Za-z0-9][A-Za-z0-9_.@:/-]*", "a kubeconfig context name")


@dataclass(frozen=True)
class Toleration:
    """One toleration of the pods (Kubernetes' PodSpec.tolerations: a taint they may be scheduled onto)."""

    key: Optional[Annotated[str, LABEL_KEY]] = doc("the taint key (null with operator Exists: every taint)", None)
    operator: Literal["Exists", "Equal"] = doc("Equal: key and value match; Exists: the key alone", "Equal")
    value: Optional[Annotated[str, LABEL_VALUE]] = doc("the taint value (operator Equal)", None)
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = doc(
        "the taint effect it tolerates (null: every effect)", None)
    toleration_seconds: Optional[Annotated[int, Min(0)]] = doc(
        "NoExecute only: how long the pod stays once the taint appears (null: for ever)", None)


@dataclass(frozen=True)
class KubernetesOptions:
    """scheduler_options of a Kubernetes site (Kubeflow MPI Operator, MPIJob kubeflow.org/v2beta1)."""

    image: Annotated[str, IMAGE] = doc(
        "the container image of the launcher and the workers: the same MPI as mpi.flavour, sshd, the job's Python "
        "with hpcvod and the program")
    workdir: Annotated[str, ABSOLUTE_PATH] = doc(
        "the folder in the image where the launch line starts (the program's relative path is taken from there)")
    namespace: Annotated[str, DNS1123_LABEL] = doc("the namespace the MPIJobs go to", "default")
    context: Optional[Annotated[str, CONTEXT]] = doc("the kubeconfig context kubectl uses (null: the current one)",
                                                     None)
    image_pull_policy: Optional[Literal["Always", "IfNotPresent", "Never"]] = doc(
        "the containers' imagePullPolicy (null: Kubernetes' default, Always for :latest, else IfNotPresent)", None)
    service_account: Optional[Annotated[str, DNS1123_SUBDOMAIN]] = doc(
        "the pods' serviceAccountName (null: the namespace's default)", None)
    node_selector: dict[Annotated[str, LABEL_KEY], Annotated[str, LABEL_VALUE]] = doc(
        "node labels the pods must land on (nodeSelector), e.g. nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3",
        factory=dict)
    tolerations: list[Toleration] = doc("taints the pods tolerate (GPU node pools are often tainted)", factory=list)
    gpu_resource: Annotated[str, RESOURCE_NAME] = doc(
        "the extended resource that counts GPUs in a worker's limits (the device plugin's name)", "nvidia.com/gpu")
    ssh_auth_mount_path: Annotated[str, ABSOLUTE_PATH] = doc(
        "where the operator mounts the job's SSH keys (sshAuthMountPath): /root/.ssh for an image that runs as root, "
        "else the .ssh folder of the image's user", ROOT_SSH)
    clean_pod_policy: Literal["Running", "All", "None"] = doc(
        "which pods the operator deletes when the job ends (runPolicy.cleanPodPolicy)", "Running")
    backoff_limit: Annotated[int, Min(0)] = doc(
        "how often a failed launcher is started again (runPolicy.backoffLimit); 0: an MPI job that failed stays "
        "failed", 0)
    ttl_seconds_after_finished: Optional[Annotated[int, Min(0)]] = doc(
        "seconds the ended MPIJob is kept (and `hpcvod status/logs` can ask it) before Kubernetes deletes it "
        "(runPolicy.ttlSecondsAfterFinished; null: kept until deleted)", 604800)
    launcher_creation_policy: Optional[Literal["AtStartup", "WaitForWorkersReady"]] = doc(
        "WaitForWorkersReady starts the launcher once every worker is ready (its ssh would fail before; MPI Operator "
        ">= v0.5.0); null "
        "leaves the field out, for operators whose CRD does not have it", None)


def mpijob_name(job_name: str, workers: int) -> str:
    """The MPIJob's name from the job's name: a DNS-1035 label (lower case, '-' for anything else, a letter first)
    short enough that the operator's NAME-launcher and NAME-worker-<last> are labels too."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_name.lower())
    name = re.sub(r"^[^a-z]+", "", name)
    room = DNS_LABEL_MAX - max(len(LAUNCHER_SUFFIX), len(f"-worker-{workers - 1}"))
    name = name[:room].rstrip("-")
    return name or "job"


class _YamlDumper:
    """PyYAML's safe dumper, with scripts (strings of several lines) as literal blocks for people to read."""

    @staticmethod
    def dump(data: Any) -> str:
        import yaml

        class Dumper(yaml.SafeDumper):
            pass

        def text(dumper: yaml.SafeDumper, value: str) -> Any:
            style = "|" if "\n" in value else None
            return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

        Dumper.add_representer(str, text)
        Dumper.ignore_aliases = lambda self, data: True  # type: ignore[method-assign]  # no &id001: each pod whole
        return yaml.dump(data, Dumper=Dumper, sort_keys=False, default_flow_style=False, allow_unicode=False,
                         width=1 << 16)


def yaml_comment(line: str) -> str:
    """A header line as one YAML comment: anything but printable ASCII escaped (YAML reads U+2028, U+0085 as line
    breaks, which would end the comment)."""
    text = line.encode("ascii", "backslashreplace").decode()
    return "".join(ch if 32 <= ord(ch) < 127 else f"\\x{ord(ch):02x}" for ch in text)


def _epoch(text: object) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def mpijob_state(job: Mapping[str, Any]) -> JobStatus:
    """hpcvod's state of an MPIJob from ``kubectl get mpijob -o json``: its conditions (Created, Running,
    Restarting, Suspended, Succeeded, Failed) as the operator sets them; a Failed one whose reason is the launcher
    Job's DeadlineExceeded (runPolicy.activeDeadlineSeconds, --time) is a TIMEOUT."""
    status = job.get("status") if isinstance(job.get("status"), dict) else {}
    conditions = [c for c in status.get("conditions") or [] if isinstance(c, dict) and c.get("status") == "True"]
    true = {c.get("type"): c for c in conditions}
    times = dict(start_time=_epoch(status.get("startTime")), end_time=_epoch(status.get("completionTime")))
    for kind in ("Succeeded", "Failed", "Suspended", "Restarting", "Running", "Created"):
        if kind in true:
            reason, message = str(true[kind].get("reason", "")), str(true[kind].get("message", ""))
            break
    else:
        return JobStatus(PENDING, raw="no condition yet", source="kubectl get mpijob", **times)
    state = {"Succeeded": COMPLETED, "Failed": FAILED, "Suspended": PENDING, "Restarting": RUNNING,
             "Running": RUNNING, "Created": PENDING}[kind]
    if state == FAILED and reason.startswith("DeadlineExceeded"):
        state = TIMEOUT
    return JobStatus(state, raw=f"{kind} ({reason})" if reason else kind, exit_code=0 if kind == "Succeeded" else None,
                     reason=message, source="kubectl get mpijob", **times)


class KubernetesScheduler(Scheduler):
    name = "kubernetes"
    script_name = "job.yaml"
    Options = KubernetesOptions
    poll_seconds = 5.0
    job_id_pattern = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # the MPIJob's name: a DNS-1035 label
    job_id_example = "train or resnet50-run2"
    hostfile = HOSTFILE
    runs_in_image = True
    refusal_hints = dict.fromkeys(option_names(), "an MPIJob has no such field; ask the site's admin for "
                                  "scheduler_options (node_selector, tolerations)")
    data_service_refusal = ("an MPIJob has one launcher and one kind of worker: submit the compute job and the "
                            "training as two jobs (docs/data-service.md)")

    def __init__(self, options: KubernetesOptions | None = None) -> None:
        # no options: a job whose site profile no longer loads (scheduler_of); status, logs and cancel need only
        # the namespace (job.json records it), never the image or its folder
        super().__init__(options if options is not None else KubernetesOptions(image="", workdir="/"))

    def workdir(self, submit_dir: str) -> str:
        return self.options.workdir

    def image(self) -> str | None:
        return self.options.image

    def _kubectl(self, *words: str) -> list[str]:
        return ["kubectl", *(["--context", self.options.context] if self.options.context else []), *words]

    # ---- the manifest ------------------------------------------------------------------------------------

    def manifest(self, script: str, plan: Any) -> dict[str, Any]:
        """The MPIJob (kubeflow.org/v2beta1) whose launcher runs ``script``, as data."""
        opts: KubernetesOptions = self.options
        if plan.secret_env:
            raise UserError(f"--env {plan.secret_env[0]}: a secret value cannot reach an MPIJob through kubectl's "
                            "environment; keep it in a Kubernetes Secret the site's image or admin mounts")
        if plan.account:
            raise UserError(f"--account {plan.account!r}: an MPIJob charges no account (its namespace, "
                            f"{opts.namespace!r}, and that namespace's quota decide)")
        if plan.mpi_flavour not in MPI_IMPLEMENTATIONS:
            raise UserError(f"site {plan.site!r}: mpi.flavour {plan.mpi_flavour!r}: the MPI Operator runs "
                            f"{', '.join(MPI_IMPLEMENTATIONS)} (set mpi.flavour, not auto)")
        name = mpijob_name(plan.scheduler_job_name, plan.nodes)
        volume_mount = {"name": JOB_DIR_VOLUME, "mountPath": JOB_DIR}
        launcher_env = []
        if plan.mpi_flavour == "openmpi" and opts.ssh_auth_mount_path == ROOT_SSH:
            # the operator's default keys are root's: Open MPI refuses root without both
            launcher_env = [{"name": "OMPI_ALLOW_RUN_AS_ROOT", "value": "1"},
                            {"name": "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "value": "1"}]
        launcher = {"name": "launcher", "image": opts.image, **self._pull_policy(),
                    "command": ["/bin/bash", "-c", script], **({"env": launcher_env} if launcher_env else {}),
                    "volumeMounts": [volume_mount]}
        resources: dict[str, Any] = {"requests": {"cpu": str(plan.tasks_per_node * plan.cpus_per_task)}}
        if plan.gpus_per_node:
            resources["limits"] = {opts.gpu_resource: plan.gpus_per_node}
        worker = {"name": "worker", "image": opts.image, **self._pull_policy(), "resources": resources,
                  "volumeMounts": [volume_mount]}  # no command: the operator starts the image's sshd
        run_policy: dict[str, Any] = {"cleanPodPolicy": opts.clean_pod_policy, "backoffLimit": opts.backoff_limit,
                                      "activeDeadlineSeconds": plan.time_seconds}
        if opts.ttl_seconds_after_finished is not None:
            run_policy["ttlSecondsAfterFinished"] = opts.ttl_seconds_after_finished
        spec: dict[str, Any] = {"slotsPerWorker": plan.tasks_per_node, "runPolicy": run_policy,
                                "mpiImplementation": MPI_IMPLEMENTATIONS[plan.mpi_flavour],
                                "sshAuthMountPath": opts.ssh_auth_mount_path}
        if opts.launcher_creation_policy is not None:
            spec["launcherCreationPolicy"] = opts.launcher_creation_policy
        spec["mpiReplicaSpecs"] = {
            "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": {"spec": self._pod_spec(launcher)}},
            "Worker": {"replicas": plan.nodes, "restartPolicy": "Never", "template": {"spec": self._pod_spec(worker)}}}
        return {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": opts.namespace,
                             "labels": {"app.kubernetes.io/managed-by": "hpcvod"},
                             "annotations": {"hpcvod/job-name": plan.job_name, "hpcvod/site": plan.site}},
                "spec": spec}

    def _pull_policy(self) -> dict[str, str]:
        return {"imagePullPolicy": self.options.image_pull_policy} if self.options.image_pull_policy else {}

    def _pod_spec(self, container: dict[str, Any]) -> dict[str, Any]:
        opts: KubernetesOptions = self.options
        pod: dict[str, Any] = {}
        if opts.service_account:
            pod["serviceAccountName"] = opts.service_account
        if opts.node_selector:
            pod["nodeSelector"] = dict(opts.node_selector)
        if opts.tolerations:
            pod["tolerations"] = [_toleration(t) for t in opts.tolerations]
        pod["containers"] = [container]
        pod["volumes"] = [{"name": JOB_DIR_VOLUME, "emptyDir": {}}]
        return pod

    def wrap_script(self, script: str, plan: Any) -> str:
        """The MPIJob manifest as YAML: the script's header lines as comments, then the object the dumper writes."""
        header = [yaml_comment(line) for line in script.splitlines()[1:] if line.startswith("# ")]
        header = header[:next((i for i, line in enumerate(header) if not line.startswith(("# Generated", "# Command",
                                                                                             "# World", "# Data"))),
                              len(header))]
        header.append(f"# An MPIJob for Kubeflow's MPI Operator ({API_VERSION}): kubectl apply -f {self.script_name} "
                      "(hpcvod submit runs kubectl create); its launcher runs the script below.")
        return "\n".join(header) + "\n" + _YamlDumper.dump(self.manifest(script, plan))

    # ---- kubectl --------------------------------------------------------------------------------------------

    def submit_argv(self, script_name: str, secret_names: Sequence[str] = ()) -> list[str]:
        return self._kubectl("create", "--filename", script_name, "--output", "name")

    @staticmethod
    def parse_job_id(text: str) -> str:
        line = text.strip().splitlines()[-1].strip() if text.strip() else ""
        kind, _, name = line.rpartition("/")
        if kind != "mpijob.kubeflow.org" or not KubernetesScheduler.job_id_pattern.fullmatch(name):
            raise SchedulerError(f"kubectl create printed {text.strip()!r}, expected mpijob.kubeflow.org/NAME")
        return name

    def submit(self, job_dir: Path, script: Path, secret_env: Mapping[str, str] | None = None) -> Submitted:
        done = self._run_submit(job_dir, self.submit_argv(script.name), None)
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())
            if "AlreadyExists" in said or "already exists" in said:
                raise SchedulerError(f"kubectl create: an MPIJob of this name exists in namespace "
                                     f"{self.options.namespace!r} already ({said}); give another --job-name, or "
                                     "delete the old one (hpcvod cancel)")
            raise SchedulerError(f"kubectl create refused the job: {said}")
        return Submitted(self.parse_job_id(done.stdout), {"namespace": self.options.namespace})

    @classmethod
    def check_record(cls, record: dict[str, Any], where: str) -> None:
        namespace = record.get("namespace")
        if namespace is not None and (not isinstance(namespace, str)
                                      or not re.fullmatch(DNS1123_LABEL.regex, namespace)):
            raise UserError(f"{where}: namespace: expected {DNS1123_LABEL.meaning}, got {namespace!r}")

    def _namespace(self, job_dir: Path | None) -> str:
        """The namespace submit recorded in the job folder (the profile may have changed since), else the site's."""
        if job_dir is not None and (job_dir / RECORD_FILE).exists():
            record = read_json(job_dir / RECORD_FILE)
            self.check_record(record, str(job_dir / RECORD_FILE))
            if isinstance(record.get("namespace"), str):
                return record["namespace"]
        return self.options.namespace

    def status_argv(self, job_id: str, namespace: str) -> list[str]:
        return self._kubectl("get", "mpijob", job_id, "--namespace", namespace, "--output", "json")

    def logs_argv(self, job_id: str, namespace: str) -> list[str]:
        return self._kubectl("logs", "--namespace", namespace, f"job/{job_id}{LAUNCHER_SUFFIX}")

    def cancel_argv(self, job_id: str, namespace: str) -> list[str]:
        return self._kubectl("delete", "mpijob", job_id, "--namespace", namespace, "--wait=false")

    def status(self, job_id: str, job_dir: Path | None) -> JobStatus:
        done = run_command(self.status_argv(self.check_job_id(job_id), self._namespace(job_dir)))
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())
            if "NotFound" in said or "not found" in said:
                if read_cancel_marker(job_dir):
                    return JobStatus(CANCELLED, raw="deleted", reason="hpcvod cancel", source="kubectl get mpijob")
                return JobStatus(UNKNOWN, reason="Kubernetes no longer knows this MPIJob (deleted, or past "
                                 "ttlSecondsAfterFinished)", source="kubectl get mpijob")
            raise SchedulerError(f"kubectl get mpijob {job_id}: {said}")
        try:
            job = json.loads(done.stdout)
        except ValueError:
            raise SchedulerError(f"kubectl get mpijob {job_id} -o json printed no JSON: {done.stdout[:80]!r}") from None
        status = mpijob_state(job if isinstance(job, dict) else {})
        if status.state == FAILED and read_cancel_marker(job_dir):
            return JobStatus(CANCELLED, raw=status.raw, reason=status.reason, source=status.source)
        return status

    def refresh_output(self, job_id: str, job_dir: Path | None) -> None:
        """The launcher pod's log (every rank's labelled lines: mpirun/mpiexec gathers them) into output.log; left
        as it is while the pod has none (not started yet) or is gone."""
        if job_dir is None:
            return
        done = run_command(self.logs_argv(self.check_job_id(job_id), self._namespace(job_dir)))
        if done.returncode == 0 and done.stdout:
            write_job_file(job_dir / OUTPUT_FILE, done.stdout)

    def cancel(self, job_id: str, job_dir: Path | None) -> None:
        done = run_command(self.cancel_argv(self.check_job_id(job_id), self._namespace(job_dir)))
        if done.returncode != 0:
            said = " ".join((done.stderr or done.stdout).split())
            if "NotFound" not in said and "not found" not in said:  # gone already: nothing left to cancel
                raise SchedulerError(f"kubectl delete mpijob {job_id}: {said}")


def _toleration(toleration: Toleration) -> dict[str, Any]:
    """A profile's toleration as PodSpec writes it (camelCase; unset fields left out)."""
    out: dict[str, Any] = {}
    for key, value in (("key", toleration.key), ("operator", toleration.operator), ("value", toleration.value),
                       ("effect", toleration.effect), ("tolerationSeconds", toleration.toleration_seconds)):
        if value is not None:
            out[key] = value
    return out


SCHEDULER = KubernetesScheduler
