"""What an MPIJob (kubeflow.org/v2beta1) may hold, written for these tests from reading Kubeflow's MPI Operator:
its Go types (pkg/apis/kubeflow/v2beta1/types.go), its CRD (manifests/base/kubeflow.org_mpijobs.yaml, the
openAPIV3Schema the API server checks) and the operator's own admission rules (pkg/apis/kubeflow/validation/
validation.go), read at github.com/kubeflow/mpi-operator commit caa3c47 (2026-07-02; v0.4.0 has no MPICH and no
launcherCreationPolicy, v0.5.0 has both). Only the facts are recorded here: field names, types, enums, what is
required. The pod template holds a core/v1 PodTemplateSpec; the fields of it that hpcvod writes are listed with
the CRD's types (containers[].name required, resources as int-or-string quantities, tolerations' fields...).

Where the CRD says nothing the API server would refuse, the schema is stricter on purpose: every object hpcvod
writes is closed (additionalProperties false), so a misspelt field fails here instead of being pruned by the API
server without a word.
"""

from __future__ import annotations

import re
from typing import Any

INT32 = {"type": "integer", "minimum": -(2 ** 31), "maximum": 2 ** 31 - 1}
INT64 = {"type": "integer"}
# resource.Quantity in the CRD: x-kubernetes-int-or-string with this pattern
QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

ENV_VAR = {"type": "object", "required": ["name"], "additionalProperties": False,
           "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}
VOLUME_MOUNT = {"type": "object", "required": ["mountPath", "name"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "mountPath": {"type": "string"},
                               "readOnly": {"type": "boolean"}}}
CONTAINER = {
    "type": "object", "required": ["name"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string"}, "image": {"type": "string"},
        "imagePullPolicy": {"enum": ["Always", "Never", "IfNotPresent"]},  # core/v1 PullPolicy
        "command": {"type": "array", "items": {"type": "string"}},
        "args": {"type": "array", "items": {"type": "string"}},
        "workingDir": {"type": "string"},
        "env": {"type": "array", "items": ENV_VAR},
        "resources": {"type": "object", "additionalProperties": False,
                      "properties": {"limits": {"type": "object", "additionalProperties": QUANTITY},
                                     "requests": {"type": "object", "additionalProperties": QUANTITY}}},
        "volumeMounts": {"type": "array", "items": VOLUME_MOUNT}}}
TOLERATION = {"type": "object", "additionalProperties": False,
              "properties": {"key": {"type": "string"}, "operator": {"enum": ["Exists", "Equal"]},
                             "value": {"type": "string"},
                             "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                             "tolerationSeconds": INT64}}
VOLUME = {"type": "object", "required": ["name"], "additionalProperties": False,
          "properties": {"name": {"type": "string"},
                         "emptyDir": {"type": "object", "additionalProperties": False,
                                      "properties": {"medium": {"type": "string"}, "sizeLimit": QUANTITY}}}}
POD_SPEC = {"type": "object", "required": ["containers"], "additionalProperties": False,
            "properties": {"containers": {"type": "array", "minItems": 1, "items": CONTAINER},
                           "serviceAccountName": {"type": "string"}, "nodeSelector": STRING_MAP,
                           "tolerations": {"type": "array", "items": TOLERATION},
                           "volumes": {"type": "array", "items": VOLUME}}}
REPLICA_SPEC = {
    "type": "object", "required": ["replicas", "restartPolicy", "template"], "additionalProperties": False,
    "properties": {"replicas": INT32,
                   # types.go allows Always, OnFailure, Never, ExitCode; validation.go admits Never and OnFailure
                   "restartPolicy": {"enum": ["Never", "OnFailure"]},
                   "template": {"type": "object", "additionalProperties": False,
                                "properties": {"metadata": {"type": "object"}, "spec": POD_SPEC}}}}
RUN_POLICY = {
    "type": "object", "required": ["cleanPodPolicy"], "additionalProperties": False,
    "properties": {"cleanPodPolicy": {"enum": ["None", "Running", "All"]},
                   "ttlSecondsAfterFinished": {**INT32, "minimum": 0},
                   "activeDeadlineSeconds": {**INT64, "minimum": 0},
                   "backoffLimit": {**INT32, "minimum": 0},
                   "suspend": {"type": "boolean"},
                   "managedBy": {"enum": ["kubeflow.org/mpi-operator", "kueue.x-k8s.io/multikueue"]},
                   "schedulingPolicy": {"type": "object"}}}
MPIJOB_V2BETA1 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "kubeflow.org/v2beta1"},
        "kind": {"const": "MPIJob"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False,
                     "properties": {"name": {"type": "string"}, "namespace": {"type": "string"},
                                    "labels": STRING_MAP, "annotations": STRING_MAP}},
        "spec": {
            # the CRD requires mpiReplicaSpecs; validation.go also slotsPerWorker, runPolicy.cleanPodPolicy,
            # sshAuthMountPath and mpiImplementation (the defaults fill them in on the server; hpcvod writes them)
            "type": "object", "additionalProperties": False,
            "required": ["mpiReplicaSpecs", "slotsPerWorker", "runPolicy", "sshAuthMountPath", "mpiImplementation"],
            "properties": {
                "slotsPerWorker": {**INT32, "minimum": 0},
                "runLauncherAsWorker": {"type": "boolean"},
                "runPolicy": RUN_POLICY,
                "sshAuthMountPath": {"type": "string", "minLength": 1},
                "launcherCreationPolicy": {"enum": ["AtStartup", "WaitForWorkersReady"]},
                "mpiImplementation": {"enum": ["OpenMPI", "Intel", "MPICH"]},
                "mpiReplicaSpecs": {"type": "object", "additionalProperties": False, "required": ["Launcher"],
                                    "properties": {"Launcher": REPLICA_SPEC, "Worker": REPLICA_SPEC}}}}}}

