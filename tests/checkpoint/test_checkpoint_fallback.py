"""restore() falls back to the previous checkpoint when the newest cannot be read (truncated, not a checkpoint,
metadata of another shape, JSON nested thousands deep, a FIFO): one line names the file skipped and why, every
rank resumes from the same one; when none can be read, every rank raises one clear error instead of starting
afresh over them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from checkpoint_helpers import two_ranks
from hpcvod.runtime import HpcvodInputError
from hpcvod.runtime.checkpoint import Checkpoint, write_archive

META = "__hpcvod_checkpoint__"
NEWEST = "ckpt-000000000009.npz"


def _npz(path: Path, meta: object, **arrays: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.savez(f, **{META: np.array(meta if isinstance(meta, str) else json.dumps(meta))}, **arrays)


def _good_meta(**change: object) -> dict:
    meta = {"format": 1, "step": 9, "time": 0.0, "entries": [{"path": ["w"], "array": "a0"},
                                                             {"path": ["step"], "value": 9}]}
    meta.update(change)
    return meta


def _truncated(path: Path) -> None:
    write_archive(path, {"w": np.full(2, 9.0), "step": 9}, 9)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


BAD_NEWEST: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated zip": (_truncated, "damaged"),
    "not a zip": (lambda p: p.write_bytes(b"not a zip file"), "damaged"),
    "empty file": (lambda p: p.write_bytes(b""), "damaged"),
    "no metadata": (lambda p: np.savez(p, a0=np.ones(2)), "no hpcvod metadata in it"),
    "metadata a list": (lambda p: _npz(p, [1, 2], a0=np.ones(2)), "metadata is a JSON list, expected an object"),
    "metadata not JSON": (lambda p: _npz(p, "{oops", a0=np.ones(2)), "not valid JSON"),
    "metadata nested deep": (lambda p: _npz(p, "[" * 100000 + "]" * 100000), "JSON nested more than 8 levels"),
    "metadata Infinity": (lambda p: _npz(p, '{"format": 1, "step": Infinity, "entries": []}'),
                          "Infinity is not a finite number"),
    "other format": (lambda p: _npz(p, _good_meta(format=2), a0=np.ones(2)), "checkpoint format 2, expected 1"),
    "step a string": (lambda p: _npz(p, _good_meta(step="9"), a0=np.ones(2)), "metadata step '9'"),
    "entries a dict": (lambda p: _npz(p, _good_meta(entries={"w": 1})), "metadata entries: a JSON object"),
    "entry without path": (lambda p: _npz(p, _good_meta(entries=[{"value": 1}])), "metadata entry 0: expected"),
    "missing array": (lambda p: _npz(p, _good_meta(), a1=np.ones(2)), "array 'a0' is not in the archive"),
    "nested value": (lambda p: _npz(p, _good_meta(entries=[{"path": ["w"], "value": {"x": 1}}])),
                     "a JSON object, expected a plain value"),
    "bad float": (lambda p: _npz(p, _good_meta(entries=[{"path": ["w"], "float": "1e999"}])), "float '1e999'"),
    "key twice": (lambda p: _npz(p, _good_meta(entries=[{"path": ["step"], "value": 1},
                                                        {"path": ["step"], "value": 2}])), "['step'] stored twice"),
    "value and dict": (lambda p: _npz(p, _good_meta(entries=[{"path": ["w"], "value": 1},
                                                             {"path": ["w", "x"], "value": 2}])),
                       "['w'] both as a value and as a dict"),
    "renamed older": (lambda p: write_archive(p, {"w": np.full(2, 3.0), "step": 3}, 3),
                      "it holds step 3, its name says 9"),
    "fifo": (lambda p: os.mkfifo(p), "it is a FIFO, expected a regular file"),
    "folder": (lambda p: p.mkdir(), "it is a folder, expected a regular file"),
}


@pytest.mark.timeout(60)   # the FIFO blocked np.load for ever
@pytest.mark.parametrize("case", sorted(BAD_NEWEST))
def test_a_bad_newest_checkpoint_is_skipped_naming_why(tmp_path: Path, capsys, case: str) -> None:
    make, reason = BAD_NEWEST[case]
    with Checkpoint(tmp_path, keep=5, signals=()) as ckpt:
        ckpt.save({"w": np.full(2, 4.0), "step": 4})
        make(tmp_path / NEWEST)
        state = ckpt.restore({"w": np.zeros(2), "step": 0})
    assert ckpt.resumed_from == 4 and state["step"] == 4 and state["w"].tolist() == [4.0, 4.0]
    said = [line for line in capsys.readouterr().err.splitlines() if NEWEST in line]
    assert len(said) == 1 and said[0].startswith(f"hpcvod checkpoint: cannot read {tmp_path / NEWEST}: "), said
    assert reason in said[0] and said[0].endswith("; skipping it, trying an older one"), said


def test_when_no_checkpoint_can_be_read_restore_refuses_to_start_afresh(tmp_path: Path) -> None:
    (tmp_path / "ckpt-000000000004.npz").write_bytes(b"PK\x03\x04 half a zip")
    _truncated(tmp_path / NEWEST)
    with Checkpoint(tmp_path, signals=()) as ckpt:
        with pytest.raises(HpcvodInputError) as err:
            ckpt.restore({"w": np.zeros(2), "step": 0})
    text = str(err.value)
    assert text.startswith(f"Checkpoint.restore(): none of the 2 checkpoint(s) in {tmp_path} can be read "
                           f"(the newest, {tmp_path / NEWEST}: damaged"), text
    assert "\n" not in text and "move them away" in text


def test_a_skipped_file_does_not_push_the_good_ones_out(tmp_path: Path) -> None:
    """keep=1 with an unreadable ckpt-9 beside: the save after the fallback must keep its own file."""
    with Checkpoint(tmp_path, keep=1, signals=()) as ckpt:
        ckpt.save({"w": np.full(2, 4.0), "step": 4})
        _truncated(tmp_path / NEWEST)
        assert ckpt.restore({"w": np.zeros(2), "step": 0})["step"] == 4
        ckpt.save({"w": np.full(2, 5.0), "step": 5})
        assert ckpt.steps() == [5, 9]
        ckpt.save({"w": np.full(2, 9.0), "step": 9})   # the good step 9 replaces the bad one and counts again
        assert ckpt.steps() == [9]
    with Checkpoint(tmp_path, signals=()) as again:
        assert again.restore({"w": np.zeros(2), "step": 0})["step"] == 9


def _two_ranks(directory: Path, skipped: int) -> dict[int, dict]:
    """Each rank's RESULT; rank 0 alone says which files it skipped (``skipped`` lines)."""
    by_rank, stderr = two_ranks("fallback.py", str(directory))
    assert stderr.count("hpcvod checkpoint: cannot read") == skipped, stderr
    return by_rank


@pytest.mark.mpi
@pytest.mark.timeout(120)
def test_every_rank_resumes_from_the_same_fallback_or_raises_the_same_error(tmp_path: Path) -> None:
    write_archive(tmp_path / "ckpt-000000000004.npz", {"w": np.full(2, 4.0), "step": 4}, 4)
    _npz(tmp_path / NEWEST, "[" * 100000 + "]" * 100000)
    by_rank = _two_ranks(tmp_path, skipped=1)
    assert by_rank[0] == {"rank": 0, "resumed_from": 4, "w": [4.0, 4.0]}
    assert by_rank[1] == {"rank": 1, "resumed_from": 4, "w": [4.0, 4.0]}

    (tmp_path / "ckpt-000000000004.npz").write_bytes(b"not a zip file")
    by_rank = _two_ranks(tmp_path, skipped=2)
    assert by_rank[0]["error"] == by_rank[1]["error"] and "none of the 2 checkpoint(s)" in by_rank[0]["error"]
