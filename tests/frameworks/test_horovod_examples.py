"""Horovod's own examples as a corpus (issue 29 item 4): each script of Horovod's examples/pytorch, tensorflow2,
keras and mxnet that needs no Spark, Ray or GPU, run on 2 ranks with only its import lines changed (horovod ->
hpcvod), on the synthetic data of the offline harness (tests/frameworks/horovod_examples_harness, first on the
ranks' PYTHONPATH). docs/drop-in.md has the table; CORPUS is the same table, checked.

Horovod's examples are not in this repository (their code is Horovod's): scripts/horovod-examples.sh extracts
them from a Horovod checkout, and HPCVOD_HOROVOD_EXAMPLES names the folder; without it these tests skip.

Each entry is one of
- runs: exit 0 and the line the script prints when it has trained;
- runs with named changes: each (old, new, why) replaced once in the script (the old text must be there once,
  so the table stays true to the script), then as above;
- does not run: the run fails with the named error (checked, so that the table learns when it starts to run),
  or the test skips naming the missing package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from frameworks_helpers import ROOT, rank_env, require_framework

pytestmark = [pytest.mark.mpi, pytest.mark.frameworks]

HARNESS = Path(__file__).resolve().parent / "horovod_examples_harness"
EXAMPLES_VARIABLE = "HPCVOD_HOROVOD_EXAMPLES"
AS_HOROVOD = "hpcvod run --as-horovod"
# the script trains on a tf.data service: its compute job (1 rank) started beside it, the config file its argument
WITH_COMPUTE_JOB = "hpcvod run, beside a compute job"
_OPTIMIZER_VARIABLES = ("hvd.broadcast_variables(opt.variables(), root_rank=0)",
                        "hvd.broadcast_variables(opt.variables, root_rank=0)",
                        "Keras 3's optimizer.variables is a list, no longer a method")

_MXNET_FIRST = ("import mxnet as mx\n", "import hpcvod.mxnet as hvd\nimport mxnet as mx\n",
                "hpcvod.mxnet before mxnet: it gives MXNet 1.9.1 the np.bool NumPy 1.24 removed")


@dataclass(frozen=True)
class Example:
    path: str                      # under Horovod's examples/
    args: tuple[str, ...] = ()     # the script's own flags: small batches, few steps, CPU
    done: str = ""                 # a line (regex) the script prints once it has trained
    framework: str = "torch"
    changes: tuple[tuple[str, str, str], ...] = ()  # (old, new, why)
    launch: str = "hpcvod run"     # "python": the script starts its ranks itself with horovod.run;
    # "hpcvod run --as-horovod": the script unchanged, its horovod.X loaded as hpcvod.X; WITH_COMPUTE_JOB
    fails: str = ""                # does not run: the error it fails with
    needs: str = ""                # does not run here: a package this venv lacks


CORPUS: list[Example] = [
    Example("pytorch/pytorch_mnist.py", ("--epochs", "1", "--no-cuda"), r"Test set: Average loss: \S+, Accuracy"),
    Example("pytorch/pytorch_mnist.py", ("--epochs", "1", "--no-cuda", "--num-proc", "2"),
            r"Test set: Average loss: \S+, Accuracy", launch="python"),
    Example("pytorch/pytorch_mnist.py", ("--epochs", "1", "--no-cuda"), r"Test set: Average loss: \S+, Accuracy",
            launch=AS_HOROVOD),
    Example("pytorch/pytorch_synthetic_benchmark.py", ("--batch-size", "2", "--num-warmup-batches", "1",
            "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"), r"Total img/sec on 2 CPU\(s\)"),
    Example("pytorch/pytorch_imagenet_resnet50.py", needs="tensorboard, tqdm"),
    Example("pytorch/pytorch_lightning_mnist.py", needs="pytorch_lightning"),
    Example("tensorflow2/tensorflow2_mnist.py", (), r"Step #10\tLoss", "tensorflow",
            changes=(_OPTIMIZER_VARIABLES,)),
    Example("tensorflow2/tensorflow2_mnist.py", ("2", "localhost:2", "mpi"), r"Step #10\tLoss", "tensorflow",
            changes=(_OPTIMIZER_VARIABLES,), launch="python"),
    Example("tensorflow2/tensorflow2_keras_mnist.py", (), r"Epoch 2/2", "tensorflow"),
    Example("tensorflow2/tensorflow2_mnist_data_service.py", (), r"Epoch 2/2", "tensorflow",
            launch=WITH_COMPUTE_JOB),
    Example("tensorflow2/tensorflow2_synthetic_benchmark.py", ("--batch-size", "2", "--num-warmup-batches", "1",
            "--num-batches-per-iter", "1", "--num-iters", "2", "--no-cuda"), r"Total img/sec on 2 CPU\(s\)",
            "tensorflow", changes=(_OPTIMIZER_VARIABLES,)),
    Example("tensorflow2/tensorflow2_keras_synthetic_benchmark.py", ("--batch-size", "2", "--num-batches-per-iter",
            "1", "--num-iters", "2", "--no-cuda"), r"Total img/sec on 2 CPU\(s\)", "tensorflow"),
    Example("mxnet/mxnet_mnist.py", ("--epochs", "1", "--no-cuda"), r"Epoch\[0\]\tTrain", "mxnet",
            changes=(_MXNET_FIRST,)),
    # its ranks log nothing (the script configures logging outside main); main asserts 96% accuracy on rank 0
    Example("mxnet/mxnet_mnist.py", ("--epochs", "1", "--no-cuda", "--num-proc", "2"),
            "Running training through horovod.run", "mxnet", changes=(_MXNET_FIRST,), launch="python"),
    Example("mxnet/mxnet2_mnist.py", ("--epochs", "1", "--no-cuda"), framework="mxnet", changes=(_MXNET_FIRST,),
            fails="module 'mxnet.gluon' has no attribute 'metric'"),
    Example("mxnet/mxnet_imagenet_resnet50.py", needs="gluoncv"),
    Example("keras/keras_mnist.py", (), r"Test accuracy: ", "tensorflow", changes=(
        ("config = tf.ConfigProto()\nconfig.gpu_options.allow_growth = True\n"
         "config.gpu_options.visible_device_list = str(hvd.local_rank())\nK.set_session(tf.Session(config=config))\n",
         "", "TF1's session: TF 2 has tf.ConfigProto and tf.Session only as tf.compat.v1, Keras 3 no set_session"),
        ("'./checkpoint-{epoch}.h5'", "'./checkpoint-{epoch}.keras'",
         "Keras 3's ModelCheckpoint saves a whole model only as .keras"))),
    Example("keras/keras_mnist_advanced.py", framework="tensorflow",
            fails="cannot import name 'ImageDataGenerator' from 'keras.preprocessing.image'"),
    Example("keras/keras_imagenet_resnet50.py", framework="tensorflow",
            fails="module 'tensorflow' has no attribute 'ConfigProto'"),
]


def hpcvod_import_lines(source: str) -> str:
    """The script with its import lines changed, nothing else: ``import horovod`` -> ``import hpcvod as horovod``
    (the script goes on calling ``horovod.run``), ``import horovod.X``/``from horovod.X`` -> ``hpcvod.X``."""
    out = []
    for line in source.splitlines(keepends=True):
        if re.match(r"\s*import horovod\s*$", line):
            line = line.replace("import horovod", "import hpcvod as horovod", 1)
        elif re.match(r"\s*(import|from) horovod\.", line):
            line = line.replace("horovod.", "hpcvod.", 1)
        out.append(line)
    return "".join(out)


def examples_folder() -> Path:
    where = os.environ.get(EXAMPLES_VARIABLE)
    if not where:
        pytest.skip(f"{EXAMPLES_VARIABLE} is not set: scripts/horovod-examples.sh extracts Horovod's examples from a "
                    f"Horovod checkout and prints the line to set")
    folder = Path(where)
    if not (folder / "pytorch" / "pytorch_mnist.py").is_file():
        pytest.fail(f"{EXAMPLES_VARIABLE}={where}: expected Horovod's examples/ folder (pytorch/pytorch_mnist.py in it)")
    return folder


def prepared(example: Example, folder: Path, into: Path) -> Path:
    source = (folder / example.path).read_text()
    if example.launch != AS_HOROVOD:
        source = hpcvod_import_lines(source)
    for old, new, why in example.changes:
        assert source.count(old) == 1, f"{example.path}: the change for {why!r} expects {old!r} once in the script"
        source = source.replace(old, new)
    script = into / Path(example.path).name
    script.write_text(source)
    for helper in (folder / example.path).parent.glob(Path(example.path).stem + "_*.py"):   # modules it imports
        (into / helper.name).write_text(hpcvod_import_lines(helper.read_text()))
    return script


def run_example(example: Example, script: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = rank_env({"PYTHONPATH": f"{HARNESS}{os.pathsep}{ROOT}", "HOME": str(cwd), "KERAS_HOME": str(cwd / "keras"),
                    "TF_CPP_MIN_LOG_LEVEL": "3"})
    if example.launch == WITH_COMPUTE_JOB:
        return run_beside_compute_job(script, cwd, env)
    if example.launch == "python":
        argv = [sys.executable, str(script), *example.args]
    else:
        flags = ["--as-horovod"] if example.launch == AS_HOROVOD else []
        argv = [sys.executable, "-m", "hpcvod.cli", "run", *flags, "-np", "2", sys.executable, str(script), *example.args]
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=400, cwd=str(cwd))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{example.path} did not finish within 400 s\n{(exc.stdout or '')[-3000:]}\n"
                    f"{(exc.stderr or '')[-3000:]}")


def run_beside_compute_job(script: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The training script on 2 ranks and its tf.data service compute job on 1, meeting through CONFIG; the
    script's last line (``compute_client().shutdown()`` on rank 0) must end the compute job."""
    config = cwd / "compute-config"
    hpcvod_run = [sys.executable, "-m", "hpcvod.cli", "run"]
    compute = subprocess.Popen([*hpcvod_run, "-np", "1", sys.executable, "-m", "hpcvod.tensorflow.data.compute_worker",
                                "--dispatchers", "1", "--dispatcher-side", "compute", str(config)],
                               env=env, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        training = subprocess.run([*hpcvod_run, "-np", "2", sys.executable, str(script), str(config)], env=env,
                                  cwd=str(cwd), capture_output=True, text=True, timeout=400)
        compute_output, _ = compute.communicate(timeout=120)
    finally:
        compute.kill()
    assert compute.returncode == 0, f"the compute job: exit status {compute.returncode}\n{compute_output[-3000:]}"
    return training


def case_id(example: Example) -> str:
    return Path(example.path).stem + {"python": " horovod.run", AS_HOROVOD: " as-horovod"}.get(example.launch, "")


@pytest.mark.parametrize("example", CORPUS, ids=case_id)
def test_horovod_example_on_two_ranks(example: Example, tmp_path: Path) -> None:
    folder = examples_folder()
    if example.needs:
        pytest.skip(f"does not run here: {example.needs} not installed in {sys.prefix}")
    require_framework(example.framework)
    script = prepared(example, folder, tmp_path)
    proc = run_example(example, script, tmp_path)
    output = proc.stdout + proc.stderr
    if example.fails:
        assert proc.returncode != 0 and example.fails in output, (
            f"{example.path} was expected to fail with {example.fails!r} (docs/drop-in.md): exit status "
            f"{proc.returncode}\n{output[-4000:]}")
        return
    assert proc.returncode == 0, f"{example.path}: exit status {proc.returncode}\n{output[-6000:]}"
    assert re.search(example.done, output), f"{example.path}: no {example.done!r}\n{output[-4000:]}"
