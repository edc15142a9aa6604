"""Every module path Horovod's scripts import exists under ``hpcvod.`` (issue 29, item 8).

The list was collected from Horovod's own examples/ and test/parallel/ (every ``import horovod.X`` and
``from horovod.X import Y``), plus the modules Horovod documents beside them (compression, functions,
sync_batch_norm, common.exceptions). Left out on purpose: ``horovod.spark``/``horovod.ray``/``horovod.runner``
(launchers and cluster integrations hpcvod replaces with its own CLI), ``horovod._keras`` (private),
``horovod.tensorflow.xla_mpi_ops`` (XLA GPU ops), the ``elastic`` modules (being built separately), and
``BestModelCheckpoint`` (a helper of horovod.spark's Keras estimator). docs/drop-in.md has the table.

Each framework's modules are imported in one fresh interpreter (the pytest process stays free of frameworks,
and importing must not start MPI: checked too).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from frameworks_helpers import ROOT, rank_env, require_framework

pytestmark = [pytest.mark.frameworks]

# framework -> {module path under hpcvod: names Horovod's scripts take from it}
MODULES: dict[str, dict[str, list[str]]] = {
    "torch": {
        "hpcvod.torch": ["init", "allreduce", "DistributedOptimizer", "Average", "join"],
        "hpcvod.torch.mpi_ops": ["synchronize", "allreduce_async_", "size", "rank", "Average", "Sum", "Adasum",
                                 "ProcessSet", "global_process_set", "rocm_built", "_basics"],
        "hpcvod.torch.compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
        "hpcvod.torch.functions": ["broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
                                   "allgather_object"],
        "hpcvod.torch.optimizer": ["DistributedOptimizer"],
        "hpcvod.torch.sync_batch_norm": ["SyncBatchNorm"],
        "hpcvod.common": [],
        "hpcvod.common.exceptions": ["HorovodInternalError", "HostsUpdatedInterrupt"],
        "hpcvod.common.process_sets": ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"],
        "hpcvod.common.basics": ["HorovodBasics"],
        "hpcvod.common.util": ["is_version_greater_equal_than", "env", "mpi_built", "gloo_built"],
    },
    "tensorflow": {
        "hpcvod.tensorflow": ["init", "allreduce", "DistributedGradientTape", "Average"],
        "hpcvod.tensorflow.mpi_ops": ["allgather", "broadcast", "size_op", "rank_op", "local_rank_op", "Average",
                                      "ProcessSet", "_basics"],
        "hpcvod.tensorflow.compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
        "hpcvod.tensorflow.functions": ["broadcast_variables", "broadcast_object", "broadcast_object_fn",
                                        "allgather_object"],
        "hpcvod.tensorflow.sync_batch_norm": ["SyncBatchNormalization"],
        "hpcvod.tensorflow.util": ["_executing_eagerly"],
        "hpcvod.tensorflow.keras": ["DistributedOptimizer", "callbacks", "load_model"],
        "hpcvod.tensorflow.keras.callbacks": ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                                              "LearningRateScheduleCallback", "LearningRateWarmupCallback"],
        "hpcvod.tensorflow.data.compute_service": ["TfDataServiceConfig", "tf_data_service"],
        "hpcvod.tensorflow.data.compute_worker": ["main"],
        "hpcvod.keras": ["DistributedOptimizer", "callbacks"],
        "hpcvod.keras.callbacks": ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
                                   "LearningRateScheduleCallback", "LearningRateWarmupCallback"],
    },
    "mxnet": {
        "hpcvod.mxnet": ["init", "allreduce", "DistributedTrainer"],
        "hpcvod.mxnet.mpi_ops": ["allreduce", "allreduce_", "broadcast_", "size", "rank", "_basics"],
        "hpcvod.mxnet.compression": ["Compression", "Compressor", "NoneCompressor", "FP16Compressor"],
        "hpcvod.mxnet.functions": ["broadcast_object", "allgather_object"],
    },
}

# Run in the fresh interpreter: import each module, report the names it lacks, and whether MPI got started.
_PROBE = r"""
import importlib, json, sys
wanted = json.loads(sys.argv[1])
out, modules = {}, {}
for module in wanted:
    try:
        modules[module] = importlib.import_module(module)
    except Exception as exc:
        out[module] = f"import failed: {type(exc).__name__}: {exc}"
# before the names: reading a reduction op (Average...) starts MPI on purpose
mpi = sys.modules.get("mpi4py.MPI")
out["<mpi started by importing>"] = "yes" if mpi is not None and mpi.Is_initialized() else "no"
for module, m in modules.items():
    missing = [n for n in wanted[module] if not hasattr(m, n)]
    out[module] = f"lacks {missing}" if missing else "ok"
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def imported() -> dict[str, dict[str, str]]:
    return {}


def _probe(framework: str, cache: dict[str, dict[str, str]]) -> dict[str, str]:
    require_framework("mxnet" if framework == "mxnet" else framework)
    if framework not in cache:
        proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(MODULES[framework])], capture_output=True,
                              text=True, timeout=300, env=rank_env(), cwd=str(ROOT))
        assert proc.returncode == 0, f"the import probe failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        cache[framework] = json.loads(proc.stdout.strip().splitlines()[-1])
    return cache[framework]


@pytest.mark.parametrize("framework,module", [(f, m) for f, mods in MODULES.items() for m in mods])
def test_horovod_module_path_exists_under_hpcvod(imported: dict[str, Any], framework: str, module: str) -> None:
    assert _probe(framework, imported)[module] == "ok", f"{module}: {_probe(framework, imported)[module]}"


@pytest.mark.parametrize("framework", list(MODULES))
def test_importing_the_module_paths_does_not_start_mpi(imported: dict[str, Any], framework: str) -> None:
    assert _probe(framework, imported)["<mpi started by importing>"] == "no"


def test_mpi_ops_is_the_framework_api_itself() -> None:
    """``horovod.torch.mpi_ops.synchronize`` and ``hvd.synchronize`` are one function (no second copy)."""
    require_framework("torch")
    proc = subprocess.run([sys.executable, "-c",
                           "import hpcvod.torch as hvd, hpcvod.torch.mpi_ops as ops, hpcvod.torch.functions as f\n"
                           "assert ops.synchronize is hvd.synchronize and f.broadcast_object is hvd.broadcast_object\n"
                           "assert ops._basics._get_process_set_ids_and_ranks is not None\n"
                           "from hpcvod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt\n"
                           "assert HorovodInternalError is hvd.HorovodInternalError\n"
                           "assert not issubclass(HostsUpdatedInterrupt, HorovodInternalError)\n"
                           "assert HostsUpdatedInterrupt(True).skip_sync is True\n"],
                          capture_output=True, text=True, timeout=120, env=rank_env(), cwd=str(ROOT))
    assert proc.returncode == 0, proc.stderr[-3000:]
