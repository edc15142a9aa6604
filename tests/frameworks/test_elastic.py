"""Elastic training (``hvd.elastic``, docs/elastic.md) with real ranks under Open MPI's ULFM: a rank that is
SIGKILLed or raises mid-epoch leaves the others training on, from the last commit, in a smaller world.

Each test is one ``mpirun --with-ft ulfm -n 3`` of tests/frameworks/workers/torch_elastic_worker.py (PyTorch) or
keras_elastic_worker.py (Keras 3 ``fit``); the failure itself takes well under a second to recover from, starting
three torch or TensorFlow processes takes most of the time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from frameworks_helpers import MPIEXEC, ROOT, WORKERS, rank_env, require_framework, run_or_fail

OPENMPI = ROOT / ".venvs" / "openmpi"
WORKER = WORKERS / "torch_elastic_worker.py"
KERAS_WORKER = WORKERS / "keras_elastic_worker.py"
LIMIT_MESSAGE = "Horovod was shutdown because number of resets during elastic job exceeded limit: {}"


def _openmpi() -> Path:
    if not (OPENMPI / "bin" / "mpirun").exists():
        message = f"no Open MPI venv with mpirun at {OPENMPI} (scripts/setup-venvs.sh creates it)"
        if os.environ.get("HPCVOD_REQUIRE_ALL_MPI") == "1":
            pytest.fail(message + "; HPCVOD_REQUIRE_ALL_MPI=1 requires every flavour")
        pytest.skip(message)
    return OPENMPI


def _torch_site() -> str:
    """The site-packages holding this venv's torch, which the Open MPI venv lacks (the worker appends it)."""
    require_framework("torch")
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    return str(Path(spec.origin).parents[1])


def run_elastic(mode: str, out: Path, ulfm: bool = True, extra: dict[str, str] | None = None,
                timeout: float = 180.0, worker: Path = WORKER) -> tuple[subprocess.CompletedProcess,
                                                                      dict[int, dict[str, Any]]]:
    """Three Open MPI ranks of ``worker`` in ``mode`` (none for the Keras worker); returns mpirun's outcome and
    the results of the ranks that finished, by the rank they started as."""
    venv = _openmpi()
    argv = [str(venv / "bin" / "mpirun"), "--oversubscribe", *(["--with-ft", "ulfm"] if ulfm else []), "-n", "3",
            str(venv / "bin" / "python"), str(worker), *([mode] if mode else []), str(out)]
    env = rank_env({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_pml": "ob1",
                    "OMPI_MCA_btl": "self,sm,tcp", "OMPI_MCA_rmaps_base_oversubscribe": "1",
                    "HPCVOD_TEST_TORCH_SITE": _torch_site(), "HPCVOD_TEST_WORKER_TIMEOUT": str(timeout - 20),
                    **(extra or {})})
    proc = run_or_fail(argv, env, timeout, f"mpirun -n 3 {worker.name} {mode}")
    results = {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    return proc, results


def _explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit status {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"


def _replay(history: list) -> list[list[float]]:
    """The parameters that the committed history alone gives: one SGD step per recorded step, on the mean
    loss of every rank's batch (what averaging the ranks' gradients computes), from the same start."""
    import torch
    spec = importlib.util.spec_from_file_location("torch_elastic_worker", WORKER)
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    x, y = worker.data()
    model = worker.fresh_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _, parts in history:
        optimizer.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x[p]), y[p]) for p in parts) / len(parts)
        loss.backward()
        optimizer.step()
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def assert_trained_on(results: dict[int, dict[str, Any]], survivors: list[int], steps: dict[int, list[int]]) -> None:
    """The survivors ended in a world of their own size, after one reset, holding identical parameters; the
    committed history has, per epoch, the expected world size of each step (steps after the last commit before
    the failure were rolled back, not repeated), every sample exactly once, and gives those parameters."""
    assert sorted(results) == survivors, f"results from ranks {sorted(results)}, expected {survivors}"
    first = results[survivors[0]]
    for start_rank, result in results.items():
        assert result["size"] == len(survivors) and result["rank"] == survivors.index(start_rank), result
        assert [size for _, size in result["resets"]] == [len(survivors)], result["resets"]
        assert result["errors"], f"rank {start_rank}: its training function saw no HorovodInternalError"
        assert result["params"] == first["params"], "the survivors' parameters differ"
        assert result["history"] == first["history"], "the survivors' committed histories differ"
    history = first["history"]
    for epoch, sizes in steps.items():
        assert [len(parts) for e, parts in history if e == epoch] == sizes, f"epoch {epoch}: steps per world size"
        samples = sorted(i for e, parts in history if e == epoch for part in parts for i in part)
        assert samples == list(range(96)), f"epoch {epoch}: samples not each seen exactly once"
    replayed = _replay(history)
    for got, want in zip(first["params"], replayed):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), "parameters differ from the committed history's"