# k8s.io/apimachinery IsDNS1035Label / IsDNS1123Label
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def mpijob_problems(manifest: Any) -> list[str]:
    """Every way ``manifest`` breaks the MPIJob v2beta1 API as recorded above: the schema, then validation.go's
    rules across fields. [] when it would be admitted."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(MPIJOB_V2BETA1)
    problems = [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                for e in validator.iter_errors(manifest)]
    if problems:
        return problems
    name, spec = manifest["metadata"]["name"], manifest["spec"]
    replicas = spec["mpiReplicaSpecs"]
    workers = replicas.get("Worker", {}).get("replicas", 1)
    # validateMPIJobName: the last worker's pod hostname must be a DNS-1035 label (so must the launcher's)
    for pod in (f"{name}-worker-{max(workers, 1) - 1}", f"{name}-launcher"):
        if len(pod) > 63 or not DNS1035_LABEL.fullmatch(pod):
            problems.append(f"metadata.name: {pod!r} is no DNS-1035 label")
    namespace = manifest["metadata"].get("namespace")
    if namespace is not None and (len(namespace) > 63 or not DNS1123_LABEL.fullmatch(namespace)):
        problems.append(f"metadata.namespace: {namespace!r} is no DNS-1123 label")
    if replicas["Launcher"]["replicas"] != 1:  # validateLauncherReplicaSpec
        problems.append("spec.mpiReplicaSpecs.Launcher.replicas: must be 1")
    if "Worker" in replicas and replicas["Worker"]["replicas"] < 1:  # validateWorkerReplicaSpec
        problems.append("spec.mpiReplicaSpecs.Worker.replicas: must be >= 1")
    for role, replica in replicas.items():
        names = [c["name"] for c in replica["template"]["spec"]["containers"]]
        if len(set(names)) != len(names):  # containers: x-kubernetes-list-map-keys [name]
            problems.append(f"spec.mpiReplicaSpecs.{role}: two containers named alike")
    return problems
