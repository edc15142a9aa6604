"""Pieces of the runtime that need no MPI launch: settings, the timeline writer, errors, compression."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcvod.runtime import errors
from hpcvod.runtime import handles as K
from hpcvod.runtime.compression import Compression
from hpcvod.runtime.config import Settings
from hpcvod.runtime.handles import Handle, Signature
from hpcvod.runtime.timeline import Timeline, open_timeline

ROOT = Path(__file__).resolve().parents[2]


def test_settings_defaults_match_the_contract() -> None:
    s = Settings.from_env({})
    assert s.fusion_threshold == 128 * 1024 * 1024
    assert s.cycle_time_ms == 0.0
    assert s.cache_capacity == 1024
    assert s.timeline is None
    assert s.stall_check_time_seconds == 60.0
    assert s.stall_shutdown_time_seconds == 0.0
    assert s.hierarchical_allreduce is False
    assert s.init_timeout_seconds == 300.0


def test_settings_accept_horovod_names_and_prefer_hpcvod() -> None:
    s = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_CYCLE_TIME": "0.5",
                           "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_STALL_CHECK_DISABLE": "1"})
    assert (s.fusion_threshold, s.cycle_time_ms, s.timeline, s.stall_check_disable) == \
        (1048576, 0.5, "/tmp/t.json", True)
    s = Settings.from_env({"HOROVOD_FUSION_THRESHOLD": "1", "HPCVOD_FUSION_THRESHOLD": "2"})
    assert s.fusion_threshold == 2


@pytest.mark.parametrize("var, value", [("HPCVOD_FUSION_THRESHOLD", "lots"), ("HOROVOD_CACHE_CAPACITY", "-1"),
                                        ("HPCVOD_STALL_CHECK_TIME_SECONDS", "nan"),
                                        ("HPCVOD_GPU_OPERATIONS", "gloo"), ("HPCVOD_HIERARCHICAL_ALLREDUCE", "maybe"),
                                        ("HPCVOD_INIT_TIMEOUT", "-5")])
def test_bad_settings_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(errors.HpcvodConfigError) as err:
        Settings.from_env({var: value})
    assert str(err.value).startswith(f"{var}={value!r}: expected")


def test_error_family() -> None:
    for cls in (errors.HpcvodNotInitializedError, errors.HpcvodConfigError, errors.HpcvodInputError,
                errors.HpcvodWorldSizeError, errors.HpcvodMismatchError, errors.HpcvodRankFailureError,
                errors.HpcvodStallError, errors.HpcvodShutdownError):
        assert issubclass(cls, errors.HpcvodError)
    assert issubclass(errors.HpcvodStallError, errors.HpcvodRankFailureError)
    assert issubclass(errors.HpcvodNotInitializedError, ValueError)   # Horovod raises ValueError there
    assert errors.HorovodInternalError is errors.HpcvodError


def test_import_does_not_start_mpi_and_calls_before_init_fail_clearly() -> None:
    code = ("import sys, hpcvod.runtime as hvd\n"
            "assert 'mpi4py.MPI' not in sys.modules, 'importing hpcvod.runtime initialised MPI'\n"
            "assert not hvd.is_initialized()\n"
            "try:\n    hvd.size()\nexcept hvd.HpcvodNotInitializedError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "hpcvod has not been initialized; use hvd.init()." in out.stdout


def test_timeline_is_valid_chrome_trace_json(tmp_path: Path) -> None:
    path = tmp_path / "tl.json"   # its folder must exist: the timeline creates none (test_timeline_failures.py)
    tl = Timeline(str(path), rank=0, mark_cycles=True)
    w = Handle("grad.w", K.ALLREDUCE, Signature(K.ALLREDUCE), np.zeros((2, 3), np.float32))
    b = Handle("allreduce.grad.b", K.ALLREDUCE, Signature(K.ALLREDUCE), np.zeros(3, np.float32))
    tl.negotiated([w, b], 1.0, 1.5)
    tl.spans(["grad.w", "allreduce.grad.b"], "MPI_ALLREDUCE", 1.5, 1.75, {"fused": 2})
    tl.executed([w, b], 1.8)
    tl.cycle_mark(1.2)
    tl.close()
    events = json.loads(path.read_text())
    header = events[0]
    assert header["pid"] == 0 and header["args"]["rank"] == 0 and "start_time_since_epoch_in_micros" in header["args"]
    rows = {e["args"]["name"]: e["pid"] for e in events if e.get("name") == "process_name" and e["pid"]}
    # Horovod's row names: <op>.<name>; a name that already has the prefix keeps it
    assert set(rows) == {"allreduce.grad.w", "allreduce.grad.b"}
    row_w = [(e["ph"], e.get("name")) for e in events if e.get("pid") == rows["allreduce.grad.w"] and e["ph"] != "M"]
    assert row_w == [("B", "NEGOTIATE_ALLREDUCE"), ("E", None), ("B", "ALLREDUCE"), ("B", "MPI_ALLREDUCE"),
                     ("E", None), ("E", None)]
    mpi = next(e for e in events if e.get("name") == "MPI_ALLREDUCE")
    assert mpi["args"] == {"fused": 2}
    end = [e for e in events if e.get("pid") == rows["allreduce.grad.w"] and e["ph"] == "E"][-1]
    assert end["ts"] - mpi["ts"] == pytest.approx(300000.0) and end["args"] == {"dtype": "float32", "shape": "[2, 3]"}
    assert [e for e in events if e["ph"] == "i"] == [{"name": "CYCLE_START", "ph": "i", "ts": pytest.approx(
        (1.2 - tl._origin) * 1e6, abs=1e-3), "pid": 0, "s": "g"}]


def test_timeline_goes_to_rank_0_unless_the_path_names_the_rank(tmp_path: Path) -> None:
    assert open_timeline(str(tmp_path / "t.json"), rank=1) is None
    per_rank = open_timeline(str(tmp_path / "t.{rank}.json"), rank=1)
    assert per_rank is not None and per_rank.path.endswith("t.1.json")
    per_rank.close()


def test_fp16_compression_round_trip() -> None:
    x = np.linspace(-3, 3, 11, dtype=np.float32)
    small, ctx = Compression.fp16.compress(x)
    assert small.dtype == np.float16
    back = Compression.fp16.decompress(small, ctx)
    assert back.dtype == np.float32 and np.allclose(back, x, atol=1e-3)
    ints = np.arange(3)
    assert Compression.fp16.compress(ints)[0] is ints
    assert Compression.none.compress(x)[0] is x
