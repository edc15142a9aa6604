"""hpcvod.runtime.checkpoint: what a requeued job relies on to resume exactly where it stopped."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from checkpoint_helpers import two_ranks
from hpcvod.runtime import HpcvodConfigError, HpcvodInputError
from hpcvod.runtime import checkpoint as ckmod
from hpcvod.runtime.checkpoint import Checkpoint, default_directory, read_archive, write_archive

REPO = Path(__file__).resolve().parents[2]


def rich_state() -> dict:
    rng = np.random.default_rng(1234)
    rng.random(5)  # advance it: the saved state is mid-stream
    return {
        "params": {"w": rng.standard_normal((3, 4)).astype(np.float32), "b": np.arange(4, dtype=np.int16)},
        "step": 17, "epoch": 2, "batch": 5,
        "rng": rng.bit_generator.state,         # holds 128-bit Python ints
        "lr": 0.1, "best": float("inf"), "worst": float("-inf"), "undefined": float("nan"),
        "done": False, "tag": "run-α", "note": None, "counter": np.int64(9),
    }


def assert_same(a: object, b: object, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (np.ndarray, np.generic)):
        assert isinstance(b, np.ndarray) and b.dtype == np.asarray(a).dtype, where
        np.testing.assert_array_equal(b, a, err_msg=where)
    elif isinstance(a, float) and np.isnan(a):
        assert isinstance(b, float) and np.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, where


def test_round_trip_keeps_every_value_and_type(tmp_path: Path) -> None:
    state = rich_state()
    write_archive(tmp_path / "c.npz", state, step=17)
    restored, step = read_archive(tmp_path / "c.npz")
    assert step == 17
    assert_same(state, restored)
    # a generator restored from the checkpoint continues the very same stream
    original = np.random.default_rng(); original.bit_generator.state = state["rng"]
    resumed = np.random.default_rng(); resumed.bit_generator.state = restored["rng"]
    np.testing.assert_array_equal(original.random(8), resumed.random(8))


def test_restore_without_checkpoint_returns_the_initial_state(tmp_path: Path) -> None:
    with Checkpoint(tmp_path / "none", signals=()) as ckpt:
        initial = {"w": np.ones(2), "step": 0}
        state = ckpt.restore(initial)
        assert ckpt.resumed_from is None
        assert state["step"] == 0 and state is not initial
        np.testing.assert_array_equal(state["w"], np.ones(2))


def test_save_then_restore_newest_and_keep_only_the_last_ones(tmp_path: Path) -> None:
    with Checkpoint(tmp_path, keep=2, signals=()) as ckpt:
        for step in (1, 2, 3):
            path = ckpt.save({"w": np.full(2, float(step)), "step": step})
            assert path == tmp_path / f"ckpt-{step:012d}.npz"
        assert ckpt.steps() == [2, 3]
        assert sorted(os.listdir(tmp_path)) == ["ckpt-000000000002.npz", "ckpt-000000000003.npz"]
    with Checkpoint(tmp_path, signals=()) as again:
        state = again.restore({"w": np.zeros(2), "step": 0})
        assert again.resumed_from == 3 and state["step"] == 3
        np.testing.assert_array_equal(state["w"], [3.0, 3.0])


def test_unreadable_newest_checkpoint_falls_back_to_the_previous(tmp_path: Path, capsys) -> None:
    with Checkpoint(tmp_path, keep=5, signals=()) as ckpt:
        ckpt.save({"w": np.ones(2), "step": 4})
        (tmp_path / "ckpt-000000000009.npz").write_bytes(b"not a zip file")   # e.g. a copy gone wrong
        state = ckpt.restore({"w": np.zeros(2), "step": 0})
    assert ckpt.resumed_from == 4 and state["step"] == 4
    assert "cannot read" in capsys.readouterr().err


def test_a_failed_write_leaves_no_checkpoint_and_no_temporary_file(tmp_path: Path, monkeypatch) -> None:
    def broken_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ckmod.np, "savez", broken_savez)
    with Checkpoint(tmp_path, signals=()) as ckpt:
        with pytest.raises(HpcvodInputError, match="No space left on device"):
            ckpt.save({"w": np.ones(2), "step": 1})
        assert os.listdir(tmp_path) == []
        assert ckpt.restore({"w": np.zeros(2), "step": 0})["step"] == 0


def test_checkpoint_of_another_model_is_refused_by_name(tmp_path: Path) -> None:
    with Checkpoint(tmp_path, signals=()) as ckpt:
        ckpt.save({"w": np.ones((2, 3)), "step": 5})
        with pytest.raises(HpcvodInputError, match=r"\['w'\].*float64\[2, 3\].*float64\[3, 3\]"):
            ckpt.restore({"w": np.zeros((3, 3)), "step": 0})
        with pytest.raises(HpcvodInputError, match=r"missing \['b'\]"):
            ckpt.restore({"w": np.zeros((2, 3)), "b": np.zeros(3), "step": 0})


@pytest.mark.parametrize("bad,match", [
    ({"w": [object()]}, r"\['w'\]: list is not storable"),
    ({1: 2}, "key 1 is not a string"),
    ({"opt": {}}, r"\['opt'\]: an empty dict"),
])
def test_unstorable_state_is_refused_before_writing(tmp_path: Path, bad: dict, match: str) -> None:
    with Checkpoint(tmp_path, signals=()) as ckpt:
        with pytest.raises(HpcvodInputError, match=match):
            ckpt.save(bad, step=1)
    assert os.listdir(tmp_path) == []


def test_step_comes_from_the_state_or_the_argument(tmp_path: Path) -> None:
    with Checkpoint(tmp_path, signals=()) as ckpt:
        with pytest.raises(HpcvodInputError, match="step=N"):
            ckpt.save({"w": np.ones(1)})
        assert ckpt.save({"w": np.ones(1)}, step=3).name == "ckpt-000000000003.npz"


def test_default_directory_follows_the_contract(tmp_path: Path) -> None:
    assert default_directory({"HPCVOD_CHECKPOINT_DIR": "/a", "HPCVOD_JOB_DIR": "/j"}) == Path("/a")
    assert default_directory({"HPCVOD_JOB_DIR": "/j"}) == Path("/j/checkpoints")
    with pytest.raises(HpcvodConfigError, match="HPCVOD_CHECKPOINT_DIR nor HPCVOD_JOB_DIR"):
        default_directory({})


def test_stop_signal_is_noticed_and_handlers_are_put_back(tmp_path: Path, capsys) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    with Checkpoint(tmp_path) as ckpt:
        assert ckpt.stop_requested() is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert ckpt.signalled == signal.SIGUSR1
        assert ckpt.stop_requested() is True
    assert signal.getsignal(signal.SIGUSR1) is previous
    assert "got SIGUSR1" in capsys.readouterr().err


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_two_ranks_agree_on_stop_and_share_rank0s_checkpoint(tmp_path: Path) -> None:
    by_rank, _ = two_ranks("two_ranks.py", str(tmp_path))
    for r in by_rank.values():
        assert r["before"] is False and r["after"] is True          # one rank's signal stops everyone
        assert r["resumed_from"] == 7 and r["step"] == 7 and r["w"] == [0.5, 1.5, 2.5]
        assert r["data"] == {"epoch": 1, "batch": 4}
    assert by_rank[0]["signalled"] is None and by_rank[1]["signalled"] == int(signal.SIGUSR1)
    assert by_rank[0]["files"] == ["ckpt-000000000007.npz"] and by_rank[1]["files"] == []   # only rank 0 writes


def test_job_script_stop_file_and_requeue_request(tmp_path: Path, monkeypatch) -> None:
    """The job-folder protocol with the Slurm script: stop-requested in, requeue-requested out."""
    monkeypatch.setenv("HPCVOD_JOB_DIR", str(tmp_path))
    monkeypatch.delenv("HPCVOD_CHECKPOINT_DIR", raising=False)
    with Checkpoint(signals=()) as ckpt:
        assert ckpt.directory == tmp_path / "checkpoints"
        assert ckpt.stop_requested() is False
        ckpt.save({"w": np.ones(1), "step": 1})
        assert not (tmp_path / ckmod.REQUEUE_FILE).exists()      # a routine save asks for nothing
        (tmp_path / ckmod.STOP_FILE).touch()                      # what the job script's USR1 trap does
        ckpt._next_poll = 0.0                                     # (the file is polled at most once a second)
        assert ckpt.stop_requested() is True
        ckpt.save({"w": np.ones(1), "step": 2})
        assert (tmp_path / ckmod.REQUEUE_FILE).read_text() == "2\n"