# 3 ranks: 8 steps of 12 samples per epoch, committed every 2 steps. The failure comes after step 5, so steps
# 1-4 (48 samples) stay committed and the other 48 take 6 steps at 2 ranks; epoch 1 is 12 steps at 2 ranks.
AFTER_ONE_FAILURE = {0: [3] * 4 + [2] * 6, 1: [2] * 12}


@pytest.mark.parametrize("victim", [2, 0])
def test_a_killed_rank_leaves_the_others_training_from_the_last_commit(tmp_path: Path, victim: int) -> None:
    """Rank 2, or rank 0 (the watchdog's hub, and the rank the state is broadcast from)."""
    proc, results = run_elastic("kill" if victim == 2 else "kill0", tmp_path)
    assert proc.returncode == 0, _explain(proc)
    assert_trained_on(results, [r for r in range(3) if r != victim], AFTER_ONE_FAILURE)
    assert f"rank {victim} (pid" in proc.stderr or f"rank {victim} died" in proc.stderr, _explain(proc)
    for result in results.values():
        seen, first_step_after = result["times"]["reset"][0]
        assert first_step_after is not None and first_step_after > seen


def test_a_rank_that_raises_leaves_and_the_others_train_on(tmp_path: Path) -> None:
    proc, results = run_elastic("raise", tmp_path)
    # the leaver exits 0 while other ranks train on (Horovod's job succeeds too); its error is in the output
    assert proc.returncode == 0, _explain(proc)
    assert_trained_on(results, [0, 1], AFTER_ONE_FAILURE)
    assert "rank 2 left the elastic job: RuntimeError: injected failure on the rank that started as 2" \
        in proc.stderr, _explain(proc)


def test_every_rank_failing_ends_the_job_non_zero_naming_each(tmp_path: Path) -> None:
    proc, results = run_elastic("allraise", tmp_path)
    assert proc.returncode != 0, _explain(proc)
    assert not results
    for rank in range(3):
        assert f"rank {rank} left the elastic job: RuntimeError: injected failure on the rank that started as " \
               f"{rank}" in proc.stderr, _explain(proc)
    assert "no rank is left in the elastic job" in proc.stderr


@pytest.mark.parametrize("limit", [1, 2])
def test_the_reset_limit_ends_the_job_with_horovods_message(tmp_path: Path, limit: int) -> None:
    """Two failures, one after the other: a limit of 1 ends the job at the second reset, 2 lets it finish."""
    proc, results = run_elastic("twice", tmp_path, extra={"HPCVOD_ELASTIC_RESET_LIMIT": str(limit)})
    if limit == 1:
        assert proc.returncode != 0 and not results, _explain(proc)
        assert LIMIT_MESSAGE.format(1) in proc.stderr, _explain(proc)
    else:
        assert proc.returncode == 0, _explain(proc)
        assert sorted(results) == [0] and results[0]["size"] == 1, results
        assert [size for _, size in results[0]["resets"]] == [2, 1]


def test_open_mpi_without_ulfm_is_refused_in_one_line(tmp_path: Path) -> None:
    proc, results = run_elastic("none", tmp_path, ulfm=False, timeout=120)
    assert proc.returncode != 0 and not results, _explain(proc)
    assert "hvd.elastic.run needs Open MPI's fault tolerance: start the job with `mpirun --with-ft ulfm`" \
        in proc.stderr, _explain(proc)


def test_mpich_is_refused_in_one_line_instead_of_hanging_later(tmp_path: Path) -> None:
    require_framework("torch")
    if not MPIEXEC.exists():
        pytest.skip("no MPICH mpiexec in this venv")
    argv = [str(MPIEXEC), "-n", "2", str(Path(MPIEXEC).parent / "python"), str(WORKER), "none", str(tmp_path)]
    proc = run_or_fail(argv, rank_env({"HPCVOD_TEST_WORKER_TIMEOUT": "100"}), 120, f"mpiexec -n 2 {WORKER.name} none")
    assert proc.returncode != 0 and not list(tmp_path.glob("rank*.json")), _explain(proc)
    assert "hvd.elastic.run needs an MPI that survives a dead rank (ULFM): the Open MPI flavour started with " \
           "`mpirun --with-ft ulfm`; this job runs mpich" in proc.stderr, _explain(proc)


def test_keras_fit_goes_on_after_a_killed_rank(tmp_path: Path) -> None:
    """Keras 3 ``fit`` (its collectives inside a ``tf.function``) with KerasState and Horovod's state callbacks:
    rank 2 dies in the second of three epochs, ranks 0 and 1 finish the three with identical weights."""
    require_framework("tensorflow")
    proc, results = run_elastic("", tmp_path, worker=KERAS_WORKER)
    assert proc.returncode == 0, _explain(proc)
    assert sorted(results) == [0, 1], _explain(proc)
    for start_rank, result in results.items():
        assert (result["rank"], result["size"], result["epoch"]) == (start_rank, 2, 3), result
        assert [size for _, size in result["resets"]] == [2] and result["errors"], result
        assert result["weights"] == results[0]["weights"], "the survivors' weights differ"
